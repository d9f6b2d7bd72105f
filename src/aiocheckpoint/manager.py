"""CheckpointManager: the async API over any :class:`CheckpointStorage`."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from typing_extensions import Self

from . import control, history
from ._holders import LocalHolders
from ._telemetry import round_trip, traced
from ._validation import (
    check_limit,
    check_optional_step,
    check_step,
    check_workflow_id,
)
from .codec import (
    DEFAULT_VALUES,
    EffectRecord,
    KeyProvider,
    RecordCodec,
    Sealer,
    TypedValues,
    TypeRegistry,
    View,
    has_tags,
)
from .doubt import open_records, reopen_before_settle, settled
from .errors import (
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointNotFoundError,
    InvalidArgumentError,
    LeaseLostError,
    StorageClosedError,
    UnsupportedOperationError,
    WorkflowBusyError,
    WorkflowExistsError,
)
from .history import WorkflowEvent
from .leases import (
    WORKFLOW_KIND,
    Lease,
    Page,
    RetryPolicy,
    WorkflowRecord,
    WorkflowStatus,
    check_kind,
    check_ttl,
    fence_token,
)
from .models import (
    AgentStatus,
    Checkpoint,
    CheckpointFields,
    ExecutionMetrics,
    StateSnapshot,
    built,
    default_metrics,
    utcnow,
)
from .retention import RetentionPolicy, SweepReport, policy_from, run_sweep, run_thinning
from .state import SharedState
from .storage.base import (
    BlobCheckpointStorage,
    CheckpointStorage,
    EffectStorage,
    StoredCheckpoint,
    WorkflowStorage,
    check_effect_key,
    workflow_traces,
)
from .storage.memory import InMemoryCheckpointStorage
from .storage.queries import StepInfo, build_query, encode_cursor, json_text

__all__ = ["CheckpointManager", "ResumePoint"]

logger = logging.getLogger(__name__)


class ResumePoint(tuple[int, StateSnapshot, ExecutionMetrics]):
    """``(resume_step, state_snapshot, metrics)`` as returned by ``get_resume_point``.

    A 3-tuple (unpack it as one), which also names the application version that wrote the
    checkpoint: :attr:`app_version`, None if its manager was given none.
    """

    app_version: str | None

    def __new__(
        cls,
        step: int,
        state_snapshot: StateSnapshot,
        metrics: ExecutionMetrics,
        app_version: str | None = None,
    ) -> ResumePoint:
        """The resume point; ``app_version`` is the writer's application version."""
        point = super().__new__(cls, (step, state_snapshot, metrics))
        point.app_version = app_version
        return point


_PAGE = 100
#: A state copy longer than this (a state of ~0.3 MB or more) is followed by a yield.
_HELD_LONG = 0.0002
_RETRIES = 8
#: The owner and TTL of the lease :meth:`CheckpointManager.resolve_effect` takes for its write.
_RESOLVER = "aiocheckpoint-resolve-effect"
_RESOLVE_TTL = 30.0
#: The leases held in this process, shared by every manager.
_HOLDERS = LocalHolders()


_E = TypeVar("_E", AgentStatus, WorkflowStatus)


def _enum(kind: type[_E], status: Any) -> _E:
    try:
        return kind(status)
    except ValueError:
        allowed = ", ".join(s.value for s in kind)
        raise InvalidArgumentError(f"status must be one of {allowed}; got {status!r}") from None


_STATUSES: dict[Any, AgentStatus] = {s: s for s in AgentStatus}


def _status(status: Any) -> AgentStatus:
    # An AgentStatus equals and hashes like its value: one lookup serves both spellings.
    if type(status) is AgentStatus or type(status) is str:
        found = _STATUSES.get(status)
        if found is not None:
            return found
    return _enum(AgentStatus, status)


def _workflow_status(status: Any) -> WorkflowStatus:
    return _enum(WorkflowStatus, status)


class CheckpointManager:
    """Creates, reads and prunes checkpoints in a storage backend.

    The manager owns everything a backend should not have to get right on its own: input
    validation, encoding with a checksum, decoding and verification, and the retention
    policy (``max_checkpoints`` keeps the newest N steps of each workflow; older ones are
    deleted when a checkpoint is written). ``storage`` defaults to
    :class:`~aiocheckpoint.InMemoryCheckpointStorage`.

    ``incremental`` chooses how large states are stored. With a storage that keeps blobs
    (:class:`~aiocheckpoint.storage.base.BlobCheckpointStorage`, e.g. the file store), a
    state too large for ``blob_params.root_inline_limit`` (8 KiB) is cut into
    content-addressed blobs shared between checkpoints, so each checkpoint costs about what
    changed (``docs/incremental.md``). ``None`` (the default) means "when the storage
    supports it", ``False`` always writes whole (version-1) records, ``True`` requires a
    storage that supports it. Small states are always written as version-1 records, and
    every read path decodes both versions, whatever this option says.

    ``types`` is the :class:`~aiocheckpoint.TypeRegistry` of the classes states may hold
    besides the standard types (``docs/serialization.md``); ``app_version``, when given, is
    recorded in every checkpoint and handed back by :meth:`get_resume_point`.

    ``encryption`` (a :class:`~aiocheckpoint.Keyring` or another
    :class:`~aiocheckpoint.KeyProvider`) seals every checkpoint and effect record with
    AES-256-GCM, bound to its workflow, step and kind, and refuses plaintext records
    unless ``allow_plaintext`` is True (``docs/encryption.md``). It needs
    ``aiocheckpoint[crypto]``. Incremental checkpoints are encrypted too: their blobs are
    sealed, under keyed names.

    ``retention`` is a :class:`~aiocheckpoint.RetentionPolicy`: which checkpoints and
    workflows to keep, applied by :meth:`sweep` and :meth:`sweeping` (``docs/retention.md``);
    ``max_checkpoints=N`` is its shorthand for "the newest N, pruned at each write".

    ``workflow_kind`` is the kind of the workflow records this manager's checkpoints create
    (``"workflow"``: runners claim them; another name, such as the LangGraph saver's
    ``"langgraph"``, keeps them out of :meth:`claim_workflow` and of the default listings).

    Use it as ``async with CheckpointManager(storage) as manager:`` or call :meth:`close`.
    """

    def __init__(
        self,
        storage: CheckpointStorage | None = None,
        *,
        max_checkpoints: int | None = None,
        incremental: bool | None = None,
        types: TypeRegistry | None = None,
        app_version: str | None = None,
        encryption: KeyProvider | None = None,
        allow_plaintext: bool = False,
        retention: RetentionPolicy | None = None,
        workflow_kind: str = WORKFLOW_KIND,
    ) -> None:
        self._retention = policy_from(max_checkpoints, retention)
        # None: a save leaves the kind of an existing record as it is.
        self._kind = None if check_kind(workflow_kind) == WORKFLOW_KIND else workflow_kind
        self._storage: CheckpointStorage = (
            storage if storage is not None else InMemoryCheckpointStorage()
        )
        # What a save prunes itself, in its transaction (see RetentionPolicy.write_keep_last).
        self._max_checkpoints = None if self._retention is None else self._retention.write_keep_last
        self._sweepers: set[anyio.CancelScope] = set()
        if incremental not in (None, True, False):
            raise InvalidArgumentError(f"incremental must be a bool or None, got {incremental!r}")
        supports = isinstance(self._storage, BlobCheckpointStorage)
        if incremental and not supports:
            raise InvalidArgumentError(
                f"incremental=True needs a storage that keeps blobs; "
                f"{type(self._storage).__name__} does not"
            )
        sealer = _sealer(encryption, allow_plaintext)
        blobs: BlobCheckpointStorage | None = (
            self._storage  # type: ignore[assignment]
            if supports and incremental is not False
            else None
        )
        if types is not None and not isinstance(types, TypeRegistry):
            raise InvalidArgumentError(f"types must be a TypeRegistry, not {types!r}")
        if app_version is not None:
            _check_text(app_version, "app_version")
        self._app_version = app_version
        self._types = types
        values = DEFAULT_VALUES if types is None else TypedValues(types)
        # Everything between a validated call and the storage: copies, encoding, decoding.
        self._codec = RecordCodec(self._storage, blobs, values, sealer)
        self._keeps_records = isinstance(self._storage, WorkflowStorage)
        # Checked once: a runtime protocol check walks the protocol's members (~90 us), and
        # every effect record would pay it.
        self._effects: EffectStorage | None = (
            self._storage if isinstance(self._storage, EffectStorage) else None
        )
        self._closed = False
        #: Workflows an active ResumableWorkflow block (or a fork) drives: one at a time.
        self._drivers: set[str] = set()

    @property
    def storage(self) -> CheckpointStorage:
        """The storage backend."""
        return self._storage

    @property
    def types(self) -> TypeRegistry | None:
        """The registry of the classes this manager stores and reads back, if given one."""
        return self._types

    @property
    def incremental(self) -> bool:
        """Whether large states are written as incremental (blob) checkpoints."""
        return self._codec.blobs is not None

    @property
    def max_checkpoints(self) -> int | None:
        """How many checkpoints per workflow each write keeps (None: it prunes nothing)."""
        return self._max_checkpoints

    # --- retention and TTL (docs/retention.md) -------------------------------------------

    @property
    def retention(self) -> RetentionPolicy | None:
        """The retention policy (``max_checkpoints=N`` shows as its policy), or None."""
        return self._retention

    @traced("sweep")
    async def sweep(
        self,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
        policy: RetentionPolicy | None = None,
        collect_garbage: bool = True,
    ) -> SweepReport:
        """Apply the retention policy (or ``policy``) to the whole store once.

        Deletes, in short batches, the workflows past their TTL (never a leased one) and
        the checkpoints the history rules do not keep, then collects garbage blobs; returns
        a :class:`~aiocheckpoint.SweepReport`. ``dry_run=True`` deletes nothing and reports
        what would go. ``now`` is the moment TTLs count back from (default: now).
        """
        self._check_open()
        chosen = policy if policy is not None else self._retention
        if chosen is None:
            raise InvalidArgumentError("sweep needs a retention policy: this manager has none")
        return await run_sweep(
            self._storage,
            chosen,
            now=now,
            dry_run=dry_run,
            collect_garbage=collect_garbage,
            forget=self._codec.forget,
            opened=self._codec.opener(),
        )

    @traced("thin_workflow")
    async def thin_workflow(
        self, workflow_id: str, *, policy: RetentionPolicy | None = None, dry_run: bool = False
    ) -> SweepReport:
        """Apply the history rules of the policy (or of ``policy``) to one workflow now.

        For a workflow that needs other rules than the rest (a long chat kept denser, a
        finished run thinned at once); a paused one is left whole under ``keep_paused``.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        chosen = policy if policy is not None else self._retention
        if not isinstance(chosen, RetentionPolicy):
            raise InvalidArgumentError(f"thin_workflow needs a RetentionPolicy, got {chosen!r}")
        return await run_thinning(
            self._storage, chosen, workflow_id, dry_run=dry_run, opened=self._codec.opener()
        )

    @asynccontextmanager
    async def sweeping(self, every: timedelta = timedelta(minutes=5)) -> AsyncIterator[None]:
        """Sweep in the background every ``every`` while the block runs (and the manager is open).

        The sweeper is a task of the block's own task group: it stops when the block ends or
        the manager closes. A failed sweep is logged and tried again at the next interval.
        """
        self._check_open()
        if self._retention is None:
            raise InvalidArgumentError("sweeping needs a retention policy: this manager has none")
        if not isinstance(every, timedelta) or every <= timedelta(0):
            raise InvalidArgumentError(f"every must be a positive timedelta, got {every!r}")
        # The sweeper's own scope: closing the manager stops it, not the caller's block.
        scope = anyio.CancelScope()
        async with anyio.create_task_group() as group:
            self._sweepers.add(scope)
            group.start_soon(self._sweep_forever, every.total_seconds(), scope)
            try:
                yield
            finally:
                self._sweepers.discard(scope)
                scope.cancel()

    async def _sweep_forever(self, seconds: float, scope: anyio.CancelScope) -> None:
        with scope:
            while not self._closed:
                await anyio.sleep(seconds)
                try:
                    await self.sweep()
                except StorageClosedError:
                    return
                except CheckpointError as exc:
                    logger.warning("background sweep failed, retrying in %.0f s: %s", seconds, exc)

    @traced("create_checkpoint", duration="save")
    async def create_checkpoint(
        self,
        workflow_id: str,
        step: int,
        agent_id: str,
        status: AgentStatus | str,
        state: SharedState | StateSnapshot | Mapping[str, Any],
        metrics: ExecutionMetrics | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        lease: Lease | None = None,
    ) -> Checkpoint:
        """Store a checkpoint and return it once it is durable.

        ``state`` is copied: later changes by the caller never alter what was stored.
        For a large :class:`SharedState` only the sub-trees changed since the workflow's
        previous checkpoint are copied and encoded; the returned checkpoint's data then
        shares the others' copies with earlier returned checkpoints (``docs/state.md``).
        Writing a step that already exists replaces it. Invalid input raises a
        :class:`~aiocheckpoint.CheckpointError` subclass before anything is written.
        With ``lease``, the write is fenced: it is refused with
        :class:`~aiocheckpoint.LeaseLostError` unless the lease is still the workflow's
        current one.
        """
        self._check_open()
        # Everything the caller owns is copied before the first await (a SharedState's
        # tree is copy-on-write, so only it may be copied while other tasks run).
        workflow_id, step, agent_status, meta, meta_finite = self._check_arguments(
            workflow_id, step, agent_id, status, metadata
        )
        if type(state) is not dict:
            created = self._create(
                workflow_id, step, agent_id, agent_status, state, metrics, meta, meta_finite, lease
            )
            del state, metrics, metadata  # kept by _create only as long as it needs them
            return await created
        # A plain dict, the common case: while its record is stored this frame keeps only
        # CheckpointFields (copies and atoms), not the caller's objects nor built models,
        # which the garbage collector would promote by the thousand (docs/performance.md).
        copying = time.perf_counter()
        data, finite, tree = self._codec.copy_state(state)
        copied = time.perf_counter()
        fields = CheckpointFields(
            workflow_id,
            step,
            agent_id,
            agent_status,
            data,
            _metrics_fields(metrics),
            utcnow(),
            meta,
            self._app_version,
        )
        del state, metrics, metadata
        info = self._step_info(agent_id, agent_status, workflow_id, lease)
        if copied - copying > _HELD_LONG:
            await anyio.lowlevel.checkpoint()  # as in _create: a long copy held the loop
        finite = finite and meta_finite
        if tree:
            return await self._store(fields.checkpoint(), finite, lease, info)
        codec = self._codec
        record = codec.encode_fields(fields, finite)
        if record is None:  # only the exact encoder writes it (or names what it cannot)
            return await self._store(fields.checkpoint(), finite, lease, info)
        # Built only once stored (a tagged value must be restored, and may refuse, before).
        returned = codec.returned(fields.checkpoint(), record) if has_tags(record) else None
        await self._write_record(workflow_id, step, record, lease, info)
        return fields.checkpoint() if returned is None else returned

    async def _create(
        self,
        workflow_id: str,
        step: int,
        agent_id: str,
        agent_status: AgentStatus,
        state: SharedState | StateSnapshot | Mapping[str, Any],
        metrics: ExecutionMetrics | None,
        meta: dict[str, Any],
        meta_finite: bool,
        lease: Lease | None,
    ) -> Checkpoint:
        """:meth:`create_checkpoint` of a state that is not a plain dict."""
        codec = self._codec
        now = utcnow()
        copying = time.perf_counter()
        if isinstance(state, SharedState):
            # Its tree is copy-on-write: taken now, copied in slices (see shared_snapshot).
            snapshot, finite = await codec.shared_snapshot(state, workflow_id)
        else:
            snapshot, finite = codec.snapshot(state, now)
        copied = time.perf_counter()
        checkpoint = built(
            Checkpoint,
            workflow_id=workflow_id,
            step=step,
            agent_id=agent_id,
            status=agent_status,
            state_snapshot=snapshot,
            metrics=_metrics_copy(metrics),
            timestamp=now,
            metadata=meta,
            app_version=self._app_version,
        )
        del state, metrics
        info = self._step_info(agent_id, agent_status, workflow_id, lease)
        if copied - copying > _HELD_LONG and not codec.prepared(snapshot.data):
            # (A split SharedState was copied under the codec's pacer, which _store goes on
            # with.) A large state's copy (which must happen before any await: the caller may
            # change the state afterwards) held the loop: let it run before the encoding,
            # which works on our private copy. Each writer then holds the loop for one
            # step at a time, and a round of the loop over 20 writers stays short.
            await anyio.lowlevel.checkpoint()
        return await self._store(checkpoint, finite and meta_finite, lease, info)

    def _step_info(
        self, agent_id: str, status: AgentStatus, workflow_id: str, lease: Lease | None
    ) -> StepInfo | None:
        """What the workflow's record says of its latest step (stores with records only).

        Checks ``lease`` first: it must be the workflow's and the storage must keep leases.
        """
        if lease is not None:
            fence_token(lease, workflow_id)
            self._workflow_storage()
        return StepInfo(agent_id, status._value_, self._kind) if self._keeps_records else None

    async def _store(
        self, checkpoint: Checkpoint, finite: bool, lease: Lease | None, info: StepInfo | None
    ) -> Checkpoint:
        """Encode and store ``checkpoint`` (private copies); return what the caller gets."""
        codec = self._codec
        workflow_id, step = checkpoint.workflow_id, checkpoint.step
        blobs = codec.blobs
        if blobs is not None and codec.wants_tree(checkpoint.state_snapshot.data):
            # ``checkpoint`` holds private copies made above, so nothing else changes it.
            # On a storage that never waits, each step of a large save takes its turn:
            # twenty always-ready writers share out the loop's iterations (codec/pacing.py).
            pacer = codec.pacer
            await pacer.step()
            tree = await codec.encode_tree(workflow_id, checkpoint, finite)
            if tree is not None:
                record, split = tree
                returned = await codec.returned_tree(workflow_id, checkpoint)
                await round_trip(
                    blobs.save_tree,
                    workflow_id,
                    step,
                    record,
                    split,
                    keep_last=self._max_checkpoints,
                    fence=lease,
                    step_info=info,
                )
                try:
                    await pacer.step()
                finally:  # stored: its split is the workflow's last, even if cancelled here
                    codec.remember(workflow_id, split)
                return returned
        data = codec.encode(checkpoint, finite)
        returned = codec.returned(checkpoint, data)  # before the save: it may refuse a value
        await self._write_record(workflow_id, step, data, lease, info)
        return returned

    def _write_record(
        self, workflow_id: str, step: int, data: bytes, lease: Lease | None, info: StepInfo | None
    ) -> Awaitable[None]:
        """The save of a version-1 record, sealed first if this manager seals.

        Not a coroutine unless it seals: a frame less for each waiting save to keep.
        """
        sealer = self._codec.sealer
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
    ) -> Awaitable[None]:
        if info is None:
            return round_trip(
                self._storage.save, workflow_id, step, data, keep_last=self._max_checkpoints
            )
        # Known to be a WorkflowStorage (_keeps_records): a protocol isinstance check
        # here would cost the hot path ~10 us per checkpoint.
        records: WorkflowStorage = self._storage  # type: ignore[assignment]
        return round_trip(
            records.save,
            workflow_id,
            step,
            data,
            keep_last=self._max_checkpoints,
            fence=lease,
            step_info=info,
        )

    def _check_arguments(
        self,
        workflow_id: Any,
        step: Any,
        agent_id: Any,
        status: Any,
        metadata: Any,
    ) -> tuple[str, int, AgentStatus, dict[str, Any], bool]:
        """Check a checkpoint's arguments; return them normalized, with a copy of ``metadata``.

        Also what ``ResumableWorkflow.step`` calls on entry, before the step's body runs.
        """
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        _check_text(agent_id, "agent_id")
        agent_status = _status(status)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidArgumentError(
                f"metadata must be a mapping or None, not {type(metadata).__qualname__}"
            )
        if not metadata:
            return workflow_id, step, agent_status, {}, True
        meta, finite = self._codec.copy(dict(metadata), "metadata")
        return workflow_id, step, agent_status, meta, finite

    @traced("get_checkpoint", duration="load")
    async def get_checkpoint(self, workflow_id: str, step: int, *, raw: bool = False) -> Checkpoint:
        """Return one step's checkpoint; raise :class:`CheckpointNotFoundError` if absent.

        With ``raw=True`` a stored value whose type is not registered (or was written by a
        newer version) comes back as a :class:`~aiocheckpoint.TaggedValue` instead of
        raising a :class:`~aiocheckpoint.CheckpointTypeError`.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        stored = await round_trip(self._storage.load, workflow_id, step)
        view: View = "raw" if raw else "typed"
        checkpoint = (
            None if stored is None else await self._codec.decode_live(workflow_id, stored, view)
        )
        if checkpoint is None:
            raise CheckpointNotFoundError(workflow_id, step)
        return checkpoint

    @traced("get_latest_checkpoint", duration="load")
    async def get_latest_checkpoint(self, workflow_id: str) -> Checkpoint | None:
        """Return the checkpoint with the highest step, or None if the workflow has none.

        A corrupted latest checkpoint raises :class:`CheckpointCorruptedError`; use
        :meth:`get_resume_point` to fall back to the newest one that verifies. One sealed
        under a key the keyring lacks raises :class:`~aiocheckpoint.UnknownKeyError`.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        for _ in range(_RETRIES):
            stored = await round_trip(self._storage.load, workflow_id)
            if stored is None:
                return None
            checkpoint = await self._codec.decode_live(workflow_id, stored)
            if checkpoint is not None:
                return checkpoint
        raise CheckpointCorruptedError(
            "the latest checkpoint kept being deleted while it was read",
            workflow_id=workflow_id,
        )

    async def has_checkpoint(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or, when ``step`` is None, any step) of the workflow is stored."""
        self._check_open()
        return await self._storage.exists(check_workflow_id(workflow_id), check_optional_step(step))

    async def list_checkpoints(
        self,
        workflow_id: str,
        *,
        limit: int | None = None,
        after: int | None = None,
        before: int | None = None,
        descending: bool = False,
    ) -> list[Checkpoint]:
        """Return checkpoints ordered by step, optionally one page of them.

        ``after``/``before`` bound the steps (exclusive); ``limit`` caps the count, taken
        from the low end (or the high end with ``descending=True``). For long histories
        prefer :meth:`iter_checkpoints`, which pages through the storage.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        records = await self._storage.scan(
            workflow_id,
            after=check_optional_step(after, "after"),
            before=check_optional_step(before, "before"),
            limit=check_limit(limit),
            descending=descending,
        )
        out: list[Checkpoint] = []
        for record in records:
            checkpoint = await self._codec.decode_live(workflow_id, record)
            if checkpoint is not None:  # None: deleted while it was being read
                out.append(checkpoint)
        return out

    async def iter_checkpoints(
        self, workflow_id: str, *, page_size: int = _PAGE, descending: bool = False
    ) -> AsyncIterator[Checkpoint]:
        """Yield every checkpoint of a workflow in step order, ``page_size`` at a time."""
        page_size = check_limit(page_size) or _PAGE
        cursor: int | None = None
        while True:
            bound = {"before": cursor} if descending else {"after": cursor}
            page = await self.list_checkpoints(
                workflow_id, limit=page_size, descending=descending, **bound
            )
            for checkpoint in page:
                yield checkpoint
            if len(page) < page_size:
                return
            cursor = page[-1].step

    async def delete_checkpoints(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or every checkpoint of the workflow; return whether any existed."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_optional_step(step)
        if step is None:
            self._codec.forget(workflow_id)
        return await self._storage.delete(workflow_id, step)

    @traced("get_resume_point", duration="load")
    async def get_resume_point(self, workflow_id: str) -> ResumePoint | None:
        """Where to resume a workflow: ``(step, state_snapshot, metrics)``, or None.

        The step is the latest checkpoint's step + 1 when it is COMPLETED, and the same step
        otherwise (it has to run again). If the latest checkpoint is corrupted, the newest
        one that verifies is used instead and a warning is logged; if none verifies, the
        :class:`CheckpointCorruptedError` of the latest is raised. A checkpoint sealed
        under a key the keyring lacks is not corrupted: its :class:`UnknownKeyError` is
        raised, never skipped (that would run completed steps again). The result's
        ``app_version`` names the application version that wrote the checkpoint.
        """
        checkpoint = await self._latest_valid(workflow_id)
        if checkpoint is None:
            return None
        step = (
            checkpoint.step + 1 if checkpoint.status is AgentStatus.COMPLETED else checkpoint.step
        )
        return ResumePoint(
            step, checkpoint.state_snapshot, checkpoint.metrics, checkpoint.app_version
        )

    @traced("fork_workflow")
    async def fork_workflow(self, source_id: str, step: int, new_id: str) -> int:
        """Make ``new_id`` a copy of ``source_id``'s history up to ``step``; return the count.

        The new workflow gets the source's checkpoints with steps ``<= step`` (at most
        ``max_checkpoints`` of them, the newest), with their timestamps, metadata, metrics and
        states, so it resumes where the source stood after ``step``: "what if the agent had
        answered differently", or a debugging copy. On stores with content-addressed blobs a
        large state is not copied: the fork's records share the source's blobs (only its
        records are written), and deleting the source later keeps what the fork uses.

        Raises :class:`~aiocheckpoint.CheckpointNotFoundError` if the source or that step is
        not stored, :class:`~aiocheckpoint.WorkflowExistsError` if ``new_id`` already has
        checkpoints, a workflow record or effect records (a journal left by a run killed in
        its first step), and :class:`~aiocheckpoint.InvalidWorkflowIdError` /
        :class:`~aiocheckpoint.InvalidStepError` for bad ids and steps; then nothing is
        written. The step is written first, so a fork interrupted part way resumes from the
        right step with part of the history. The fork is UNFINISHED on backends with
        workflow records.
        """
        self._check_open()
        source_id, new_id = check_workflow_id(source_id), check_workflow_id(new_id)
        step = check_step(step)
        self._drive(new_id)  # no block of this manager starts it while it is being copied
        try:
            copied = await self._fork(source_id, step, new_id)
            await history.forked(self._storage, source_id, step, new_id)
            return copied
        finally:
            self._undrive(new_id)

    async def _fork(self, source_id: str, step: int, new_id: str) -> int:
        storage = self._storage
        if (traces := await workflow_traces(storage, new_id)) is not None:
            raise WorkflowExistsError(new_id, traces)
        if not await storage.exists(source_id, step):
            raise CheckpointNotFoundError(
                source_id, step if await storage.exists(source_id) else None
            )
        limit = self._max_checkpoints
        copied, cursor = 0, step + 1
        while limit is None or copied < limit:
            size = _PAGE if limit is None else min(_PAGE, limit - copied)
            page = await storage.scan(source_id, before=cursor, limit=size, descending=True)
            if not page:
                break
            for record in page:
                await self._fork_record(source_id, record, new_id)
            copied += len(page)
            cursor = page[-1].step
        return copied

    async def _fork_record(self, source_id: str, record: StoredCheckpoint, new_id: str) -> None:
        storage, keep = self._storage, self._max_checkpoints
        if isinstance(storage, BlobCheckpointStorage):
            tree = await self._codec.fork_tree(storage, source_id, record, new_id)
            if tree is not None:
                await storage.save_tree(new_id, record.step, tree[0], tree[1], keep_last=keep)
                return
        # In the stored (tagged) form: typed values are copied as they are, not re-encoded.
        checkpoint = await self._codec.decode(source_id, record, "stored")
        data = self._codec.encode(checkpoint.model_copy(update={"workflow_id": new_id}), False)
        data = await self._codec.seal(new_id, record.step, data)
        await storage.save(new_id, record.step, data, keep_last=keep)

    async def list_workflows(
        self,
        status: WorkflowStatus | str | None = None,
        *,
        agent_status: AgentStatus | str | None = None,
        metadata: Mapping[str, Any] | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        in_doubt: bool | None = None,
        kind: str | None = WORKFLOW_KIND,
    ) -> list[str]:
        """Every workflow id that has at least one checkpoint, sorted (of every kind).

        With ``status`` (for example ``"unfinished"``, what a runner resumes after a
        restart, or ``"paused"``, what waits for a human), any other filter of
        :meth:`list_workflow_records` or a ``kind`` other than ``"workflow"``, the ids of
        the matching workflow records instead, of ``kind`` only (``"workflow"`` by default:
        no LangGraph thread; None: every kind), as a :class:`~aiocheckpoint.Page`, whose
        ``next_cursor`` continues it; this needs a backend with workflow records.
        ``in_doubt=True`` alone lists, on any backend with an effect journal, every
        workflow with an effect in doubt (as :meth:`list_in_doubt_workflows`);
        ``in_doubt=False`` alone, the workflows with checkpoints and no effect in doubt.
        """
        self._check_open()
        filters = (agent_status, metadata, updated_after, updated_before, limit, cursor)
        if status is None and all(f is None for f in filters) and kind in (WORKFLOW_KIND, None):
            if in_doubt is None:
                return await self._storage.list_workflows()
            return Page(await self._in_doubt_ids(in_doubt))
        page = await self.list_workflow_records(
            status,
            agent_status=agent_status,
            metadata=metadata,
            updated_after=updated_after,
            updated_before=updated_before,
            limit=limit,
            cursor=cursor,
            in_doubt=in_doubt,
            kind=kind,
        )
        return Page([record.workflow_id for record in page], page.next_cursor)

    async def _in_doubt_ids(self, in_doubt: object) -> list[str]:
        if not isinstance(in_doubt, bool):
            raise InvalidArgumentError(f"in_doubt must be a bool or None: {in_doubt!r}")
        doubtful = await self._effect_storage().in_doubt_workflows()
        if in_doubt:
            return doubtful
        skip = set(doubtful)
        return [wf for wf in await self._storage.list_workflows() if wf not in skip]

    # --- workflow records and leases --------------------------------------------------

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record (status, timestamps, lease), or None if it has none."""
        self._check_open()
        return await self._workflow_storage().get_workflow(check_workflow_id(workflow_id))

    async def list_workflow_records(
        self,
        status: WorkflowStatus | str | None = None,
        *,
        agent_status: AgentStatus | str | None = None,
        metadata: Mapping[str, Any] | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        in_doubt: bool | None = None,
        kind: str | None = WORKFLOW_KIND,
    ) -> Page[WorkflowRecord]:
        """Workflow records ordered by id, filtered, one page at a time.

        Only records of ``kind`` are listed: by default ``"workflow"``, those runners drive
        (a LangGraph thread's record, of kind ``"langgraph"``, is not); None lists every
        kind. Filters (all optional, combined with AND): the workflow ``status``; the
        ``agent_status`` of its latest step (e.g. ``"blocked"``); ``metadata`` equality on
        each given top-level key; ``updated_after`` / ``updated_before`` (exclusive,
        aware datetimes); ``in_doubt`` True, only the workflows with an effect in doubt
        (``docs/effects.md``), False only those without. ``limit`` (1-10,000) caps the
        page; pass the returned page's ``next_cursor`` as ``cursor`` for the next one
        (None: it was the last). On SQLite and PostgreSQL a page filtered by status, agent
        status or a metadata key is an index walk: it costs about the page, however many
        workflows the store holds. Records only: a workflow killed in its first step,
        before any checkpoint and without a lease, has no record, and only
        :meth:`list_in_doubt_workflows` (or ``list_workflows(in_doubt=True)``) lists it.
        """
        self._check_open()
        wanted = None if status is None else _workflow_status(status)
        agent = None if agent_status is None else _status(agent_status).value
        updated = (updated_after, updated_before)
        query = build_query(wanted, agent, metadata, updated, limit, cursor, in_doubt, kind)
        records = await self._workflow_storage().query_workflow_records(query)
        full = limit is not None and len(records) == limit
        return Page(records, encode_cursor(records[-1].workflow_id) if full else None)

    async def register_workflow(
        self, workflow_id: str, *, metadata: Mapping[str, Any] | None = None
    ) -> WorkflowRecord:
        """Create an UNFINISHED record for a workflow that has none; return its record.

        Runners can then claim it with :meth:`claim_workflow` before any checkpoint exists.
        ``metadata`` (a JSON object: tenant, user, kind...) replaces the record's metadata,
        which :meth:`list_workflow_records` filters on.
        """
        self._check_open()
        storage = self._workflow_storage()
        workflow_id = check_workflow_id(workflow_id)
        meta = None if metadata is None else _metadata_text(metadata)
        return await storage.register_workflow(workflow_id, metadata=meta)

    async def resume_workflow(self, workflow_id: str, input: Any = None) -> WorkflowRecord:
        """Make a PAUSED workflow claimable again, delivering ``input`` to its next run.

        ``input`` (any JSON value) is stored with the workflow record in the same
        transaction that makes it UNFINISHED, so it survives a crash before the next run;
        that run reads it as :attr:`ResumableWorkflow.resume_input`, and it is cleared by
        the first checkpoint the run writes. A workflow that is not paused raises
        :class:`~aiocheckpoint.InvalidArgumentError`; an unknown one
        :class:`~aiocheckpoint.CheckpointNotFoundError`.
        """
        self._check_open()
        storage = self._workflow_storage()
        workflow_id = check_workflow_id(workflow_id)
        return await storage.resume_workflow(workflow_id, json_text(input, "resume input"))

    async def get_events(
        self, workflow_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[WorkflowEvent]:
        """The workflow's events, oldest first: :mod:`aiocheckpoint.history`.

        Paged as :meth:`list_workflow_records` is: ``limit`` of them after ``cursor``.
        """
        self._check_open()
        return await history.get_events(
            self._storage, check_workflow_id(workflow_id), limit, cursor
        )

    async def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> WorkflowRecord:
        """Cancel an UNFINISHED or PAUSED workflow: CANCELLED, ``reason`` in ``last_error``.

        Its runner stops at its next step boundary or ``wf.effect`` call with
        :class:`~aiocheckpoint.WorkflowCancelledError`; see :mod:`aiocheckpoint.control`.
        """
        self._check_open()
        return await control.cancel(self._storage, check_workflow_id(workflow_id), reason)

    async def retry_workflow(self, workflow_id: str) -> WorkflowRecord:
        """Make a FAILED or CANCELLED workflow claimable again, with attempts back to 0.

        Any other status raises :class:`~aiocheckpoint.InvalidArgumentError`; a runner
        holding its lease :class:`~aiocheckpoint.LeaseHeldError` (:mod:`aiocheckpoint.control`).
        """
        self._check_open()
        return await control.retry(self._storage, check_workflow_id(workflow_id))

    @traced("record_failure")
    async def record_failure(
        self,
        workflow_id: str,
        error: BaseException,
        *,
        retry: RetryPolicy | None = None,
        lease: Lease | None = None,
    ) -> WorkflowRecord:
        """Count a failed run of the workflow and store its error (``type`` and ``message``).

        With a ``retry`` policy that finds ``error`` retryable and attempts left, the
        workflow goes back to UNFINISHED and no runner can claim it before the policy's
        backoff has elapsed (by the storage's clock); otherwise it is FAILED, with the final
        error on its record. ``ResumableWorkflow`` calls this when its block raises.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        if not isinstance(error, BaseException):
            raise InvalidArgumentError(f"error must be an exception, not {type(error).__name__}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgumentError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        if lease is not None:
            fence_token(lease, workflow_id)
        text = json_text(_error_fields(error), "error")
        delays = tuple(retry.delays()) if retry is not None and retry.retryable(error) else ()
        return await round_trip(
            self._workflow_storage().record_failure,
            workflow_id,
            text,
            retry_delays=delays,
            fence=lease,
        )

    @traced("mark_workflow")
    async def mark_workflow(
        self,
        workflow_id: str,
        status: WorkflowStatus | str,
        *,
        lease: Lease | None = None,
    ) -> WorkflowRecord:
        """Set the workflow's status (fenced by ``lease`` when given)."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        if lease is not None:
            fence_token(lease, workflow_id)
        return await round_trip(
            self._workflow_storage().set_workflow_status,
            workflow_id,
            control.markable(_workflow_status(status)),
            fence=lease,
        )

    @traced("acquire_lease", acquires=True)
    async def acquire_lease(self, workflow_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Take the workflow's lease for ``ttl`` seconds.

        Raises :class:`~aiocheckpoint.LeaseHeldError` while another owner's lease is live.
        """
        self._check_open()
        workflow_id, owner = check_workflow_id(workflow_id), _check_owner(owner)
        ttl, storage = check_ttl(ttl), self._workflow_storage()
        # One owner name never holds a lease twice at once in this process (see _holders).
        _HOLDERS.reserve(storage, workflow_id, owner)
        try:
            lease = await round_trip(storage.acquire_lease, workflow_id, owner, ttl)
        except BaseException:
            _HOLDERS.cancel(storage, workflow_id, owner)
            raise
        _HOLDERS.granted(storage, lease)
        return lease

    @traced("renew_lease")
    async def renew_lease(self, lease: Lease, ttl: float = 30.0) -> Lease:
        """Extend a lease to ``ttl`` seconds from now; ``LeaseLostError`` if taken over."""
        self._check_open()
        storage = self._workflow_storage()
        try:
            renewed = await round_trip(storage.renew_lease, lease, check_ttl(ttl))
        except LeaseLostError:
            _HOLDERS.dropped(storage, lease)
            raise
        _HOLDERS.renewed(storage, renewed)
        return renewed

    @traced("release_lease")
    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up; releasing a lease that was taken over does nothing."""
        self._check_open()
        await round_trip(self._workflow_storage().release_lease, lease)
        _HOLDERS.dropped(self._storage, lease)

    @traced("claim_workflow", acquires=True)
    async def claim_workflow(
        self, owner: str, ttl: float = 30.0, *, retry: RetryPolicy | None = None
    ) -> Lease | None:
        """Lease the next unfinished workflow whose lease is free or expired, or return None.

        Claims are atomic: concurrent runners never get the same workflow. Paused workflows,
        those whose retry backoff has not elapsed and records of another kind than
        ``"workflow"`` (LangGraph threads) are never handed out. ``retry`` is the
        pool's :class:`~aiocheckpoint.RetryPolicy`: it travels with the lease, and a
        ``ResumableWorkflow`` driving it retries a failed run by it.
        """
        self._check_open()
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgumentError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        lease = await round_trip(
            self._workflow_storage().claim_next_workflow, _check_owner(owner), check_ttl(ttl)
        )
        if lease is None:
            return None
        _HOLDERS.granted(self._storage, lease)
        return lease if retry is None else lease.model_copy(update={"retry": retry})

    def _drive(self, workflow_id: str) -> None:
        """Become the one driver of ``workflow_id``; WorkflowBusyError if it has one."""
        if workflow_id in self._drivers:
            raise WorkflowBusyError(workflow_id)
        self._drivers.add(workflow_id)

    def _undrive(self, workflow_id: str) -> None:
        self._drivers.discard(workflow_id)

    def supports_workflow_records(self) -> bool:
        """Whether the storage keeps workflow records and leases."""
        return isinstance(self._storage, WorkflowStorage)

    def _workflow_storage(self) -> WorkflowStorage:
        if not isinstance(self._storage, WorkflowStorage):
            raise UnsupportedOperationError(
                f"{type(self._storage).__name__} keeps no workflow records or leases; "
                "use a backend that does (in-memory, SQLite or PostgreSQL)"
            )
        return self._storage

    # --- durable effects (docs/effects.md) ----------------------------------------------

    def supports_effects(self) -> bool:
        """Whether the storage keeps an effect journal (every bundled backend does)."""
        return self._effects is not None

    async def record_effect(
        self, record: EffectRecord, *, lease: Lease | None = None
    ) -> EffectRecord:
        """Durably store an effect's intent or outcome (fenced by ``lease`` when given).

        :meth:`ResumableWorkflow.effect <aiocheckpoint.ResumableWorkflow.effect>` calls it.
        Its result is copied through the value stage, so an unstorable result raises
        :class:`~aiocheckpoint.CheckpointSerializationError` before anything is written;
        returns the record as stored (holding that copy).
        """
        self._check_open()
        workflow_id = check_workflow_id(record.workflow_id)
        step = check_step(record.step)
        key = check_effect_key(record.key)
        data, result = self._codec.encode_effect(record)
        data = await self._codec.seal_effect(workflow_id, step, key, data)
        if lease is not None:
            fence_token(lease, workflow_id)
            if not self._keeps_records:
                self._workflow_storage()  # raises: no leases here
        await round_trip(
            self._effect_storage().put_effect,
            workflow_id,
            step,
            key,
            data,
            in_doubt=record.in_doubt,
            fence=lease,
        )
        return record if result is record.result else replace(record, result=result)

    async def get_effects(self, workflow_id: str, step: int) -> list[EffectRecord]:
        """The effect journal of one step, ordered by key (empty when it has none)."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        stored = await round_trip(
            self._effect_storage().load_effects, workflow_id, check_step(step)
        )
        return await open_records(self._codec.open_effect, workflow_id, stored)

    async def list_in_doubt_effects(self, workflow_id: str) -> list[EffectRecord]:
        """The workflow's effects in doubt (to :meth:`resolve_effect`), by step then key."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        stored = await round_trip(self._effect_storage().in_doubt_effects, workflow_id)
        return await open_records(self._codec.open_effect, workflow_id, stored)

    async def list_in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt (an intent without an outcome), sorted.

        An effect whose call is running right now is in this list too, until it returns.
        """
        self._check_open()
        return await self._effect_storage().in_doubt_workflows()

    async def resolve_effect(
        self,
        workflow_id: str,
        step: int,
        key: str,
        *,
        happened: bool,
        result: Any = None,
        lease: Lease | None = None,
    ) -> EffectRecord:
        """Settle an effect in doubt, once you know whether its call happened.

        ``happened=True`` records ``result`` as its result (the step's re-run returns it
        without calling the function); ``happened=False`` records it as failed (the re-run
        calls the function again). Raises :class:`~aiocheckpoint.InvalidArgumentError` if
        the step has no effect ``key`` in doubt, or :class:`~aiocheckpoint.LeaseLostError`
        first when ``lease`` is no longer the workflow's (another runner may have settled it).

        The write is fenced: by ``lease`` when given (a runner settling its own effect);
        otherwise, on a backend with leases, by a lease of its own taken for the write and
        released after it, so that it raises :class:`~aiocheckpoint.LeaseHeldError` while
        a runner holds the workflow, and a stale runner cannot write after it. A workflow
        FAILED on an effect in doubt is UNFINISHED again (claimable) once its last one is
        settled (:mod:`aiocheckpoint.doubt`).
        """
        if not isinstance(happened, bool):
            raise InvalidArgumentError(f"happened must be a bool, not {happened!r}")
        if lease is not None or not self._keeps_records:
            return await self._resolve(workflow_id, step, key, happened, result, lease)
        own = await self.acquire_lease(workflow_id, _RESOLVER, _RESOLVE_TTL)
        try:
            return await self._resolve(workflow_id, step, key, happened, result, own)
        finally:
            await self.release_lease(own)

    async def _resolve(
        self,
        workflow_id: str,
        step: int,
        key: str,
        happened: bool,
        result: Any,
        lease: Lease | None,
    ) -> EffectRecord:
        wanted = check_effect_key(key)
        found = [r for r in await self.get_effects(workflow_id, step) if r.key == wanted]
        if not found or not found[0].in_doubt:
            await self._check_current(lease, workflow_id)
            raise InvalidArgumentError(
                f"step {step} of workflow {workflow_id!r} has no effect {wanted!r} in doubt"
            )
        record = settled(found[0], happened, result)
        if lease is not None and self._keeps_records:
            self._codec.encode_effect(record)  # an unstorable result fails before any write
            workflows = self._workflow_storage()
            await reopen_before_settle(workflows, self._effect_storage(), record, lease)
        return await self.record_effect(record, lease=lease)

    async def _check_current(self, lease: Lease | None, workflow_id: str) -> None:
        """LeaseLostError if ``lease`` is no longer the workflow's (a runner taken over)."""
        if lease is None or not self._keeps_records:
            return
        record = await self.get_workflow(workflow_id)
        if record is None or record.fencing_token != fence_token(lease, workflow_id):
            raise LeaseLostError(
                f"lease {lease.token} on workflow {workflow_id!r} is no longer current"
            )

    def _effect_storage(self) -> EffectStorage:
        if self._effects is None:
            raise UnsupportedOperationError(
                f"{type(self._storage).__name__} keeps no effect journal (docs/effects.md)"
            )
        return self._effects

    async def close(self) -> None:
        """Close the storage. Calling it again does nothing."""
        if not self._closed:
            self._closed = True
            for scope in self._sweepers:
                scope.cancel()
            await self._storage.close()

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _latest_valid(self, workflow_id: str) -> Checkpoint | None:
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        try:
            stored = await round_trip(self._storage.load, workflow_id)
        except CheckpointCorruptedError as first:  # the storage refused the latest record
            if first.step is None:
                raise
            return await self._older_valid(workflow_id, first.step, first)
        if stored is None:
            return None
        try:
            return await self._codec.decode(workflow_id, stored)
        except CheckpointCorruptedError as first:
            return await self._older_valid(workflow_id, stored.step, first)

    async def _older_valid(
        self, workflow_id: str, latest: int, first: CheckpointCorruptedError
    ) -> Checkpoint:
        """The newest checkpoint below ``latest`` that verifies; else raise ``first``."""
        cursor: int | None = latest
        while cursor is not None:
            older, cursor = await self._older_page(workflow_id, cursor)
            for record in older:
                try:
                    checkpoint = await self._codec.decode(workflow_id, record)
                except CheckpointCorruptedError:
                    continue
                logger.warning(
                    "workflow %r: latest checkpoint (step %d) is corrupted (%s); "
                    "resuming from step %d, the newest that verifies",
                    workflow_id,
                    latest,
                    first.reason,
                    checkpoint.step,
                )
                return checkpoint
        raise first

    async def _older_page(
        self, workflow_id: str, cursor: int
    ) -> tuple[list[StoredCheckpoint], int | None]:
        """Records below ``cursor``, newest first, and the cursor of the next page (or None).

        A record the storage itself refuses (over its size limit, not a file) is skipped:
        the page then ends above it and the next one starts below it.
        """
        low: int | None = None
        while True:
            try:
                page = await round_trip(
                    self._storage.scan,
                    workflow_id,
                    after=low,
                    before=cursor,
                    limit=_PAGE,
                    descending=True,
                )
            except CheckpointCorruptedError as bad:
                if bad.step is None or bad.step >= cursor or (low is not None and bad.step <= low):
                    raise
                low = bad.step
                continue
            return page, page[-1].step if len(page) == _PAGE else low

    async def decode_record(
        self, workflow_id: str, stored: StoredCheckpoint, *, view: View = "typed"
    ) -> Checkpoint:
        """Verify and decode a record read from the storage (either format version).

        For tools that read records through the storage protocol (the command line does):
        a version-2 record's blobs are fetched from the storage. Raises
        :class:`~aiocheckpoint.CheckpointCorruptedError` like the reading calls do.
        ``view="stored"`` leaves values in their tagged JSON form (no class is needed),
        ``"raw"`` reads unregistered types as :class:`~aiocheckpoint.TaggedValue`.
        """
        return await self._codec.decode(check_workflow_id(workflow_id), stored, view)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("CheckpointManager is closed")


def _sealer(encryption: KeyProvider | None, allow_plaintext: bool) -> Sealer | None:
    """The bytes stage of ``encryption=`` (``docs/encryption.md``), or None without it."""
    if type(allow_plaintext) is not bool:
        raise InvalidArgumentError(f"allow_plaintext must be a bool, got {allow_plaintext!r}")
    if encryption is None:
        if allow_plaintext:
            raise InvalidArgumentError("allow_plaintext=True needs encryption=")
        return None
    return Sealer(encryption, allow_plaintext=allow_plaintext)


def _check_text(value: Any, name: str) -> str:
    if type(value) is str and value.isascii():
        return value  # ASCII always encodes: no copy to make
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be str, not {type(value).__qualname__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} is not valid Unicode text") from None
    return value


def _check_owner(value: Any) -> str:
    owner = _check_text(value, "lease owner")
    if not owner or len(owner.encode("utf-8")) > 255:
        raise InvalidArgumentError("a lease owner must be a non-empty str of at most 255 bytes")
    return owner


def _metadata_text(metadata: Any) -> str:
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentError(f"metadata must be a mapping, not {type(metadata).__qualname__}")
    if not all(isinstance(key, str) for key in metadata):
        raise InvalidArgumentError("metadata keys must be str")
    return json_text(dict(metadata), "metadata")


def _error_fields(error: BaseException) -> dict[str, str]:
    # Bounded: a huge message must not make every record read large.
    return {"type": type(error).__qualname__, "message": str(error)[:4000]}


def _metrics_copy(metrics: ExecutionMetrics | None) -> ExecutionMetrics:
    fields = _metrics_fields(metrics)
    return default_metrics() if fields is None else built(ExecutionMetrics, **fields)


def _metrics_fields(metrics: ExecutionMetrics | None) -> dict[str, Any] | None:
    """A copy of ``metrics``' fields (None for None): independent, every field is immutable."""
    if metrics is None:
        return None
    if not isinstance(metrics, ExecutionMetrics):
        raise InvalidArgumentError(
            f"metrics must be ExecutionMetrics or None, not {type(metrics).__qualname__}"
        )
    return dict(metrics.__dict__)
