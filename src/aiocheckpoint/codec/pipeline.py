"""The record pipeline the manager calls: checkpoints to stored records, and back.

:class:`RecordCodec` does, per checkpoint, everything between a validated call and the
storage: the copy through the value stage (:mod:`aiocheckpoint.codec.stages`), whether the
state goes into a whole (version-1) record or an incremental (version-2) tree of blobs,
where the encoding runs (on the event loop in slices, or in a worker thread), sealing, the
storage's ``save`` or ``save_tree``, and the split memory of each workflow and its recovery
from the store. Reads (which decoder runs where, how blobs are fetched) are
:mod:`aiocheckpoint.codec.reading`'s.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import replace
from datetime import datetime
from time import perf_counter
from typing import Any, Final, Protocol, TypeVar

import anyio.lowlevel
import anyio.to_thread
import orjson

from .._telemetry import quiet, round_trip
from ..errors import CheckpointSerializationError, CheckpointTypeError, InvalidArgumentError
from ..format.limits import DEFAULT_MAX_RECORD_BYTES
from ..format.sealed import is_sealed_tree_record, tree_refs_end
from ..format.tree import SplitMemory, SplitResult, TreeParams
from ..leases import Lease
from ..models import (
    Checkpoint,
    CheckpointDraft,
    CheckpointFields,
    ExecutionMetrics,
    StateSnapshot,
    StateVersion,
    built,
    default_metrics,
    make_fields,
    plain_snapshot,
    rebuilt,
    utcnow,
)
from ..storage.base import (
    BlobCheckpointStorage,
    CheckedSave,
    CheckpointStorage,
    StoredCheckpoint,
    WorkflowStorage,
)
from ..storage.queries import StepInfo
from .copy import json_copy
from .effects import EffectRecord, decode_effect, encode_effect
from .lent import lent_snapshot
from .pacing import READY_PACE_SECONDS, Pacer
from .reading import RecordReader, TreeSource, needs_keys
from .sealing import ENVELOPE_MAGIC, Sealer
from .sizes import exceeds
from .sliced import Job
from .stages import DEFAULT_VALUES, TypedValues, ValueStage, View
from .tree.fork import fork_tree
from .tree.splitmemory import MemoryCache, recovered_memory
from .tree.subtrees import Lineage, SharedSplit, SubtreeCache, shared_split_work
from .tree.v2 import encode_checkpoint_v2, encode_v2_work, record_v2
from .typed import has_tags
from .v1 import encode_checkpoint, encode_fields

__all__ = ["RecordCodec", "cooperate"]

#: A state copy longer than this (a state of ~0.3 MB or more) is followed by a yield.
_HELD_LONG: Final = 0.0002
#: SharedState splits made by snapshots and not (yet) taken by :meth:`RecordCodec.encode_tree`.
_PREPARED: Final = 256

_R = TypeVar("_R")


class _Shared(Protocol):
    """A :class:`~aiocheckpoint.SharedState`, as far as snapshots need it."""

    def _peek(self) -> tuple[dict[str, Any], StateVersion]: ...

    def _lineages(self) -> Mapping[int, Lineage]: ...


class RecordCodec:
    """Copies, encodes and stores checkpoints for one storage, and decodes what it returns.

    The manager's one door into the pipeline: :meth:`save` takes a checked
    :class:`~aiocheckpoint.models.CheckpointDraft` to a durable record (a version-1 record
    or a version-2 tree, sealed when it seals) and remembers what the workflow's next save
    reuses; :meth:`decode` reads a stored record back (:mod:`.reading`).

    ``blobs`` is the storage when it should receive large states as version-2 trees (the
    manager's ``incremental``), else None: then every record is version 1. Reads decode
    both versions whatever ``blobs`` is, fetching blobs from ``storage`` when it keeps them.
    The storage's ``max_record_bytes`` (when it has one) bounds a tree as it bounds a
    record: the text of its state and its nodes, on write and on read. ``keep_last`` is
    what each save prunes in its own write (the manager's ``max_checkpoints``).
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        blobs: BlobCheckpointStorage | None,
        values: ValueStage = DEFAULT_VALUES,
        sealer: Sealer | None = None,
        *,
        keep_last: int | None = None,
    ) -> None:
        self._storage = storage
        self._keep_last = keep_last
        offer = getattr(storage, "checked_saves", None)  # CheckedSave (storage/base.py)
        self._checked: CheckedSave | None = None if offer is None else offer()
        #: The bytes stage (encryption, ``docs/encryption.md``), or None.
        self.sealer = sealer
        #: The storage that receives version-2 trees, or None.
        self.blobs = blobs
        #: The most a record's tree may hold (its nodes; its state's text).
        self.max_bytes = _record_limit(storage)
        self._values = values
        self._copy = values.copy
        self._copy_sized = values.copy_sized
        #: The last split of each recently saved workflow's state.
        self.memory = MemoryCache()
        #: What each recently saved workflow's SharedState sub-trees were encoded to.
        self.subtrees = SubtreeCache()
        # SharedState splits by id of the copy they made; each workflow's split being saved.
        self._prepared: OrderedDict[int, SharedSplit] = OrderedDict()
        self._staged: dict[str, SharedSplit] = {}
        # Encrypting: the tree parameters with the blob name key; the id of each
        # workflow's sealed split being saved, with the plain split it came from.
        self._keyed: TreeParams | None = None
        self._sealed: dict[str, tuple[int, SplitResult]] = {}
        #: Bounds this codec's large-state work per loop iteration (:mod:`.pacing`).
        self.pacer = _pacer(storage)
        self._reader = RecordReader(storage, values, sealer, self.max_bytes)

    # --- storing ------------------------------------------------------------------------

    async def save(
        self, draft: CheckpointDraft, lease: Lease | None, info: StepInfo | None
    ) -> Checkpoint:
        """Copy ``draft``'s state, encode it, store it; return what ``create_checkpoint`` returns.

        The caller's objects are copied before the first await (a SharedState's tree is
        copy-on-write, so only it is copied while other tasks run); then the record goes to
        the storage, fenced by ``lease`` and with ``info`` for the workflow's record when
        given (a storage with workflow records needs it). An unstorable value raises
        :class:`~aiocheckpoint.CheckpointSerializationError` before anything is written.
        """
        if type(draft.state) is not dict:
            saving = self._save_snapshot(draft, lease, info)
            del draft
            return await saving
        # A plain dict, the common case: while its record is stored this frame keeps only
        # CheckpointFields (copies and atoms), not the caller's objects nor built models,
        # which the garbage collector would promote by the thousand (docs/performance.md).
        workflow_id, step, agent_id, status, state, _, metrics, meta, meta_finite, app = draft
        del draft
        copying = perf_counter()
        data, finite, tree = self.copy_state(state)
        copied = perf_counter()
        del state
        now = utcnow()
        fields = make_fields((workflow_id, step, agent_id, status, data, metrics, now, meta, app))
        finite = finite and meta_finite
        if copied - copying > _HELD_LONG:
            await anyio.lowlevel.checkpoint()  # as in _save_snapshot: a long copy held the loop
        if tree:
            return await self._store(fields.checkpoint(), finite, lease, info)
        record = encode_fields(fields, finite)
        if record is None:  # only the exact encoder writes it (or names what it cannot)
            return await self._store(fields.checkpoint(), finite, lease, info)
        if has_tags(record):
            # Built before it is stored: a tagged value must be restored, and may refuse.
            returned = self.returned(fields.checkpoint(), record)
            await self._write_record(workflow_id, step, record, lease, info)
            return returned
        del fields  # one container less per waiting save for the garbage collector
        checked = self._checked
        if self.sealer is not None:
            await self._write_record(workflow_id, step, record, lease, info)
        elif checked is None or info is None or lease is not None or not quiet():
            await self._write_plain(workflow_id, step, record, lease, info)
        else:  # the common call: the storage's own future, no coroutine of its save
            await checked(workflow_id, step, record, self._keep_last, info)
        fields = make_fields((workflow_id, step, agent_id, status, data, metrics, now, meta, app))
        return fields.checkpoint()

    def save_owned(
        self, fields: CheckpointFields, lease: Lease | None, info: StepInfo | None
    ) -> Coroutine[Any, Any, None] | None:
        """Encode ``fields`` as they are, uncopied; the storage call (None: :meth:`save` must).

        For a state and metadata the caller built for this save alone and never changes,
        of JSON values only (no float): no copy, no models built. The record is encoded
        before this returns, so the awaitable holds its bytes, not ``fields`` (nothing of
        the state is kept alive while the save waits). A record that may hold a tag (a
        one-key dict whose key starts with ``$`` must be escaped) or that only the exact
        encoder writes gets None, with nothing stored: :meth:`save` names what it cannot
        store.
        """
        record = encode_fields(fields, True)
        if record is None or has_tags(record):
            return None
        return self._write_record(fields.workflow_id, fields.step, record, lease, info)

    async def _save_snapshot(
        self, draft: CheckpointDraft, lease: Lease | None, info: StepInfo | None
    ) -> Checkpoint:
        """:meth:`save` of a state that is not a plain dict."""
        now = utcnow()
        copying = perf_counter()
        if draft.shared:
            # Its tree is copy-on-write: taken now, copied in slices (see shared_snapshot).
            snapshot, finite = await self.shared_snapshot(draft.state, draft.workflow_id)
        else:
            snapshot, finite = self.snapshot(draft.state, now)
        copied = perf_counter()
        metrics = draft.metrics
        checkpoint = built(
            Checkpoint,
            workflow_id=draft.workflow_id,
            step=draft.step,
            agent_id=draft.agent_id,
            status=draft.status,
            state_snapshot=snapshot,
            metrics=default_metrics() if metrics is None else built(ExecutionMetrics, **metrics),
            timestamp=now,
            metadata=draft.metadata,
            app_version=draft.app_version,
        )
        finite = finite and draft.metadata_finite
        del draft
        if copied - copying > _HELD_LONG and not self.prepared(snapshot.data):
            # (A split SharedState was copied under the pacer, which _store goes on with.)
            # A large state's copy (which must happen before any await: the caller may
            # change the state afterwards) held the loop: let it run before the encoding,
            # which works on our private copy. Each writer then holds the loop for one
            # step at a time, and a round of the loop over 20 writers stays short.
            await anyio.lowlevel.checkpoint()
        return await self._store(checkpoint, finite, lease, info)

    async def _store(
        self, checkpoint: Checkpoint, finite: bool, lease: Lease | None, info: StepInfo | None
    ) -> Checkpoint:
        """Encode and store ``checkpoint`` (private copies); return what the caller gets."""
        workflow_id, step = checkpoint.workflow_id, checkpoint.step
        blobs = self.blobs
        if blobs is not None and self.wants_tree(checkpoint.state_snapshot.data):
            # ``checkpoint`` holds private copies made above, so nothing else changes it.
            # On a storage that never waits, each step of a large save takes its turn:
            # twenty always-ready writers share out the loop's iterations (codec/pacing.py).
            pacer = self.pacer
            await pacer.step()
            tree = await self.encode_tree(workflow_id, checkpoint, finite)
            if tree is not None:
                record, split = tree
                returned = await self.returned_tree(workflow_id, checkpoint)
                await round_trip(
                    blobs.save_tree,
                    workflow_id,
                    step,
                    record,
                    split,
                    keep_last=self._keep_last,
                    fence=lease,
                    step_info=info,
                )
                try:
                    await pacer.step()
                finally:  # stored: its split is the workflow's last, even if cancelled here
                    self.remember(workflow_id, split)
                return returned
        data = self.encode(checkpoint, finite)
        returned = self.returned(checkpoint, data)  # before the save: it may refuse a value
        await self._write_record(workflow_id, step, data, lease, info)
        return returned

    def _write_record(
        self, workflow_id: str, step: int, data: bytes, lease: Lease | None, info: StepInfo | None
    ) -> Coroutine[Any, Any, None]:
        """The save of a version-1 record, sealed first if this codec seals.

        Not a coroutine unless it seals: a frame less for each waiting save to keep.
        """
        sealer = self.sealer
        if sealer is not None:
            return self._write_sealed(sealer, workflow_id, step, data, lease, info)
        return self._write_plain(workflow_id, step, data, lease, info)

    async def _write_sealed(
        self,
        sealer: Sealer,
        workflow_id: str,
        step: int,
        data: bytes,
        lease: Lease | None,
        info: StepInfo | None,
    ) -> None:
        sealed = await sealer.seal_record(workflow_id, step, data)
        await self._write_plain(workflow_id, step, sealed, lease, info)

    def _write_plain(
        self, workflow_id: str, step: int, data: bytes, lease: Lease | None, info: StepInfo | None
    ) -> Coroutine[Any, Any, None]:
        if info is None:
            return round_trip(
                self._storage.save, workflow_id, step, data, keep_last=self._keep_last
            )
        # Only a WorkflowStorage is given ``info`` (the manager checks): a protocol
        # isinstance check here would cost the hot path ~10 us per checkpoint.
        records: WorkflowStorage = self._storage  # type: ignore[assignment]
        return round_trip(
            records.save,
            workflow_id,
            step,
            data,
            keep_last=self._keep_last,
            fence=lease,
            step_info=info,
        )

    async def fork(
        self, source_id: str, stored: StoredCheckpoint, new_id: str, info: StepInfo | None = None
    ) -> None:
        """Store a copy of ``stored``, a record of ``source_id``, as ``new_id``'s (with ``info``).

        A tree shares its blobs (only its record is written, re-sealed for its new workflow
        when sealing); any other record is decoded in its stored (tagged) form, so typed
        values are copied as they are, and encoded again.
        """
        storage, keep = self._storage, self._keep_last
        if isinstance(storage, BlobCheckpointStorage):
            tree = await self.fork_tree(storage, source_id, stored, new_id)
            if tree is not None:
                await storage.save_tree(
                    new_id, stored.step, tree[0], tree[1], keep_last=keep, step_info=info
                )
                return
        checkpoint = await self.decode(source_id, stored, "stored")
        data = self.encode(checkpoint.model_copy(update={"workflow_id": new_id}), False)
        data = await self.seal(new_id, stored.step, data)
        await self._write_plain(new_id, stored.step, data, None, info)

    # --- the value stage ----------------------------------------------------------------

    def copy(self, value: Any, path: str) -> tuple[Any, bool]:
        """The value stage's copy of ``value``, and whether its floats are all finite."""
        return self._copy(value, path)

    def copy_state(self, state: dict[str, Any]) -> tuple[Any, bool, bool]:
        """:meth:`copy` of a checkpoint's state, and :meth:`wants_tree` of the copy.

        The copy counts the size bound as it goes, so the state is walked once.
        """
        blobs = self.blobs
        if blobs is None:
            data, finite = self._copy(state, "state")
            return data, finite, False
        limit = blobs.blob_params.root_inline_limit
        data, finite, size = self._copy_sized(state, limit, "state")
        return data, finite, self.wants_tree(data) if size is None else size > limit

    def encode_value(self, value: Any, path: str) -> tuple[Any, bool]:
        """One value in the stored (JSON-able) form, and whether its floats are finite.

        For records of their own (effect results): :meth:`decode_value` reads it back.
        Raises :class:`~aiocheckpoint.CheckpointSerializationError` naming ``path``.
        """
        return self._copy(value, path)

    def decode_value(self, data: Any, path: str, view: View = "typed") -> Any:
        """A value back from what :meth:`encode_value` returned (after a JSON round trip)."""
        return self._values.decode_value(data, path, view)

    def returned(self, checkpoint: Checkpoint, record: bytes) -> Checkpoint:
        """The checkpoint ``create_checkpoint`` returns: its values as callers passed them.

        Call it with the version-1 ``record`` just encoded, before storing it: a value that
        would not read back (a registered class refusing its own data) raises
        :class:`~aiocheckpoint.CheckpointSerializationError` while nothing is written. A
        :class:`~aiocheckpoint.TaggedValue` comes back as itself. ``checkpoint``'s values
        are restored in place (they are the private copy, already encoded).
        """
        if not has_tags(record):
            return checkpoint  # the common case: plain JSON, nothing to restore
        return self._restored(checkpoint, record)

    async def returned_tree(self, workflow_id: str, checkpoint: Checkpoint) -> Checkpoint:
        """:meth:`returned` for a checkpoint just encoded as a tree.

        For a SharedState's split that found no tag in what it encoded (its cached
        sub-trees know), when the metadata hold none either, the default value stage hands
        back the state copied at its first read (:meth:`_private`). Otherwise the
        values are re-encoded to look for tags, and restored, in a worker thread.
        """
        shared = self._staged.get(workflow_id)
        if shared is not None and shared.copy is checkpoint.state_snapshot.data:
            if (
                not shared.tagged
                and type(self._values) is TypedValues
                and not _metadata_tagged(checkpoint)
            ):
                return self._private(checkpoint)
            # Its sub-trees are the cached ones' copies, which later splits reuse: the caller
            # gets a copy (a change to a shared one would reach the next checkpoint's
            # record). The default value stage copies while it decodes, and does not look
            # for tags where the cache found none; any other restores a copy in place.
            if type(self._values) is TypedValues:
                plain = {id(e.copy) for e in shared.entries.values() if not e.tagged}
                return await anyio.to_thread.run_sync(self._restored_shared, checkpoint, plain)
            return await anyio.to_thread.run_sync(self._restored_copy, checkpoint)
        return await anyio.to_thread.run_sync(self._restored, checkpoint, None)

    @staticmethod
    def _private(checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` with a state the caller may change: copied at its first read.

        Its state's sub-trees are the cache's, which later splits reuse as they are
        (:mod:`aiocheckpoint.codec.lent`).
        """
        return rebuilt(checkpoint, state_snapshot=lent_snapshot(checkpoint.state_snapshot))

    def _restored_copy(self, checkpoint: Checkpoint) -> Checkpoint:
        """:meth:`_restored` of a copy of ``checkpoint``'s state."""
        snapshot = checkpoint.state_snapshot
        state = rebuilt(snapshot, data=json_copy(snapshot.data))
        return self._restored(rebuilt(checkpoint, state_snapshot=state), None)

    def _restored_shared(self, checkpoint: Checkpoint, plain: set[int]) -> Checkpoint:
        """:meth:`_restored` of a shared split's checkpoint, into a copy of its state.

        ``plain``: the ids of the state's containers known to hold no tag (kept alive by
        the split's cache entries while this runs).
        """
        values = self._values
        assert isinstance(values, TypedValues)
        try:
            return values.restore_shared(checkpoint, plain)
        except CheckpointTypeError as exc:
            raise _unreadable(exc) from exc

    def _restored(self, checkpoint: Checkpoint, record: bytes | None) -> Checkpoint:
        try:
            return self._values.restore(checkpoint, record, "raw")
        except CheckpointTypeError as exc:
            raise _unreadable(exc) from exc

    def snapshot(
        self, state: StateSnapshot | Mapping[str, Any], now: datetime
    ) -> tuple[StateSnapshot, bool]:
        """A snapshot holding a copy of ``state`` (a dict, a mapping or a StateSnapshot)."""
        copy = self._copy
        if type(state) is dict:  # the common case first; the copy is made here
            data, finite = copy(state, "state")
            return plain_snapshot(data, now), finite
        if isinstance(state, StateSnapshot):
            data, finite = copy(state.data, "state")
            meta, meta_finite = copy(state.metadata, "state.metadata")
            snapshot = built(StateSnapshot, data=data, version=state.version, metadata=meta)
            return snapshot, finite and meta_finite
        if isinstance(state, Mapping):
            return self.snapshot(dict(state), now)
        raise InvalidArgumentError(
            "state must be a SharedState, a StateSnapshot or a dict, "
            f"not {type(state).__qualname__}"
        )

    async def shared_snapshot(
        self, state: _Shared, workflow_id: str | None = None
    ) -> tuple[StateSnapshot, bool]:
        """Snapshot a SharedState: its data and version as of the call, copied in slices.

        The tree is taken before the first await and is never changed in place (a change
        copies the dicts on its path into a new tree), so copying it while other tasks run,
        even ones that change the state, still copies the state of the call. A small state
        is copied in the first slice, without an await.

        With ``workflow_id``, a large state bound for a version-2 tree is also split here,
        reusing what the workflow's last saved split made of every sub-tree still the same
        object (:mod:`aiocheckpoint.codec.tree.subtrees`): only what changed is copied and
        encoded, and the copy shares the unchanged sub-trees' copies with the snapshots of
        earlier checkpoints. :meth:`encode_tree` then takes that split.
        """
        data, version = state._peek()
        version = built(
            StateVersion,
            version=version.version,
            timestamp=version.timestamp,
            agent_id=version.agent_id,
            changed_fields=list(version.changed_fields),
        )
        shared = None
        if workflow_id is not None:
            shared = await self._shared_split(workflow_id, data, state._lineages())
        if shared is not None:
            self._prepared[id(shared.copy)] = shared
            if len(self._prepared) > _PREPARED:
                self._prepared.popitem(last=False)
            return built(StateSnapshot, data=shared.copy, version=version, metadata={}), True
        copy, finite = await cooperate(self._values.copy_work(data, "state"))
        return built(StateSnapshot, data=copy, version=version, metadata={}), finite

    def prepared(self, data: Any) -> bool:
        """Whether ``data`` is the copy :meth:`shared_snapshot` split (its tree is made)."""
        return id(data) in self._prepared

    async def _shared_split(
        self, workflow_id: str, data: dict[str, Any], lineages: Mapping[int, Lineage]
    ) -> SharedSplit | None:
        """The split of a SharedState's tree with the workflow's cached sub-trees, or None.

        None unless the state goes to a tree, or when the state needs the ordinary path.
        The cache is used only with the split memory it was made with.
        """
        blobs = self.blobs
        if blobs is None:
            return None
        params = await self._tree_params(blobs)
        if not exceeds(data, params.root_inline_limit):
            return None
        previous = self.memory.get(workflow_id)
        cache = self.subtrees.get(workflow_id) if previous is not None else {}
        work = shared_split_work(
            data, self._values, params, previous, cache, self.max_bytes, lineages
        )
        await self.pacer.turn()
        return await cooperate(work, self.pacer)

    def encode_effect(self, record: EffectRecord) -> tuple[bytes, Any]:
        """An effect record's stored bytes and its result as callers get it back.

        The result goes through the value stage and is restored from its stored form, so a
        typed result (a datetime, a registered model) is returned as it will read back.
        """
        data, stored = encode_effect(record, self._values)
        return data, self._effect_result(stored, record.key)

    def decode_effect(self, data: bytes) -> EffectRecord:
        """An effect record from its stored bytes (``CheckpointCorruptedError`` if bad)."""
        record = decode_effect(data)
        return replace(record, result=self._effect_result(record.result, record.key))

    async def seal_effect(self, workflow_id: str, step: int, key: str, data: bytes) -> bytes:
        """What to store for an effect record :meth:`encode_effect` made (sealed, if sealing)."""
        sealer = self.sealer
        return data if sealer is None else await sealer.seal_effect(workflow_id, step, key, data)

    async def open_effect(self, workflow_id: str, step: int, key: str, data: bytes) -> EffectRecord:
        """:meth:`decode_effect` of stored bytes, unsealing them first when sealing."""
        sealer = self.sealer
        if sealer is not None:
            data = await sealer.unseal_effect(workflow_id, step, key, data)
        elif data.startswith(ENVELOPE_MAGIC):
            raise needs_keys(workflow_id, step, f"effect {key!r}")
        return self.decode_effect(data)

    def _effect_result(self, stored: Any, key: str) -> Any:
        if stored is None:  # an intent, a failure: nothing to restore
            return None
        return self._values.decode_value(stored, f"effect {key!r} result", "typed")

    # --- encoding -----------------------------------------------------------------------

    def wants_tree(self, data: dict[str, Any]) -> bool:
        """Whether a checkpoint's state ``data`` is large enough to try a version-2 tree."""
        blobs = self.blobs
        return blobs is not None and exceeds(data, blobs.blob_params.root_inline_limit)

    async def encode_tree(
        self, workflow_id: str, checkpoint: Checkpoint, finite: bool
    ) -> tuple[bytes, SplitResult] | None:
        """The version-2 record and blobs for :meth:`BlobCheckpointStorage.save_tree`.

        None when the checkpoint fits in a record after all (then :meth:`encode` it).
        ``checkpoint`` must hold private copies (nothing else may change it meanwhile), and
        ``finite`` say whether its floats are all finite. Hand the result's split to
        :meth:`remember` once it is stored.
        """
        blobs = self.blobs
        if blobs is None:
            return None
        params = await self._tree_params(blobs)
        data = checkpoint.state_snapshot.data
        shared = self._prepared.pop(id(data), None)
        previous = self.memory.get(workflow_id)
        limit = self.max_bytes
        if shared is not None and shared.copy is data:
            record, split = record_v2(checkpoint, params, shared.split), shared.split
            self._staged[workflow_id] = shared
        else:
            record, split = await _encode_tree(
                checkpoint, finite, params, previous, limit, self.pacer
            )
        memory = split.memory
        if previous is None and memory is not None and memory.first_chunks:
            # No memory of this workflow's last split (a new process, or another manager
            # saved it): the store says which regions it holds cut into chunks, and those
            # are cut again instead of rewritten as one blob.
            stored = await blobs.fetch_blobs(list(set(memory.first_chunks.values())))
            recovered = recovered_memory(memory, stored)
            if recovered is not None:
                record, split = await _encode_tree(
                    checkpoint, finite, params, recovered, limit, self.pacer
                )
        if not split.root:
            return None
        sealer = self.sealer
        if sealer is None:
            return record, split
        step = checkpoint.step
        sealed_record, sealed = await sealer.seal_tree(
            workflow_id, step, record, split, params.digest_size
        )
        self._sealed[workflow_id] = id(sealed), split  # not the sealed blobs: the plain split
        return sealed_record, sealed

    async def _tree_params(self, blobs: BlobCheckpointStorage) -> TreeParams:
        """The storage's tree parameters; encrypting, with the key that names blobs."""
        sealer = self.sealer
        if sealer is None:
            return blobs.blob_params
        keyed = self._keyed
        if keyed is None:
            name_key = await sealer.name_key()
            keyed = self._keyed = replace(blobs.blob_params, name_key=name_key)
        return keyed

    async def fork_tree(
        self, storage: BlobCheckpointStorage, source_id: str, stored: StoredCheckpoint, new_id: str
    ) -> tuple[bytes, SplitResult] | None:
        """A version-2 record rewritten for ``new_id``, sharing its blobs (:mod:`.tree.fork`).

        Encrypting, the record is unsealed (authenticated for its source) and sealed for its
        new workflow; its sealed blobs are shared as they are. None for a record to copy
        whole (version 1, or plaintext while encrypting).
        """
        sealer = self.sealer
        if sealer is None:
            return await fork_tree(storage, stored.data, new_id)
        if not is_sealed_tree_record(stored.data):
            return None
        plain = await sealer.unseal_record(source_id, stored.step, stored.data)
        tree = await fork_tree(storage, plain, new_id)
        if tree is None:
            return None
        record, split = tree
        digest = tree_refs_end(stored.data)[0]
        sealed = await sealer.seal_tree_record(new_id, stored.step, record, digest, split.root_refs)
        return sealed, split

    def remember(self, workflow_id: str, split: SplitResult) -> None:
        """Keep a stored split's memory (and cached sub-trees) for the workflow's next save."""
        pair = self._sealed.pop(workflow_id, None)
        if pair is not None and pair[0] == id(split):
            split = pair[1]  # what was sealed: the cache keeps plain nodes
        self.memory.remember(workflow_id, split.memory)
        shared = self._staged.pop(workflow_id, None)
        if shared is not None and shared.split is split:
            self.subtrees.keep(workflow_id, shared.entries, split.stored_bytes())
        else:  # made by another path, or overtaken by a concurrent save: start again
            self.subtrees.keep(workflow_id, None)

    def forget(self, workflow_id: str) -> None:
        """Drop the workflow's split memory and cached sub-trees (its checkpoints are gone)."""
        self.memory.remember(workflow_id, None)
        self.subtrees.keep(workflow_id, None)

    def encode(self, checkpoint: Checkpoint, finite: bool) -> bytes:
        """The version-1 record of ``checkpoint`` (``finite`` as in :meth:`encode_tree`)."""
        return encode_checkpoint(checkpoint, finite=finite)

    def encode_fields(self, fields: CheckpointFields, finite: bool) -> bytes | None:
        """:meth:`encode` of ``fields.checkpoint()`` without building it, or None.

        None when only the exact encoder can write it: then build and :meth:`encode` it.
        """
        return encode_fields(fields, finite)

    async def seal(self, workflow_id: str, step: int, record: bytes) -> bytes:
        """What to store for a version-1 record (sealed, if this codec seals).

        Callers on the hot path test :attr:`sealer` and call its ``seal_record`` directly.
        """
        sealer = self.sealer
        return record if sealer is None else await sealer.seal_record(workflow_id, step, record)

    # --- decoding -----------------------------------------------------------------------

    def opener(self) -> Callable[[str, StoredCheckpoint], Awaitable[bytes]] | None:
        """What gives a stored record's plain bytes when this codec seals (None: as stored)."""
        return self._reader.opener()

    def decode(
        self, workflow_id: str, stored: StoredCheckpoint, view: View = "typed"
    ) -> Awaitable[Checkpoint]:
        """Verify and decode a stored record of either version (:meth:`RecordReader.decode`)."""
        return self._reader.decode(workflow_id, stored, view)

    def decode_live(
        self, workflow_id: str, stored: StoredCheckpoint, view: View = "typed"
    ) -> Awaitable[Checkpoint | None]:
        """:meth:`decode`; None if the record was deleted while it was read."""
        return self._reader.decode_live(workflow_id, stored, view)

    def tree_source(
        self, workflow_id: str, stored: StoredCheckpoint
    ) -> Awaitable[TreeSource | None]:
        """What a partial read of the record's tree walks (:meth:`RecordReader.tree_source`)."""
        return self._reader.tree_source(workflow_id, stored)


async def _encode_tree(
    checkpoint: Checkpoint,
    finite: bool,
    params: TreeParams,
    previous: SplitMemory | None,
    max_bytes: int,
    pacer: Pacer,
) -> tuple[bytes, SplitResult]:
    """Split ``checkpoint``'s state into a version-2 record and blobs, off the hot path."""
    if finite:
        # ~5 ms of CPU per MB, mostly Python: a worker thread would hold the GIL against
        # the loop for whole switch intervals (5 ms each), so the loop runs it itself in
        # slices of ~0.1-0.2 ms (docs/incremental.md).
        await pacer.turn()
        work = encode_v2_work(
            checkpoint, params, finite=True, previous=previous, max_bytes=max_bytes
        )
        return await cooperate(work, pacer)
    # NaN, infinities: the exact encoder, which does not slice.
    return await anyio.to_thread.run_sync(
        functools.partial(
            encode_checkpoint_v2, checkpoint, params, previous=previous, max_bytes=max_bytes
        )
    )


def _unreadable(exc: CheckpointTypeError) -> CheckpointSerializationError:
    """A value that would not read back, refused as unstorable."""
    reason = f"it would not read back as {exc.type_name}: {exc.reason}"
    return CheckpointSerializationError(exc.path, reason)


def _pacer(storage: CheckpointStorage) -> Pacer:
    """A pacer for ``storage``: a short budget, taken at every step, if it never waits."""
    if getattr(storage, "never_suspends", False) is True:
        return Pacer(READY_PACE_SECONDS, every_step=True)
    return Pacer()


def _record_limit(storage: CheckpointStorage) -> int:
    """The storage's ``max_record_bytes``, or the default for one that does not say."""
    limit = getattr(storage, "max_record_bytes", None)
    return limit if type(limit) is int and limit > 0 else DEFAULT_MAX_RECORD_BYTES


async def cooperate(work: Generator[Job | None, Any, _R], pacer: Pacer | None = None) -> _R:
    """Run ``work`` on the event loop, letting other callbacks run between its slices.

    The first slice runs at once: work that ends within it never awaits. A job it yields
    (the hashing, checksum or copy of a large text, which release the GIL) runs in a worker
    thread while the loop goes on, and its result is sent back. With a ``pacer``, slices
    go on without a wait while its budget for the loop iteration lasts.
    """
    try:
        step = next(work)
        while True:
            if step is None:
                await (anyio.lowlevel.checkpoint() if pacer is None else pacer.turn())
                step = next(work)
            else:
                step = work.send(await anyio.to_thread.run_sync(step))
    except StopIteration as stop:
        result: _R = stop.value
        return result


def _metadata_tagged(checkpoint: Checkpoint) -> bool:
    """Whether the checkpoint's metadata (its own and its state's) may hold a tag."""
    try:
        text = orjson.dumps((checkpoint.state_snapshot.metadata, checkpoint.metadata))
    except TypeError:  # an int beyond 64 bits: look the slow way
        return True
    return has_tags(text)
