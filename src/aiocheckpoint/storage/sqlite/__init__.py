"""SQLiteCheckpointStorage: every workflow's checkpoints in one SQLite database file.

The embedded default backend. Writes go through one writer thread that commits queued
writes together (group commit: one transaction and one fsync for many callers); reads run
on separate connections in their own threads, so they never wait behind the write queue.
See ``docs/sqlite-storage.md`` for the schema, the durability setting and the design.

Workflow records and leases (:class:`~aiocheckpoint.storage.base.WorkflowStorage`) live in a
``workflows`` table. Lease operations run in the writer thread's ``BEGIN IMMEDIATE``
transactions, so SQLite's single write lock makes claims atomic across processes; expiry is
judged by this host's clock (``time.time()``). A fenced save is checked in its batch's
transaction, and a stale one fails only its own caller. See docs/leases.md.

Large states are stored incrementally
(:class:`~aiocheckpoint.storage.base.BlobCheckpointStorage`): content-addressed blobs in a
``blobs`` table with reference counts kept in the same transaction as the record
(docs/incremental.md §8), so blobs go as the records that use them go and a crash never
leaves a record without its blobs.

The package, one module per job: ``groupcommit`` (the event loop's half of the write
queue), ``writer`` (the writer thread: open, batches), ``readers`` (the read
connections and queries), ``walcheckpoint`` (WAL checkpoints), ``records``
(workflow records and leases), ``blobs`` (blobs and their reference counts),
``schema`` (versions and migrations), ``sql`` (the statements on the checkpoints
table), ``connections`` (opening the file, busy retries, error mapping) and ``foreign``
(rows the library could not have written).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ..._validation import (
    check_limit,
    check_optional_step,
    check_save,
    check_step,
    check_workflow_id,
)
from ...errors import InvalidArgumentError, StorageFullError
from ...format import SplitResult, TreeParams
from ...leases import (
    Lease,
    WorkflowRecord,
    WorkflowStatus,
    check_kind,
    check_ttl,
    fence_token,
)
from ..base import (
    DEFAULT_MAX_RECORD_BYTES,
    BaseStorage,
    BlobFetch,
    CheckedSave,
    Cut,
    History,
    StoredCheckpoint,
    StoredEffect,
    check_effect_key,
    check_record_size,
)
from ..events import (
    MAX_EVENT_PAGE,
    EventNote,
    Reseal,
    StoredEvent,
    check_event_page,
    check_events,
    check_reseals,
    check_sleep,
)
from ..queries import StepInfo, WorkflowQuery
from ..refcounts import checked_tree, held_root_refs
from ..turns import in_turns
from . import control, effects, records, sweeps
from . import events as event_rows
from .blobs import SaveTreeOp, drain_releases, in_one_read, read_blobs, recount
from .connections import BusyRetry
from .foreign import ForeignRow
from .groupcommit import GroupCommit
from .readers import (
    ReaderPool,
    foreign_checkpoints,
    read_exists,
    read_one,
    read_scan,
    read_workflows,
)
from .walcheckpoint import Checkpointer
from .writer import DeleteOp, Op, RecordOp, SaveOp, Writer, delete_untouched, make_save_op

__all__ = ["ForeignRow", "SQLiteCheckpointStorage"]

T = TypeVar("T")


class SQLiteCheckpointStorage(GroupCommit, BaseStorage):
    """Checkpoints in a SQLite database (WAL, ``synchronous=FULL``), with group commit.

    ``path`` is the database file; it and its parent directories are created on first use
    (a new file is owner-only, 0600, and so are its -wal and -shm files). Nothing touches
    the disk before the first operation (or :meth:`open`).

    * ``max_record_bytes``: larger records are refused on save
      (:class:`~aiocheckpoint.InvalidArgumentError`) and on read
      (:class:`~aiocheckpoint.CheckpointCorruptedError`, without fetching the blob).
    * ``busy_timeout``: seconds SQLite waits for another process's lock before each retry;
      ``busy_retries`` more attempts follow with backoff before the call fails with
      :class:`~aiocheckpoint.StorageBackendError`.
    * ``readers``: threads (each with its own connection) serving reads.
    * ``max_batch``: the most writes committed in one transaction.
    * ``blob_params``: how large states are cut into blobs
      (:class:`~aiocheckpoint.format.tree.TreeParams`; ``compression="zstd"`` compresses them).
    * ``allow_shared``: open the file even if another user owns it, or group or others may
      read or write it (or its -wal or -shm). By default such a file is refused with
      :class:`~aiocheckpoint.errors.StoragePermissionError`: it may have been planted to
      feed this process forged state or to read what it writes. For deliberately shared
      setups only.

    A ``path`` whose name starts with ``file:`` is refused
    (:class:`~aiocheckpoint.InvalidArgumentError`): it is not a URI here, and SQLite would
    have read it as one.

    ``save`` returns once its transaction is committed and fsynced. A caller cancelled while
    its write is still queued removes it (nothing is written); once its batch is committing
    the write lands whole and the caller sees the cancellation. :meth:`close` commits
    queued writes before closing.
    """

    db_system = "sqlite"
    #: Its writes run in a thread that needs the GIL between each statement: a sweep's
    #: judging on the loop rests now and then to let it have it while saves are being
    #: written (``retention``, :meth:`saving_lately`).
    writes_in_threads = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        busy_timeout: float = 5.0,
        busy_retries: int = 10,
        readers: int = 2,
        max_batch: int = 512,
        blob_params: TreeParams | None = None,
        allow_shared: bool = False,
    ) -> None:
        for name, value, low in (
            ("max_record_bytes", max_record_bytes, 1),
            ("busy_retries", busy_retries, 0),
            ("readers", readers, 1),
            ("max_batch", max_batch, 1),
        ):
            if type(value) is not int or value < low:
                raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(busy_timeout, (int, float)) or busy_timeout < 0:
            raise InvalidArgumentError(f"busy_timeout must be seconds >= 0, got {busy_timeout!r}")
        if blob_params is not None and not isinstance(blob_params, TreeParams):
            raise InvalidArgumentError("blob_params must be a TreeParams or None")
        if not isinstance(allow_shared, bool):
            raise InvalidArgumentError(f"allow_shared must be a bool, got {allow_shared!r}")
        self._params = blob_params or TreeParams()
        self._path = _database_path(path)
        self._max_record_bytes = max_record_bytes
        retry = BusyRetry(busy_retries)
        # Absolute now: every connection, opened later in some thread, names the same file.
        file = self._path.absolute()
        self._readers = ReaderPool(file, float(busy_timeout), retry)
        self._read_threads = ThreadPoolExecutor(
            readers, thread_name_prefix="aiocheckpoint-sqlite-r"
        )
        GroupCommit.__init__(
            self,
            Writer(file, float(busy_timeout), retry, allow_shared=allow_shared),
            Checkpointer(file, float(busy_timeout)),
            max_batch,
        )

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def blob_params(self) -> TreeParams:
        """How this store cuts large states into blobs."""
        return self._params

    async def open(self) -> None:
        """Open the database now (create, configure, migrate); first use does it anyway."""
        self._check_open()
        await self._ensure_open()

    # --- writes: queued, committed in batches by one writer ------------------------------

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
        """Store ``data`` as ``step``, then keep the ``keep_last`` highest steps, atomically.

        The workflow gets an UNFINISHED record if it has none. With ``fence``, the write
        happens only if ``fence.token`` is the workflow's current fencing token; otherwise
        this call (and no other in its batch) raises :class:`~aiocheckpoint.LeaseLostError`.
        """
        self._check_open()
        workflow_id, step, keep_last = check_save(workflow_id, step, keep_last)
        data = bytes(data)
        check_record_size(data, self._max_record_bytes)
        token = None if fence is None else fence_token(fence, workflow_id)
        refs = held_root_refs(data)
        if refs:  # a version-2 record given whole (the blobs it names must be stored already)
            op: Op = SaveTreeOp(workflow_id, step, data, refs, None, keep_last, token, step_info)
        else:
            op = SaveOp(workflow_id, step, data, keep_last, token, step_info)
        await self._submit(op, len(data))

    def checked_saves(self) -> CheckedSave | None:
        """:meth:`save` for the record pipeline's checked saves (:class:`.base.CheckedSave`).

        None when a subclass replaces :meth:`save`: its own then runs for every save.
        """
        if type(self).save is not SQLiteCheckpointStorage.save:
            return None
        return self._checked_save

    def _checked_save(
        self, workflow_id: str, step: int, data: bytes, keep_last: int | None, info: StepInfo
    ) -> asyncio.Future[Any]:
        self._check_open()
        check_record_size(data, self._max_record_bytes)
        return self._submit(
            make_save_op((workflow_id, step, data, keep_last, None, info)), len(data)
        )

    # --- blobs (BlobCheckpointStorage) ----------------------------------------------------

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
        """Store ``split``'s new blobs, count references, store ``record``: one transaction.

        Goes through the same group commit as :meth:`save`, with the same ``keep_last``,
        ``fence`` and per-caller failure. Raises :class:`~aiocheckpoint.InvalidArgumentError`
        if ``record`` does not reference exactly ``split.root_refs``, or if a blob is neither
        stored nor in ``split.blobs`` (a split made with a stale ``known``); nothing is
        written then.
        """
        self._check_open()
        workflow_id, step, keep_last = check_save(workflow_id, step, keep_last)
        record = bytes(record)
        refs = checked_tree(record, split)
        check_record_size(record, self._max_record_bytes)
        token = None if fence is None else fence_token(fence, workflow_id)
        size = len(record) + split.stored_bytes()
        op = SaveTreeOp(workflow_id, step, record, refs, split, keep_last, token, step_info)
        await self._submit(op, size)

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes`` (a read connection, off the event loop)."""
        self._check_open()
        wanted = list(dict.fromkeys(bytes(h) for h in hashes))
        limit = self._max_record_bytes
        return await self._read(lambda conn: read_blobs(conn, wanted, limit))

    async def read_blobs_in_thread(self, fn: Callable[[BlobFetch], T]) -> T:
        """``fn(fetch)`` in a read thread, every fetch in one read transaction (BlobReads)."""
        self._check_open()
        limit = self._max_record_bytes
        return await self._read(lambda conn: in_one_read(conn, fn, limit))

    async def collect_garbage(self, *, full: bool = False) -> int:
        """Free blobs whose records were removed behind the store's back; usually 0.

        Blobs go in the transaction that removes their last record, so there is normally
        nothing to collect. A record deleted by other means (a ``DELETE`` in the sqlite3
        shell) queues its references through a trigger; they are released by the next
        write, or here. ``full=True`` also recomputes every count from the records and
        deletes the blobs no record reaches: the repair after a blob was deleted or damaged
        by hand (its children could not be released). It reads every reachable blob while
        holding the write lock.
        """
        self._check_open()
        fn = recount if full else drain_releases
        freed: int = await self._submit(
            RecordOp("garbage collection", lambda conn, _now: fn(conn)), 0
        )
        return freed

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow; return whether anything was deleted."""
        self._check_open()
        op = DeleteOp(check_workflow_id(workflow_id), check_optional_step(step))
        return bool(await self._submit(op, 0))

    async def delete_workflow(self, workflow_id: str, *, updated_at: datetime) -> int | None:
        """Delete the workflow whole if its record is untouched since ``updated_at``.

        Returns its checkpoint records' bytes, or None when nothing was deleted.
        """
        self._check_open()
        fn = functools.partial(
            delete_untouched, workflow_id=check_workflow_id(workflow_id), updated_at=updated_at
        )
        deleted: int | None = await self._submit(RecordOp("conditional delete", fn), 0)
        return deleted

    # --- batched sweeps (SweepStorage) ----------------------------------------------------

    async def histories(
        self,
        *,
        after: str | None,
        limit: int,
        more_than: int,
        max_records: int,
        max_bytes: int,
    ) -> list[History]:
        """The next ``limit`` histories after ``after``, in one read (``SweepStorage``)."""
        self._check_open()
        after = None if after is None else check_workflow_id(after)
        budget = (more_than, max_records, max_bytes)
        cap = self._max_record_bytes
        lately, held = self.saving_lately, self.saves_in_flight
        return await self._read(
            lambda conn: sweeps.read_histories(conn, after, limit, budget, cap, lately, held)
        )

    async def thin_many(self, cuts: Sequence[Cut]) -> tuple[list[tuple[str, int]], int]:
        """Delete every cut, in slices of the group commit (``SweepStorage``)."""
        self._check_open()
        checked = await in_turns(_checked_cut, cuts)
        done = await self._in_slices("sweep's thinning", checked, sweeps.thin_one)
        return [(wf, step) for wf, steps, _ in done for step in steps], sum(n for *_, n in done)

    async def delete_workflows(self, pairs: Sequence[tuple[str, datetime]]) -> list[int | None]:
        """Delete each untouched workflow whole, in slices of writes (``SweepStorage``)."""
        self._check_open()
        checked = await in_turns(_checked_pair, pairs)
        return await self._in_slices("sweep's deletes", checked, sweeps.delete_one)

    # --- space (SpaceReclaimingStorage) ----------------------------------------------------

    async def reclaim_space(self) -> int:
        """Give the pages deletes freed back to the filesystem; the bytes given back.

        In slices, like a sweep's deletes: background writes of the group commit, each
        ending once a write waits (after 1 ms) and committed without an fsync, so the writes
        queued while one ran go before the next. A store made before this version
        (``auto_vacuum=NONE``) gives nothing back: ``aiocheckpoint compact`` converts it.
        """
        self._check_open()
        await self._ensure_open()
        freed = 0
        with self._background():
            while True:
                op = RecordOp("incremental vacuum", self._writer.reclaim_slice(self._waiting), True)
                got, left = await self._submit(op, 0)
                freed += int(got)
                if not got or not left:
                    return freed

    async def compact(self) -> tuple[int, int]:
        """Rewrite the database whole (``VACUUM``): its bytes before and after.

        It then gives freed pages back after every sweep, whatever version made it. Writes
        wait until it is done, and it needs as much free disk as the database takes.
        """
        self._check_open()
        await self._ensure_open()
        await self._flush()
        done: tuple[int, int] = await self._in_thread(self._write_thread, self._writer.compact)
        return done

    # --- the effect journal (EffectStorage) ------------------------------------------------

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
        """Store an effect record of ``step``: in the group commit, like :meth:`save`."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        data = bytes(data)
        check_record_size(data, self._max_record_bytes)
        fn = functools.partial(
            effects.put,
            workflow_id=workflow_id,
            step=check_step(step),
            key=check_effect_key(key),
            data=data,
            in_doubt=bool(in_doubt),
            token=None if fence is None else fence_token(fence, workflow_id),
        )
        await self._submit(RecordOp("effect record", fn), len(data))

    async def load_effects(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """The effect records of ``step``, ordered by key (a read connection)."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        limit = self._max_record_bytes
        return await self._read(lambda conn: effects.read_effects(conn, workflow_id, step, limit))

    async def in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt, sorted (a partial index)."""
        self._check_open()
        return await self._read(effects.read_in_doubt)

    async def in_doubt_page(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` workflows in doubt after ``after``, sorted (a partial index range)."""
        self._check_open()
        size = check_limit(limit)
        start = None if after is None else check_workflow_id(after)
        return await self._read(lambda conn: effects.read_in_doubt_page(conn, start, size or 1))

    async def has_effects(self, workflow_id: str) -> bool:
        """Whether the workflow has any effect record (one index probe, a read connection)."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._read(lambda conn: effects.read_any(conn, workflow_id))

    async def in_doubt_effects(self, workflow_id: str) -> list[StoredEffect]:
        """The workflow's effect records in doubt, ordered by step then key (its index)."""
        self._check_open()
        check_workflow_id(workflow_id)
        limit = self._max_record_bytes
        return await self._read(
            lambda conn: effects.read_in_doubt_effects(conn, workflow_id, limit)
        )

    async def effect_workflows(self) -> list[str]:
        """Every workflow with at least one effect record, sorted (an index walk)."""
        self._check_open()
        return await self._read(effects.read_workflows)

    async def effect_steps(self, workflow_id: str) -> list[int]:
        """The steps of ``workflow_id`` with effect records, ascending (an index range)."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        return await self._read(lambda conn: effects.read_steps(conn, workflow_id))

    async def drop_orphan_effects(self, workflow_id: str, below: int) -> int:
        """Delete the effect records of steps below ``below`` without a checkpoint."""
        self._check_open()
        fn = functools.partial(
            effects.drop_orphans,
            workflow_id=check_workflow_id(workflow_id),
            below=check_step(below),
        )
        dropped: int = await self._submit(RecordOp("effect cleanup", fn), 0)
        return dropped

    # --- workflow records and leases (WorkflowStorage) ------------------------------------

    async def set_workflow_status(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        *,
        fence: Lease | None = None,
        note: EventNote | None = None,
    ) -> WorkflowRecord:
        """Create or update the workflow's record with ``status`` (fenced by ``fence``).

        Appends the change's event (``note``'s, when given) in the same transaction.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        status = WorkflowStatus(status)
        token = None if fence is None else fence_token(fence, workflow_id)
        fn = functools.partial(
            records.set_status, workflow_id=workflow_id, status=status, token=token, note=note
        )
        result: WorkflowRecord = await self._submit(RecordOp("status change", fn), 0)
        return result

    async def sleep_workflow(
        self, workflow_id: str, seconds: float, *, fence: Lease | None = None
    ) -> WorkflowRecord:
        """UNFINISHED, claimable ``seconds`` from now (this host's clock); ``sleeping``."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        token = None if fence is None else fence_token(fence, workflow_id)
        fn = functools.partial(
            records.sleep, workflow_id=workflow_id, seconds=check_sleep(seconds), token=token
        )
        return await self._record_op("sleep", fn)

    async def put_events(
        self, workflow_id: str, events: Sequence[StoredEvent], *, replace: bool
    ) -> None:
        """Append carried events as they are; ``replace``: drop the workflow's others first."""
        self._check_open()
        fn = functools.partial(
            event_rows.put,
            workflow_id=check_workflow_id(workflow_id),
            events=check_events(events),
            replace=bool(replace),
        )
        await self._submit(RecordOp("events", fn), 0)

    async def reseal(self, workflow_id: str, changes: Sequence[Reseal]) -> int:
        """Replace each change's text that still holds its ``old``; how many were replaced."""
        self._check_open()
        fn = functools.partial(
            event_rows.reseal,
            workflow_id=check_workflow_id(workflow_id),
            changes=check_reseals(changes),
        )
        done: int = await self._submit(RecordOp("reseal", fn), 0)
        return done

    async def get_events(
        self, workflow_id: str, *, after: int | None = None, limit: int = MAX_EVENT_PAGE
    ) -> list[StoredEvent]:
        """The workflow's events after sequence number ``after``, oldest first."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        after, limit = check_event_page(after, limit)
        return await self._read(lambda conn: event_rows.page(conn, workflow_id, after, limit))

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        return await self._read(lambda conn: records.read_record(conn, workflow_id))

    async def list_workflow_records(
        self, status: WorkflowStatus | None = None
    ) -> list[WorkflowRecord]:
        """Records ordered by workflow id, optionally only those with ``status``.

        A row that does not make a valid record (see :meth:`foreign_rows`) is skipped.
        """
        self._check_open()
        wanted = None if status is None else WorkflowStatus(status)
        return await self._read(lambda conn: records.read_records(conn, wanted))

    async def register_workflow(
        self, workflow_id: str, *, metadata: str | None = None, kind: str | None = None
    ) -> WorkflowRecord:
        """Create the record if missing; with ``metadata`` (JSON text), replace its metadata.

        A new record takes ``kind`` (``"workflow"`` when None); an existing record of the
        default kind takes a ``kind`` that is not None, one of any other kind keeps it.
        """
        self._check_open()
        fn = functools.partial(
            records.register,
            workflow_id=check_workflow_id(workflow_id),
            metadata=metadata,
            kind=None if kind is None else check_kind(kind),
        )
        return await self._record_op("registration", fn)

    async def resume_workflow(self, workflow_id: str, resume_input: str) -> WorkflowRecord:
        """Make a PAUSED workflow UNFINISHED, holding ``resume_input`` for its next run."""
        self._check_open()
        fn = functools.partial(
            records.resume, workflow_id=check_workflow_id(workflow_id), resume_input=resume_input
        )
        return await self._record_op("resume", fn)

    async def cancel_workflow(self, workflow_id: str, reason: str | None) -> WorkflowRecord:
        """Cancel an UNFINISHED or PAUSED workflow and revoke its lease (``lifecycle``)."""
        self._check_open()
        fn = functools.partial(
            control.cancel, workflow_id=check_workflow_id(workflow_id), reason=reason
        )
        return await self._record_op("cancel", fn)

    async def retry_workflow(self, workflow_id: str) -> WorkflowRecord:
        """Make a FAILED or CANCELLED workflow UNFINISHED with a fresh attempt budget."""
        self._check_open()
        fn = functools.partial(control.retry, workflow_id=check_workflow_id(workflow_id))
        return await self._record_op("retry", fn)

    async def record_failure(
        self,
        workflow_id: str,
        error: str,
        *,
        retry_delays: tuple[float, ...] = (),
        fence: Lease | None = None,
    ) -> WorkflowRecord:
        """Count a failed run and store ``error``; retry it after a delay, or mark it FAILED."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        token = None if fence is None else fence_token(fence, workflow_id)
        fn = functools.partial(
            records.fail,
            workflow_id=workflow_id,
            error=error,
            delays=tuple(retry_delays),
            token=token,
        )
        return await self._record_op("failure", fn)

    async def query_workflow_records(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        """The records passing ``query``, ordered by workflow id (indexed: see ``records``)."""
        self._check_open()
        return await self._read(lambda conn: records.query_records(conn, query))

    async def _record_op(self, what: str, fn: Callable[..., WorkflowRecord]) -> WorkflowRecord:
        result: WorkflowRecord = await self._submit(RecordOp(what, fn), 0)
        return result

    async def acquire_lease(self, workflow_id: str, owner: str, ttl: float) -> Lease:
        """Grant the lease if it is free, expired or already ``owner``'s (a new token)."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        fn = functools.partial(
            records.acquire, workflow_id=workflow_id, owner=owner, ttl=check_ttl(ttl)
        )
        lease: Lease = await self._submit(RecordOp("lease acquisition", fn), 0)
        return lease

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend a lease whose token is still current to ``ttl`` seconds from now."""
        self._check_open()
        fn = functools.partial(records.renew, lease=lease, ttl=check_ttl(ttl))
        renewed: Lease = await self._submit(RecordOp("lease renewal", fn), 0)
        return renewed

    async def release_lease(self, lease: Lease) -> None:
        """Free a current lease; a stale one is ignored."""
        self._check_open()
        await self._submit(
            RecordOp("lease release", functools.partial(records.release, lease=lease)), 0
        )

    async def claim_next_workflow(self, owner: str, ttl: float) -> Lease | None:
        """Lease the oldest unfinished workflow whose lease is free or expired, or None."""
        self._check_open()
        fn = functools.partial(records.claim, owner=owner, ttl=check_ttl(ttl))
        claimed: Lease | None = await self._submit(RecordOp("claim", fn), 0)
        return claimed

    # --- reads: separate connections, never behind the write queue -----------------------

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest step when ``step`` is None), or None."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_optional_step(step)
        limit = self._max_record_bytes
        return await self._read(lambda conn: read_one(conn, workflow_id, step, limit))

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
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        after = check_optional_step(after, "after")
        before = check_optional_step(before, "before")
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgumentError(f"limit must be an int >= 0 or None, got {limit!r}")
        max_bytes = self._max_record_bytes
        return await self._read(
            lambda conn: read_scan(conn, workflow_id, after, before, limit, descending, max_bytes)
        )

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step, when ``step`` is None) is stored."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_optional_step(step)
        return await self._read(lambda conn: read_exists(conn, workflow_id, step))

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted.

        Only valid ids (``str``): a row the library could not have written (a BLOB id in a
        hand-edited table) is skipped and logged; :meth:`foreign_rows` lists them.
        """
        self._check_open()
        return await self._read(read_workflows)

    async def foreign_rows(self) -> list[ForeignRow]:
        """Every row the library could not have written, in either table (a full pass).

        A database edited by hand, with its ``CHECK`` constraints off, can hold workflow ids
        that are not valid ``str`` ids, steps that are not integers, records that are not
        blobs, or workflow records that do not parse. Reads and listings skip such rows;
        this reports them, for verification tools.
        """
        self._check_open()

        def both(conn: Any) -> list[ForeignRow]:
            return foreign_checkpoints(conn) + records.foreign_records(conn)

        return await self._read(both)

    async def _read(self, fn: Callable[[Any], T]) -> T:
        # A disk too full to open the store for writing still lets it be read, if SQLite can
        # (ReaderPool.run_alone); when it cannot, that read's error says why.
        try:
            await self._ensure_open()
        except StorageFullError:
            return await self._in_thread(self._read_threads, self._readers.run_alone, fn)
        return await self._in_thread(self._read_threads, self._readers.run, fn)

    # --- lifecycle ------------------------------------------------------------------------

    async def close(self) -> None:
        """Commit queued writes, then close the connections; later calls raise.

        Calling it again waits for the first close to finish.
        """
        self._closed = True
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._shutdown())
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        try:
            await self._drain()
            if self._opened:
                await self._in_thread(self._write_thread, self._close_connections)
        finally:
            self._write_thread.shutdown(wait=False)
            self._read_threads.shutdown(wait=False)
            self._checkpoint_thread.shutdown(wait=False)

    def _close_connections(self) -> None:
        # Readers first, so the writer is the last connection and checkpoints the WAL.
        self._checkpointer.close()
        self._readers.close()
        self._writer.close()


def _checked_pair(pair: tuple[str, datetime]) -> tuple[str, datetime]:
    return check_workflow_id(pair[0]), pair[1]


def _checked_cut(cut: Cut) -> sweeps.CutRow:
    # A plain tuple, not a Cut: the collector stops tracking it (see sweeps.thin_one).
    below = None if cut.below is None else check_step(cut.below)
    return check_workflow_id(cut.workflow_id), tuple(map(check_step, cut.steps)), below


def _database_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path``; a name SQLite would read as a URI is refused."""
    name = os.fspath(path)
    if not isinstance(name, str):
        raise InvalidArgumentError(f"path must be a str or os.PathLike[str], got {path!r}")
    file = Path(name)
    if str(file)[:5].lower() == "file:":
        raise InvalidArgumentError(
            f"SQLite database path {str(file)!r} looks like a 'file:' URI; give the path itself "
            "(sqlite:///abs/path.db or sqlite:relative/path.db)"
        )
    return file
