"""The storage protocol: the one seam every backend implements.

A backend moves opaque, already-encoded records (``bytes``) keyed by ``(workflow_id, step)``.
It never sees states or checkpoints: the :class:`~aiocheckpoint.CheckpointManager` owns
validation, encoding, checksums and the retention policy, so every backend gets them right
in the same way. The manager validates ids and steps before calling a backend, but backends
must still treat ids as arbitrary text (they may contain ``/``, ``..``, quotes, any script).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar, overload, runtime_checkable

from typing_extensions import Self

from ..errors import InvalidArgumentError, StorageClosedError
from ..format.limits import DEFAULT_MAX_RECORD_BYTES
from ..leases import Lease, WorkflowRecord, WorkflowStatus
from .queries import StepInfo, WorkflowQuery

if TYPE_CHECKING:
    from ..format.tree import SplitResult, TreeParams

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "BaseStorage",
    "BlobCheckpointStorage",
    "BlobReads",
    "CheckedSave",
    "CheckpointStorage",
    "CompactingStorage",
    "StepInfo",
    "StoredCheckpoint",
    "WorkflowQuery",
    "EffectListingStorage",
    "InDoubtPagingStorage",
    "EffectStorage",
    "MAX_EFFECTS_PER_STEP",
    "StoredEffect",
    "WorkflowControlStorage",
    "History",
    "HistoryRecords",
    "Cut",
    "SweepStorage",
    "SpaceReclaimingStorage",
    "histories_to_read",
    "WorkflowStorage",
    "check_blob_sizes",
    "check_effect_key",
    "check_max_record_bytes",
    "check_record_size",
    "workflow_traces",
]


#: A store's ``save`` of a checked version-1 record, offered by ``checked_saves()`` (optional;
#: SQLite's): ``(workflow_id, step, data, keep_last, step_info)``, the id and step already
#: validated by the manager, no lease. Returns the future that completes when ``save``
#: would return: no coroutine of the store's per waiting save (docs/performance.md).
CheckedSave = Callable[[str, int, bytes, "int | None", StepInfo], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """One stored record: its step and its encoded bytes."""

    step: int
    data: bytes


@runtime_checkable
class CheckpointStorage(Protocol):
    """An async store of encoded checkpoint records.

    Contract (the conformance suite in :mod:`aiocheckpoint.testing` checks every point):

    * ``save`` is atomic and durable: when it returns the record survives a crash of the
      process (and, for durable backends, of the machine); a crash before it returns leaves
      the previous record of that step, if any, intact. Saving an existing step replaces it.
      With ``keep_last=N`` the backend then deletes all but the N highest steps of that
      workflow, in the same transaction where it has transactions.
    * ``load(wf)`` returns the record with the highest step, ``load(wf, step)`` that step;
      both return ``None`` when there is none. Neither may read the whole history.
    * ``scan`` returns records ordered by step (descending if asked), restricted to
      ``after < step < before``, at most ``limit`` of them.
    * ``delete(wf, step)`` / ``delete(wf)`` return whether anything was deleted.
    * ``list_workflows`` returns every workflow id that has at least one record, sorted.
    * After ``close`` every method raises :class:`~aiocheckpoint.StorageClosedError`;
      ``close`` itself may be called again. ``async with`` closes on exit.
    * Driver and OS errors surface as :class:`~aiocheckpoint.CheckpointError` subclasses.
    """

    async def save(
        self, workflow_id: str, step: int, data: bytes, *, keep_last: int | None = None
    ) -> None:
        """Store ``data`` as ``step`` of ``workflow_id``, then apply ``keep_last``."""
        ...

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest step when ``step`` is None), or None."""
        ...

    async def scan(
        self,
        workflow_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[StoredCheckpoint]:
        """Return records with ``after < step < before``, ordered by step, at most ``limit``."""
        ...

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step, when ``step`` is None) is stored."""
        ...

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow when ``step`` is None."""
        ...

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted."""
        ...

    async def close(self) -> None:
        """Release resources; later calls raise :class:`~aiocheckpoint.StorageClosedError`."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class WorkflowStorage(CheckpointStorage, Protocol):
    """A storage that also keeps workflow records and leases.

    Contract (checked by :class:`aiocheckpoint.testing.WorkflowStorageConformance`):

    * ``save`` creates an UNFINISHED record for a workflow that has none, in the same
      transaction; it never changes an existing record's status. With ``fence=lease`` the
      save is refused with ``LeaseLostError`` unless ``lease.token`` is the workflow's
      current fencing token (checked in the same transaction as the write).
    * ``delete(workflow_id)`` (the whole workflow) also deletes its record and lease.
      ``delete_workflow(workflow_id, updated_at=t)`` does that only if the record's
      ``updated_at`` is still ``t`` and no live lease holds it, checked in the delete's
      transaction, and returns the bytes of the checkpoint records it deleted (None: it
      deleted nothing). Every change to a record moves its ``updated_at``.
    * ``acquire_lease`` grants the lease when it is free, expired, or already held by the same
      owner, incrementing the fencing token; otherwise it raises ``LeaseHeldError``. It creates
      an UNFINISHED record when there is none.
    * ``renew_lease`` extends a lease whose token is still current (even if it had expired,
      as long as nobody took it over); otherwise ``LeaseLostError``.
    * ``release_lease`` frees a lease whose token is current; a stale lease is ignored.
    * ``claim_next_workflow`` atomically grants the lease of one UNFINISHED workflow whose
      lease is free or expired and whose ``retry_at`` (if any) has passed (oldest record
      first), or returns None. Concurrent claimers never get the same workflow. PAUSED,
      FINISHED and FAILED workflows are never claimed, nor any record whose ``kind`` is
      not ``"workflow"``.
    * Expiry and backoff are judged by the storage's clock (the database server's, where
      there is one).
    * ``save(..., step_info=info)`` (and ``save_tree``) also sets the record's
      ``latest_step``, ``latest_agent_id`` and ``latest_agent_status`` when ``step`` is at
      least its ``latest_step``, sets ``updated_at``, and clears ``resume_input``: all in the
      write's transaction. A new record takes ``info.kind`` (``"workflow"`` when None); an
      existing record of kind ``"workflow"`` takes a ``info.kind`` that is not None, and a
      record of any other kind keeps it.
    * ``query_workflow_records`` and ``list_workflow_records`` return records of every
      kind unless ``query.kind`` names one.
    * ``register_workflow`` creates an UNFINISHED record when there is none and, with
      ``metadata``, replaces the record's metadata; its ``kind`` is set as a save's
      ``info.kind`` is (checked by :func:`~aiocheckpoint.leases.check_kind`).
      ``resume_workflow`` turns a PAUSED workflow UNFINISHED and stores ``resume_input``
      (JSON text) with it; any other status raises
      :class:`~aiocheckpoint.InvalidArgumentError`, no record
      :class:`~aiocheckpoint.CheckpointNotFoundError`.
    * ``record_failure`` counts a failed run (``attempts + 1``) and stores its error; while
      ``attempts <= len(retry_delays)`` the workflow goes back to UNFINISHED with
      ``retry_at = now + retry_delays[attempts - 1]``, else it is FAILED.
    * ``query_workflow_records`` returns the records that pass a :class:`WorkflowQuery`,
      ordered by workflow id, at most ``limit``; a filter on status, agent status or one
      metadata key costs about the page, not the number of workflows (databases index it).
    """

    async def save(
        self,
        workflow_id: str,
        step: int,
        data: bytes,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
        step_info: StepInfo | None = None,
    ) -> None:
        """Store a record, as in :class:`CheckpointStorage`, optionally fenced by a lease."""
        ...

    async def delete_workflow(self, workflow_id: str, *, updated_at: datetime) -> int | None:
        """Delete the workflow whole if its record is untouched since ``updated_at``."""
        ...

    async def register_workflow(
        self, workflow_id: str, *, metadata: str | None = None, kind: str | None = None
    ) -> WorkflowRecord:
        """Create the record if missing; with ``metadata`` (JSON text of an object), set it.

        ``kind`` as in ``save(..., step_info=StepInfo(..., kind))``.
        """
        ...

    async def resume_workflow(self, workflow_id: str, resume_input: str) -> WorkflowRecord:
        """Make a PAUSED workflow claimable, with ``resume_input`` (JSON text) for its next run."""
        ...

    async def record_failure(
        self,
        workflow_id: str,
        error: str,
        *,
        retry_delays: tuple[float, ...] = (),
        fence: Lease | None = None,
    ) -> WorkflowRecord:
        """Count a failed run, store ``error`` (JSON text): retry it later, or mark it FAILED."""
        ...

    async def query_workflow_records(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        """The records passing ``query``, ordered by workflow id, at most ``query.limit``."""
        ...

    async def set_workflow_status(
        self, workflow_id: str, status: WorkflowStatus, *, fence: Lease | None = None
    ) -> WorkflowRecord:
        """Create or update the workflow's record with ``status``."""
        ...

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        ...

    async def list_workflow_records(
        self, status: WorkflowStatus | None = None
    ) -> list[WorkflowRecord]:
        """Records ordered by workflow id, optionally only those with ``status``."""
        ...

    async def acquire_lease(self, workflow_id: str, owner: str, ttl: float) -> Lease:
        """Grant the workflow's lease to ``owner`` for ``ttl`` seconds."""
        ...

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend a current lease by ``ttl`` seconds from now."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give a lease up early."""
        ...

    async def claim_next_workflow(self, owner: str, ttl: float) -> Lease | None:
        """Lease the next unfinished workflow whose lease is free or expired."""
        ...


@runtime_checkable
class WorkflowControlStorage(WorkflowStorage, Protocol):
    """A workflow storage whose operators can cancel and retry workflows.

    Contract (checked by :class:`aiocheckpoint.testing.WorkflowControlConformance`):

    * ``cancel_workflow`` turns an UNFINISHED or PAUSED workflow CANCELLED, stores
      ``{"type": "WorkflowCancelledError", "message": reason}`` as its ``last_error``, sets
      ``finished_at``, clears ``retry_at`` and revokes its lease (a new fencing token, no
      owner), all in one transaction: every write fenced by the old lease then fails with
      ``LeaseLostError``. Any other status raises
      :class:`~aiocheckpoint.InvalidArgumentError`, no record
      :class:`~aiocheckpoint.CheckpointNotFoundError`; nothing changes.
    * ``retry_workflow`` turns a FAILED or CANCELLED workflow UNFINISHED with ``attempts``
      0 and no ``retry_at`` or ``finished_at`` (``last_error`` stays, as history); other
      statuses and missing records are refused as for a cancel.
    * ``claim_next_workflow`` never hands out a CANCELLED workflow.
    """

    async def cancel_workflow(self, workflow_id: str, reason: str | None) -> WorkflowRecord:
        """Cancel an UNFINISHED or PAUSED workflow and revoke its lease."""
        ...

    async def retry_workflow(self, workflow_id: str) -> WorkflowRecord:
        """Make a FAILED or CANCELLED workflow claimable again, attempts back to 0."""
        ...


@runtime_checkable
class BlobCheckpointStorage(CheckpointStorage, Protocol):
    """A storage that also keeps content-addressed blobs: incremental (version-2) checkpoints.

    The :class:`~aiocheckpoint.CheckpointManager` uses it, when present, to store a large
    state as a tree of blobs shared between checkpoints (see ``docs/incremental.md``);
    small states still go through :meth:`CheckpointStorage.save` as version-1 records, and
    ``load``/``scan`` return records of either version. Contract:

    * ``save_tree`` stores every blob of ``split.blobs`` and then the record, such that a
      crash at any point never leaves a durable record whose blobs are not all durable
      (files: blobs fsynced before the record; databases: one transaction). Blobs already
      stored are kept (same hash, same content). ``keep_last`` and replacement of an
      existing step behave as in ``save``.
    * ``fetch_blobs(hashes)`` returns ``{hash: stored blob}`` for the hashes it has;
      missing ones are simply absent (the reader reports them as corruption). The manager
      calls it once per tree level.
    * ``collect_garbage()`` frees blobs no record references any more and returns how many
      it freed. Stores that free blobs as records go (reference counts) return 0.
      Deleting records (``delete``, ``keep_last``) must never free a blob that a
      remaining record, or a ``save_tree`` running concurrently, still needs.
    * ``blob_params`` says how the store cuts states (compression, digest size).
    """

    @property
    def blob_params(self) -> TreeParams:
        """How this store cuts states into blobs."""
        ...

    async def save_tree(
        self,
        workflow_id: str,
        step: int,
        record: bytes,
        split: SplitResult,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
        step_info: StepInfo | None = None,
    ) -> None:
        """Store ``split``'s blobs, then the version-2 ``record`` that references them.

        ``fence`` and ``step_info`` are for stores that are also :class:`WorkflowStorage`
        (as in its ``save``); others ignore ``step_info`` and raise
        :class:`~aiocheckpoint.UnsupportedOperationError` for ``fence``.
        """
        ...

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes`` (one batch: one tree level)."""
        ...

    async def collect_garbage(self) -> int:
        """Free unreferenced blobs; return how many were freed."""
        ...


_T = TypeVar("_T")
#: ``fetch(hashes) -> {hash: stored blob}``, a blocking call (see :class:`BlobReads`).
BlobFetch = Callable[[Collection[bytes]], Mapping[bytes, bytes]]


@runtime_checkable
class BlobReads(Protocol):
    """A blob store that can run a whole tree read in one of its own threads (optional).

    ``read_blobs_in_thread(fn)`` calls ``fn(fetch)`` in a worker thread, where
    ``fetch(hashes)`` answers like :meth:`BlobCheckpointStorage.fetch_blobs` without
    leaving that thread, from one consistent view of the store where it has transactions.
    The manager decodes a tree this way: every level of the tree is fetched, and the state
    parsed, without a hop back to the event loop per level. Errors of the store surface
    as in ``fetch_blobs``; whatever ``fn`` raises is raised.
    """

    async def read_blobs_in_thread(self, fn: Callable[[BlobFetch], _T]) -> _T:
        """Return ``fn(fetch)``, run in a worker thread with a blocking blob ``fetch``."""
        ...


@dataclass(frozen=True, slots=True)
class History:
    """What a batched sweep reads of one workflow's history (:class:`SweepStorage`).

    ``count`` checkpoints, the lowest at step ``oldest``; ``orphans`` says whether it has
    effect records of steps below ``oldest``, ``paused`` whether its workflow record says
    PAUSED, ``kind`` its record's kind (None without a record: on a store without records,
    always). ``records`` holds every checkpoint as a ``(step, bytes)`` pair, newest
    first, when it was read (the stores give :class:`HistoryRecords`); None when it was not
    (``count`` at most the sweep's window, more than one read's share, or a record over
    ``max_record_bytes``): the sweep then reads it a page at a time with ``scan``.
    """

    workflow_id: str
    count: int
    oldest: int
    orphans: bool
    paused: bool
    kind: str | None
    records: Sequence[tuple[int, bytes]] | None


class HistoryRecords(Sequence[tuple[int, bytes]]):
    """A history's records as ``(step, bytes)`` pairs, each pair made only when read.

    Held as two flat tuples, not :class:`StoredCheckpoint` objects nor a tuple of pairs:
    the garbage collector stops tracking a tuple of ints or of bytes at its first pass, so
    a page's records never reach its oldest generation, whose growth sets off full
    collections (each walks the whole heap, holding up the loop and every thread). A pair
    per record was also most of what a sweep's read made for the collector to count, each
    ~700 a young collection promoting whatever else was alive (``bench/NOTES.md``).
    """

    __slots__ = ("data", "steps")

    def __init__(self, steps: tuple[int, ...], data: tuple[bytes, ...]) -> None:
        if len(steps) != len(data):
            raise ValueError(f"{len(steps)} steps for {len(data)} records")
        #: The steps, and each one's record, in the same order.
        self.steps = steps
        self.data = data

    @classmethod
    def newest_first(cls, steps: Sequence[int], data: Sequence[bytes]) -> HistoryRecords:
        """The records of ``steps`` (distinct, in any order), sorted newest first."""
        order = sorted(range(len(steps)), key=steps.__getitem__, reverse=True)
        return cls(tuple([steps[i] for i in order]), tuple([data[i] for i in order]))

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return zip(self.steps, self.data, strict=True)

    @overload
    def __getitem__(self, index: int) -> tuple[int, bytes]: ...

    @overload
    def __getitem__(self, index: slice) -> HistoryRecords: ...

    def __getitem__(self, index: int | slice) -> tuple[int, bytes] | HistoryRecords:
        if isinstance(index, slice):
            return HistoryRecords(self.steps[index], self.data[index])
        return self.steps[index], self.data[index]

    def __repr__(self) -> str:
        return f"HistoryRecords({tuple(self)!r})"


@dataclass(frozen=True, slots=True)
class Cut:
    """What a batched sweep deletes of one workflow: ``steps`` (with their effects).

    With ``below``, also the effect records of the steps below it that have no checkpoint
    (checked in the delete's transaction), as ``drop_orphan_effects`` does.
    """

    workflow_id: str
    steps: tuple[int, ...]
    below: int | None = None


def histories_to_read(
    sizes: Mapping[str, tuple[int, int]], more_than: int, max_records: int, max_bytes: int
) -> list[str]:
    """The workflows to read of ``sizes`` (``workflow_id: (records, bytes)``).

    Those with more than ``more_than`` records, in ``sizes``' order, while they fit in
    ``max_records`` records and ``max_bytes`` bytes: what one batched read of
    :meth:`SweepStorage.histories` fetches.
    """
    wanted: list[str] = []
    records, size = max_records, max_bytes
    for workflow_id, (count, total) in sizes.items():
        if more_than < count <= records and total <= size:
            wanted.append(workflow_id)
            records -= count
            size -= total
    return wanted


@runtime_checkable
class SweepStorage(Protocol):
    """A store that sweeps a batch of workflows per statement and commit (optional).

    A sweep uses these where the store has them, else the per-workflow calls
    (``scan``, ``delete``, ``drop_orphan_effects``, ``delete_workflow``), with the same
    outcome. Contract (checked by :class:`aiocheckpoint.testing.RetentionConformance`):

    * ``histories(after=id, limit=L, more_than=N, max_records=M, max_bytes=B)`` reads, in
      one consistent view, a :class:`History` of each of the next L workflows with
      checkpoints in id order, after ``after`` (from the first when None): an index walk.
      It reads the records of those with more than N, while they fit in M records and B
      bytes (:func:`histories_to_read`). Rows the library could not have written are
      passed over; an empty list ends the walk.
    * ``thin_many(cuts)`` deletes every cut, each whole in one transaction: each step
      with its effects and the blob references only it held, and the orphaned effects
      below ``below``. It returns the ``(workflow_id, step)`` pairs it deleted and how
      many orphaned effect records went.
    * ``delete_workflows(pairs)`` is ``delete_workflow(workflow_id, updated_at=...)`` for
      each pair: each goes only if its record is untouched since ``updated_at`` and no
      live lease holds it. It returns, in order, each one's checkpoint bytes, or None
      where nothing was deleted.

    Either may commit a batch in one transaction (PostgreSQL: one statement) or in a few
    (SQLite: slices of a few milliseconds each, so the writes queued behind one go first);
    what one transaction committed stays if a later one fails.
    """

    async def histories(
        self,
        *,
        after: str | None,
        limit: int,
        more_than: int,
        max_records: int,
        max_bytes: int,
    ) -> list[History]:
        """The next ``limit`` workflows' histories after ``after``, in id order."""
        ...

    async def thin_many(self, cuts: Sequence[Cut]) -> tuple[list[tuple[str, int]], int]:
        """Delete every cut (each in one transaction); the steps deleted and orphans dropped."""
        ...

    async def delete_workflows(self, pairs: Sequence[tuple[str, datetime]]) -> list[int | None]:
        """Delete each workflow untouched since its ``updated_at`` (each in one transaction)."""
        ...


@runtime_checkable
class SpaceReclaimingStorage(Protocol):
    """A store that gives the space deletes freed back to the filesystem (optional).

    A sweep that deleted anything calls ``reclaim_space()`` last; it returns the bytes
    given back, and holds writers up no longer than a short write does (SQLite: an
    incremental vacuum, a slice of pages per transaction).
    """

    async def reclaim_space(self) -> int:
        """Give freed space back; the bytes given back."""
        ...


@runtime_checkable
class CompactingStorage(Protocol):
    """A store that can be rewritten to give back all the space it does not use (optional).

    ``compact()`` returns the store's bytes before and after (``aiocheckpoint compact``).
    """

    async def compact(self) -> tuple[int, int]:
        """Rewrite or vacuum the store whole; its bytes before and after."""
        ...


#: The most effects one step may record; ``load_effects`` reads no more than this.
MAX_EFFECTS_PER_STEP = 1000
#: The longest effect key, in UTF-8 bytes.
_MAX_KEY_BYTES = 255


@dataclass(frozen=True, slots=True)
class StoredEffect:
    """One stored effect record: its step, its key, whether it is in doubt, its bytes."""

    step: int
    key: str
    in_doubt: bool
    data: bytes


@runtime_checkable
class EffectStorage(Protocol):
    """A storage that also keeps an effect journal: durable effects (``docs/effects.md``).

    Each step of a workflow has at most one record per effect key; the manager encodes
    the records, the storage keeps them as opaque bytes with their ``in_doubt`` flag.
    Contract (checked by :class:`aiocheckpoint.testing.EffectStorageConformance`):

    * ``put_effect`` is durable when it returns, like ``save``, and shares its group
      commit where the store has one. Putting an existing ``(step, key)`` replaces it.
      With ``fence=lease`` it is refused with ``LeaseLostError`` unless the lease is
      current (stores without leases raise ``UnsupportedOperationError`` for a fence).
    * ``load_effects(wf, step)`` returns that step's records ordered by key, at most
      :data:`MAX_EFFECTS_PER_STEP`; a record over ``max_record_bytes`` raises
      ``CheckpointCorruptedError``.
    * An effect's records go with its step's checkpoint, in the same write: the steps
      that ``keep_last`` retention deletes lose their effects, ``delete(wf, step)`` deletes
      the step's effects (even when it has no checkpoint), ``delete(wf)`` all of the
      workflow's. Replacing a step's checkpoint keeps its effects.
    * ``in_doubt_workflows`` lists, sorted, every workflow with a record put with
      ``in_doubt=True`` and not replaced since; ``in_doubt_effects(wf)`` returns those
      records of one workflow, ordered by step then key, at most
      :data:`MAX_EFFECTS_PER_STEP` (an oversized one raises ``CheckpointCorruptedError``).
    * ``has_effects(wf)`` says whether the workflow has any effect record (any step, in
      doubt or not), at the cost of one indexed lookup.
    * ``drop_orphan_effects(wf, below)`` deletes the records of the steps below ``below``
      that have no checkpoint (checked in the delete's transaction, or under the
      workflow's lock) and returns how many it deleted: retention's cleanup under the
      oldest checkpoint it keeps. A store that keeps events
      (:class:`~aiocheckpoint.storage.events.EventStorage`) deletes the workflow's events
      of the steps below ``below`` with them, uncounted (so does ``thin_many`` for each
      cut with a ``below``).
    """

    async def put_effect(
        self,
        workflow_id: str,
        step: int,
        key: str,
        data: bytes,
        *,
        in_doubt: bool,
        fence: Lease | None = None,
    ) -> None:
        """Durably store an effect record of ``step``, replacing the key's earlier one."""
        ...

    async def load_effects(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """The effect records of one step, ordered by key."""
        ...

    async def in_doubt_workflows(self) -> list[str]:
        """Every workflow that has an effect in doubt, sorted."""
        ...

    async def in_doubt_effects(self, workflow_id: str) -> list[StoredEffect]:
        """The workflow's effect records in doubt, ordered by step then key."""
        ...

    async def drop_orphan_effects(self, workflow_id: str, below: int) -> int:
        """Delete the effect records of steps below ``below`` without a checkpoint."""
        ...

    async def has_effects(self, workflow_id: str) -> bool:
        """Whether the workflow has any effect record."""
        ...


async def workflow_traces(storage: CheckpointStorage, workflow_id: str) -> str | None:
    """What ``storage`` holds of the workflow, or None when nothing.

    The first found of "checkpoints", "a workflow record" and "effect records".
    """
    if await storage.exists(workflow_id):
        return "checkpoints"
    if isinstance(storage, WorkflowStorage) and await storage.get_workflow(workflow_id):
        return "a workflow record"
    if isinstance(storage, EffectStorage) and await storage.has_effects(workflow_id):
        return "effect records"
    return None


@runtime_checkable
class EffectListingStorage(EffectStorage, Protocol):
    """An effect journal that can list itself whole: what ``copy`` and ``export`` carry.

    Contract (checked by :class:`aiocheckpoint.testing.EffectListingConformance`):

    * ``effect_workflows`` lists, sorted, every workflow with at least one effect record,
      whether or not it has a checkpoint or a workflow record.
    * ``effect_steps(wf)`` lists, ascending, every step of ``wf`` with at least one effect
      record, whether or not the step has a checkpoint (a crash inside a step leaves
      exactly that); a step whose records were all deleted is not listed.
    """

    async def effect_workflows(self) -> list[str]:
        """Every workflow with an effect record, sorted."""
        ...

    async def effect_steps(self, workflow_id: str) -> list[int]:
        """The steps of ``workflow_id`` with effect records, ascending."""
        ...


@runtime_checkable
class InDoubtPagingStorage(EffectStorage, Protocol):
    """An effect journal that lists its workflows in doubt a page at a time.

    ``in_doubt_page(after, limit)`` returns, sorted, the first ``limit`` of the ids that
    ``in_doubt_workflows`` lists and that sort after ``after`` (from the first when None),
    reading no more than that: what the web inspector shows. SQLite and PostgreSQL read a
    range of their partial index.
    """

    async def in_doubt_page(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` workflows with an effect in doubt whose ids sort after ``after``."""
        ...


def check_effect_key(key: object) -> str:
    """An effect key: a non-empty str of at most 255 UTF-8 bytes without NUL."""
    if not isinstance(key, str) or not key or "\x00" in key:
        raise InvalidArgumentError(
            f"an effect key must be a non-empty str without NUL, got {key!r}"
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError("an effect key is not valid Unicode text") from None
    if size > _MAX_KEY_BYTES:
        raise InvalidArgumentError(f"an effect key is at most {_MAX_KEY_BYTES} UTF-8 bytes")
    return key


def check_max_record_bytes(value: object) -> int:
    """Validate a backend's ``max_record_bytes`` option (an int >= 1)."""
    if type(value) is not int or value < 1:
        raise InvalidArgumentError(f"max_record_bytes must be an int >= 1, got {value!r}")
    return value


def check_record_size(data: bytes, limit: int) -> None:
    """Refuse to store a record over ``limit`` bytes, the same way in every backend."""
    _check_size(len(data), limit)


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise InvalidArgumentError(
            f"the encoded record is {size} bytes, over this store's max_record_bytes ({limit})"
        )


def check_blob_sizes(split: SplitResult, limit: int) -> None:
    """:func:`check_record_size` of the largest blob of ``split``.

    A split counts it as it makes and adopts its blobs; one built without it costs a pass in
    C over its blobs.
    """
    _check_size(split.largest_blob(), limit)


class BaseStorage:
    """Lifecycle helpers shared by the bundled backends: ``async with`` and the closed check."""

    _closed: bool = False
    #: The system's name in telemetry: OpenTelemetry's ``db.system.name`` attribute.
    db_system: str = "other"
    #: Backends set their own limit here (or override :attr:`max_record_bytes`).
    _max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    @property
    def max_record_bytes(self) -> int:
        """The largest record this store writes or reads.

        The manager bounds a version-2 record's tree by it too (the state's text and the
        blobs a read holds), so that a store's contents cannot make a reader allocate more.
        """
        return self._max_record_bytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError(f"{type(self).__name__} is closed")

    async def close(self) -> None:
        """Mark the storage closed. Backends extend this to release their resources."""
        self._closed = True

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
