"""CheckpointManager: the async API over any :class:`CheckpointStorage`.

The manager checks each call's arguments and hands the record pipeline (:mod:`.codec`)
one call: a save, a decode, a fork. Its other families of calls are defined with the parts
they delegate to: workflow records, leases and claims in :mod:`.workflow_records`, the effect
journal in :mod:`.journal`, retention in :mod:`.sweeping`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any

from typing_extensions import Self

from . import history
from ._telemetry import round_trip, traced
from ._validation import (
    check_agent_status,
    check_limit,
    check_optional_step,
    check_step,
    check_text,
    check_workflow_id,
)
from .codec import (
    DEFAULT_VALUES,
    FieldSealer,
    KeyProvider,
    RecordCodec,
    TypedValues,
    TypeRegistry,
    View,
    sealer_for,
)
from .errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    InvalidArgumentError,
    StorageClosedError,
    WorkflowBusyError,
    WorkflowExistsError,
)
from .journal import EffectJournal, EffectJournalMethods
from .leases import WORKFLOW_KIND, Lease, check_kind, fence_token
from .models import (
    AgentStatus,
    Checkpoint,
    ExecutionMetrics,
    StateSnapshot,
    make_draft,
    make_fields,
    utcnow,
)
from .partial_reads import PartialReadMethods
from .retention import RetentionPolicy, policy_from
from .state import SharedState
from .storage.base import (
    BlobCheckpointStorage,
    CheckpointStorage,
    StoredCheckpoint,
    workflow_traces,
)
from .storage.memory import InMemoryCheckpointStorage
from .storage.queries import StepInfo
from .sweeping import RetentionMethods, Sweeper
from .workflow_records import WorkflowRecordMethods, WorkflowRecords

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
_RETRIES = 8


class CheckpointManager(
    WorkflowRecordMethods, EffectJournalMethods, RetentionMethods, PartialReadMethods
):
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
        policy = policy_from(max_checkpoints, retention)
        # None: a save leaves the kind of an existing record as it is.
        self._kind = None if check_kind(workflow_kind) == WORKFLOW_KIND else workflow_kind
        self._storage: CheckpointStorage = (
            storage if storage is not None else InMemoryCheckpointStorage()
        )
        # What a save prunes itself, in its transaction (see RetentionPolicy.write_keep_last).
        self._max_checkpoints = None if policy is None else policy.write_keep_last
        if incremental not in (None, True, False):
            raise InvalidArgumentError(f"incremental must be a bool or None, got {incremental!r}")
        supports = isinstance(self._storage, BlobCheckpointStorage)
        if incremental and not supports:
            raise InvalidArgumentError(
                f"incremental=True needs a storage that keeps blobs; "
                f"{type(self._storage).__name__} does not"
            )
        sealer = sealer_for(encryption, allow_plaintext)
        self._encrypted = sealer is not None
        blobs: BlobCheckpointStorage | None = (
            self._storage  # type: ignore[assignment]
            if supports and incremental is not False
            else None
        )
        if types is not None and not isinstance(types, TypeRegistry):
            raise InvalidArgumentError(f"types must be a TypeRegistry, not {types!r}")
        if app_version is not None:
            check_text(app_version, "app_version")
        self._app_version = app_version
        self._types = types
        self._incremental = blobs is not None
        values = DEFAULT_VALUES if types is None else TypedValues(types)
        # Everything between a validated call and the storage: copies, encoding, storing.
        self._codec = RecordCodec(
            self._storage, blobs, values, sealer, keep_last=self._max_checkpoints
        )
        self._records = WorkflowRecords(self._storage, self._check_open, FieldSealer(sealer))
        self._keeps_records = self._records.supported
        # The saves' StepInfo per agent id and status: one object, not one per save (a
        # NamedTuple the garbage collector never stops tracking, promoted while its save waits).
        self._infos: dict[tuple[str, str], StepInfo] = {}
        self._journal = EffectJournal(self._storage, self._codec, self._records, self._check_open)
        self._sweeper = Sweeper(self._storage, self._codec, policy, self._check_open)
        self._partial = self._codec  # the partial reads' (partial_reads.py)
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
        return self._incremental

    @property
    def encrypted(self) -> bool:
        """Whether this manager was given keys (``encryption=``): it seals what it writes."""
        return self._encrypted

    @property
    def max_checkpoints(self) -> int | None:
        """How many checkpoints per workflow each write keeps (None: it prunes nothing)."""
        return self._max_checkpoints

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
        if self._closed:  # _check_open, inline: every save passes here
            raise StorageClosedError("CheckpointManager is closed")
        workflow_id, step, agent_status, meta, meta_finite = self._check_arguments(
            workflow_id, step, agent_id, status, metadata
        )
        draft = make_draft(
            (
                workflow_id,
                step,
                agent_id,
                agent_status,
                state,
                type(state) is not dict and isinstance(state, SharedState),
                None if metrics is None else _metrics_fields(metrics),
                meta,
                meta_finite,
                self._app_version,
            )
        )
        if lease is not None:  # it must be the workflow's, and the storage must keep leases
            fence_token(lease, workflow_id)
            self._records.workflow_storage()
        # What the workflow's record says of its latest step (stores with records only).
        info = self._info(agent_id, agent_status._value_) if self._keeps_records else None
        # The codec copies the state before its first await; the caller's objects are not
        # kept here while the record is stored.
        saving = self._codec.save(draft, lease, info)
        del state, metrics, metadata, draft
        return await saving

    @traced("create_checkpoint", duration="save")
    def save_owned(
        self,
        workflow_id: str,
        step: int,
        agent_id: str,
        state: dict[str, Any],
        metadata: dict[str, Any],
        *,
        lease: Lease | None = None,
    ) -> Coroutine[Any, Any, object]:
        """Store a COMPLETED step whose state the caller hands over, uncopied.

        For integrations that build a state for one save (the LangGraph saver): ``state``
        and ``metadata`` are dicts of JSON values only (str keys; str, int, bool, None,
        lists and dicts; no float) that nobody changes afterwards. They are encoded when
        this is called, not copied, and the awaitable returned completes once the record
        is durable; holding nothing of them while it waits, it leaves no containers for
        the garbage collector to promote. A state that needs more (a key to escape, a
        value only the exact encoder writes) takes :meth:`create_checkpoint`'s path, which
        also raises its errors.
        """
        self._check_open()
        fields = make_fields(
            (
                check_workflow_id(workflow_id),
                check_step(step),
                check_text(agent_id, "agent_id"),
                AgentStatus.COMPLETED,
                state,
                None,
                utcnow(),
                metadata,
                self._app_version,
            )
        )
        if lease is not None:
            fence_token(lease, workflow_id)
            self._records.workflow_storage()
        info = self._info(agent_id, "completed") if self._keeps_records else None
        saving = self._codec.save_owned(fields, lease, info)
        if saving is None:
            return self.create_checkpoint(
                workflow_id, step, agent_id, "completed", state, metadata=metadata, lease=lease
            )
        return saving

    def _info(self, agent_id: str, status: str) -> StepInfo:
        """A save's StepInfo: one per agent id and status (up to :data:`_INFOS` of them)."""
        key = (agent_id, status)
        info = self._infos.get(key)
        if info is None:
            info = _step_info((agent_id, status, self._kind, None))
            if len(self._infos) < _INFOS:
                self._infos[key] = info
        return info

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
        check_text(agent_id, "agent_id")
        agent_status = check_agent_status(status)
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
        workflow records; where events are kept, that first save appends its ``forked``
        event in its own transaction, so the fork and its event are stored together.
        """
        self._check_open()
        source_id, new_id = check_workflow_id(source_id), check_workflow_id(new_id)
        step = check_step(step)
        self._drive(new_id)  # no block of this manager starts it while it is being copied
        try:
            return await self._fork(source_id, step, new_id)
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
                # The fork step, written first, creates the record with its ``forked`` event.
                first = copied == 0 and record is page[0] and history.keeps_events(storage)
                info = await self._fork_info(source_id, record) if first else None
                await self._codec.fork(source_id, record, new_id, info)
            copied += len(page)
            cursor = page[-1].step
        return copied

    async def _fork_info(self, source_id: str, stored: StoredCheckpoint) -> StepInfo:
        """The fork step's StepInfo: its agent, and the ``forked`` event its save appends."""
        checkpoint = await self._codec.decode(source_id, stored, "stored")
        note = history.forked_note(source_id, stored.step)
        return StepInfo(checkpoint.agent_id, checkpoint.status.value, None, note)

    def _drive(self, workflow_id: str) -> None:
        """Become the one driver of ``workflow_id``; WorkflowBusyError if it has one."""
        if workflow_id in self._drivers:
            raise WorkflowBusyError(workflow_id)
        self._drivers.add(workflow_id)

    def _undrive(self, workflow_id: str) -> None:
        self._drivers.discard(workflow_id)

    async def close(self) -> None:
        """Close the storage. Calling it again does nothing."""
        if not self._closed:
            self._closed = True
            self._sweeper.stop()
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


#: The most (agent id, status) pairs whose StepInfo the saves keep.
_INFOS = 64

#: A :class:`StepInfo` from the tuple of its fields, without NamedTuple's ``__new__`` frame.
_step_info: Callable[[tuple[str, str, str | None, None]], StepInfo] = functools.partial(
    tuple.__new__, StepInfo
)


def _metrics_fields(metrics: ExecutionMetrics | None) -> dict[str, Any] | None:
    """A copy of ``metrics``' fields (None for None): independent, every field is immutable."""
    if metrics is None:
        return None
    if not isinstance(metrics, ExecutionMetrics):
        raise InvalidArgumentError(
            f"metrics must be ExecutionMetrics or None, not {type(metrics).__qualname__}"
        )
    return dict(metrics.__dict__)
