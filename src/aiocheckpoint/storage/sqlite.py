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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections import deque
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from .._validation import check_optional_step, check_step, check_workflow_id
from ..errors import CheckpointCorruptedError, InvalidArgumentError, StorageClosedError
from ..format import SplitResult, TreeParams, record_root_refs
from ..leases import Lease, WorkflowRecord, WorkflowStatus, check_ttl, fence_token
from . import _sqlite_records as records
from ._sqlite_blobs import SaveTreeOp, drain_releases, read_blobs, recount
from ._sqlite_db import (
    CHECKPOINT_PAGES,
    WAL_LIMIT_PAGES,
    BusyRetry,
    Checkpointer,
    CheckpointResult,
    DeleteOp,
    Op,
    Outcome,
    ReaderPool,
    RecordOp,
    SaveOp,
    Writer,
    read_exists,
    read_one,
    read_scan,
    read_workflows,
)
from .base import DEFAULT_MAX_RECORD_BYTES, BaseStorage, StoredCheckpoint, check_record_size
from .refcounts import held_root_refs

__all__ = ["SQLiteCheckpointStorage"]

T = TypeVar("T")

#: A batch stops growing at this many queued bytes (it always takes at least one write).
_MAX_BATCH_BYTES: Final = 64 * 1024 * 1024
#: Seconds without a batch after which the writer counts as idle and the WAL is checkpointed.
_IDLE_SECONDS: Final = 0.1


@dataclass(eq=False)
class _Pending:
    op: Op
    size: int
    future: asyncio.Future[Any] = field(repr=False)


class SQLiteCheckpointStorage(BaseStorage):
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
      (:class:`~aiocheckpoint.incremental.TreeParams`; ``compression="zstd"`` compresses them).

    ``save`` returns once its transaction is committed and fsynced. A caller cancelled while
    its write is still queued removes it (nothing is written); once its batch is committing
    the write lands whole and the caller sees the cancellation. :meth:`close` commits
    queued writes before closing.
    """

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
        self._params = blob_params or TreeParams()
        self._path = Path(os.fspath(path))
        self._max_record_bytes = max_record_bytes
        self._max_batch = max_batch
        retry = BusyRetry(busy_retries)
        self._writer = Writer(self._path, float(busy_timeout), retry)
        self._readers = ReaderPool(self._path, float(busy_timeout), retry)
        self._write_thread = ThreadPoolExecutor(1, thread_name_prefix="aiocheckpoint-sqlite-w")
        self._read_threads = ThreadPoolExecutor(
            readers, thread_name_prefix="aiocheckpoint-sqlite-r"
        )
        self._checkpointer = Checkpointer(self._path, float(busy_timeout))
        self._checkpoint_thread = ThreadPoolExecutor(1, thread_name_prefix="aiocheckpoint-sqlite-c")
        self._checkpointing: asyncio.Future[CheckpointResult | None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_batch = 0.0  # loop.time() when the writer last took a batch
        self._pending: deque[_Pending] = deque()
        self._busy = False  # a batch (or the open) is in the writer thread
        self._kick_due = False  # a _kick is scheduled for the next loop iteration
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._opening: asyncio.Future[None] | None = None
        self._opened = False
        self._closing: asyncio.Task[None] | None = None

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
    ) -> None:
        """Store ``data`` as ``step``, then keep the ``keep_last`` highest steps, atomically.

        The workflow gets an UNFINISHED record if it has none. With ``fence``, the write
        happens only if ``fence.token`` is the workflow's current fencing token; otherwise
        this call (and no other in its batch) raises :class:`~aiocheckpoint.LeaseLostError`.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        _check_keep_last(keep_last)
        data = bytes(data)
        check_record_size(data, self._max_record_bytes)
        token = None if fence is None else fence_token(fence, workflow_id)
        refs = held_root_refs(data)
        if refs:  # a version-2 record given whole (the blobs it names must be stored already)
            op: Op = SaveTreeOp(workflow_id, step, data, refs, None, keep_last, token)
        else:
            op = SaveOp(workflow_id, step, data, keep_last, token)
        await self._submit(op, len(data))

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
    ) -> None:
        """Store ``split``'s new blobs, count references, store ``record``: one transaction.

        Goes through the same group commit as :meth:`save`, with the same ``keep_last``,
        ``fence`` and per-caller failure. Raises :class:`~aiocheckpoint.InvalidArgumentError`
        if ``record`` does not reference exactly ``split.root_refs``, or if a blob is neither
        stored nor in ``split.blobs`` (a split made with a stale ``known``); nothing is
        written then.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        _check_keep_last(keep_last)
        if not isinstance(split, SplitResult):
            raise InvalidArgumentError(f"split must be a SplitResult, not {type(split).__name__}")
        record = bytes(record)
        check_record_size(record, self._max_record_bytes)
        try:
            refs = record_root_refs(record)
        except CheckpointCorruptedError as exc:
            raise InvalidArgumentError(f"record is not a valid version-2 record: {exc}") from exc
        if refs != split.root_refs:
            raise InvalidArgumentError("record does not reference the root of split")
        token = None if fence is None else fence_token(fence, workflow_id)
        size = len(record) + sum(len(blob) for blob in split.blobs.values())
        op = SaveTreeOp(workflow_id, step, record, refs, split, keep_last, token)
        await self._submit(op, size)

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes`` (a read connection, off the event loop)."""
        self._check_open()
        wanted = list(dict.fromkeys(bytes(h) for h in hashes))
        limit = self._max_record_bytes
        return await self._read(lambda conn: read_blobs(conn, wanted, limit))

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

    # --- workflow records and leases (WorkflowStorage) ------------------------------------

    async def set_workflow_status(
        self, workflow_id: str, status: WorkflowStatus, *, fence: Lease | None = None
    ) -> WorkflowRecord:
        """Create or update the workflow's record with ``status`` (fenced by ``fence``)."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        status = WorkflowStatus(status)
        token = None if fence is None else fence_token(fence, workflow_id)
        fn = functools.partial(
            records.set_status, workflow_id=workflow_id, status=status, token=token
        )
        result: WorkflowRecord = await self._submit(RecordOp("status change", fn), 0)
        return result

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        return await self._read(lambda conn: records.read_record(conn, workflow_id))

    async def list_workflow_records(
        self, status: WorkflowStatus | None = None
    ) -> list[WorkflowRecord]:
        """Records ordered by workflow id, optionally only those with ``status``."""
        self._check_open()
        wanted = None if status is None else WorkflowStatus(status)
        return await self._read(lambda conn: records.read_records(conn, wanted))

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

    async def _submit(self, op: Op, size: int) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(op, size, future))
        if not self._busy and not self._kick_due:
            # Hand the writer what is queued one loop iteration later, not now: the other
            # tasks running in this iteration (typically every caller woken by the last
            # commit) then join this batch instead of waiting a whole commit behind a
            # batch of one.
            self._kick_due = True
            asyncio.get_running_loop().call_soon(self._due_kick)
        # Cancelling the caller cancels the future: a queued write is then skipped when the
        # next batch is taken; a write already taken is committed regardless.
        return await future

    def _due_kick(self) -> None:
        self._kick_due = False
        self._safe_kick()

    def _safe_kick(self) -> None:
        """:meth:`_kick` from a loop callback: if it fails, fail the callers, never hang."""
        try:
            self._kick()
        except Exception as exc:  # e.g. the executor was shut down
            self._fail_pending(exc)

    def _fail_pending(self, failure: BaseException) -> None:
        for item in self._pending:
            _settle(item.future, failure)
        self._pending.clear()
        self._wake_idle_waiters()

    def _kick(self) -> None:
        """Hand the queued writes to the writer thread, unless it is busy (then they wait)."""
        if self._busy:
            return
        if not self._opened:
            opening = self._start_open()
            self._busy = True  # the writer thread is opening the database
            opening.add_done_callback(self._open_then_kick)
            return
        batch = self._take_batch()
        if not batch:
            self._wake_idle_waiters()
            self._maybe_checkpoint(idle=True)
            return
        self._last_batch = asyncio.get_running_loop().time()
        try:
            done = asyncio.get_running_loop().run_in_executor(
                self._write_thread, self._writer.run_batch, [item.op for item in batch]
            )
        except RuntimeError as exc:  # the executor was shut down
            self._pending.extendleft(reversed(batch))
            raise StorageClosedError("SQLiteCheckpointStorage is closed") from exc
        self._busy = True
        done.add_done_callback(functools.partial(self._batch_done, batch))

    def _batch_done(self, batch: list[_Pending], done: asyncio.Future[list[Outcome]]) -> None:
        if done.cancelled():
            outcomes: list[Any] = [StorageClosedError("the write was abandoned") for _ in batch]
        elif (failure := done.exception()) is not None:
            outcomes = [failure] * len(batch)  # a bug in run_batch: every caller should see it
        else:
            outcomes = done.result()
        for item, outcome in zip(batch, outcomes, strict=True):
            _settle(item.future, outcome)
        self._maybe_checkpoint(idle=False)
        # Take the next batch one loop iteration later, after the callers just woken have run
        # and queued their next writes (the writer still counts as busy, so they queue rather
        # than each starting a batch of one): one fsync then serves all of them. Callers that
        # first await something else start a new batch through _submit's deferred kick.
        # Pipelining half-batches against the event loop loses (docs/sqlite-storage.md).
        asyncio.get_running_loop().call_soon(self._writer_free)

    def _maybe_checkpoint(self, *, idle: bool) -> None:
        """Start a background checkpoint when enough was committed; when idle, arm a timer.

        Called only while the writer thread is not running a batch, so reading and
        resetting its page count needs no lock.
        """
        writer = self._writer
        if self._checkpointing is not None or self._closing is not None:
            return
        if writer.wal_pages >= CHECKPOINT_PAGES and not writer.catch_up:
            self._start_checkpoint()
        elif idle and writer.wal_pages > 0 and self._idle_timer is None:
            # Not at once: between two writes of one caller the writer is idle for a moment,
            # and a checkpoint (two fsyncs) after every commit would halve C=1's rate.
            self._idle_timer = asyncio.get_running_loop().call_later(
                _IDLE_SECONDS, self._idle_checkpoint
            )

    def _idle_checkpoint(self) -> None:
        self._idle_timer = None
        if self._busy or self._pending or self._checkpointing is not None:
            return  # the writer's next idle moment arms the timer again
        if self._closing is not None or self._writer.wal_pages == 0:
            return
        quiet = asyncio.get_running_loop().time() - self._last_batch
        if quiet < _IDLE_SECONDS:
            self._idle_timer = asyncio.get_running_loop().call_later(
                _IDLE_SECONDS - quiet, self._idle_checkpoint
            )
            return
        self._start_checkpoint()

    def _start_checkpoint(self) -> None:
        writer = self._writer
        try:
            running = asyncio.get_running_loop().run_in_executor(
                self._checkpoint_thread, self._checkpointer.run
            )
        except RuntimeError:  # shut down by close(), which checkpoints itself
            return
        writer.wal_pages = 0
        self._checkpointing = running
        running.add_done_callback(self._checkpoint_done)

    def _checkpoint_done(self, running: asyncio.Future[CheckpointResult | None]) -> None:
        self._checkpointing = None
        result = None if running.cancelled() or running.exception() else running.result()
        if result is not None and result.log >= WAL_LIMIT_PAGES:
            # Under a steady write load the checkpoint never catches up with the WAL's end
            # and SQLite only starts the WAL over once it has: the writer copies the few
            # frames committed during this checkpoint before its next batch.
            self._writer.catch_up = True
        elif not self._busy:
            self._maybe_checkpoint(idle=not self._pending)

    def _writer_free(self) -> None:
        self._busy = False
        self._safe_kick()

    def _open_then_kick(self, opening: asyncio.Future[None]) -> None:
        self._busy = False
        failure = _failure(opening)
        if failure is None:
            self._safe_kick()
            return
        self._fail_pending(failure)

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._pending and len(batch) < self._max_batch:
            item = self._pending[0]
            if item.future.done():  # its caller was cancelled while it was queued
                self._pending.popleft()
                continue
            if batch and size + item.size > _MAX_BATCH_BYTES:
                break
            self._pending.popleft()
            batch.append(item)
            size += item.size
        return batch

    def _wake_idle_waiters(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            _settle(waiter, None)

    async def _flush(self) -> None:
        """Wait until every queued write has been committed (or has failed)."""
        while self._busy or self._pending:
            if not self._busy:
                self._kick()
                continue
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

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
        """Every workflow id with at least one record, sorted."""
        self._check_open()
        return await self._read(read_workflows)

    async def _read(self, fn: Callable[[Any], T]) -> T:
        await self._ensure_open()
        return await self._in_thread(self._read_threads, self._readers.run, fn)

    async def _in_thread(self, executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except RuntimeError as exc:  # the executor was shut down by a concurrent close()
            raise StorageClosedError("SQLiteCheckpointStorage is closed") from exc
        return await future

    # --- lifecycle ------------------------------------------------------------------------

    async def _ensure_open(self) -> None:
        if not self._opened:
            # Shielded: a cancelled caller must not abandon an open other callers share.
            await asyncio.shield(self._start_open())

    def _start_open(self) -> asyncio.Future[None]:
        if self._opening is None:
            try:
                opening = asyncio.get_running_loop().run_in_executor(
                    self._write_thread, self._writer.open
                )
            except RuntimeError as exc:  # the executor was shut down by close()
                raise StorageClosedError("SQLiteCheckpointStorage is closed") from exc
            opening.add_done_callback(self._open_done)
            self._opening = opening
        return self._opening

    def _open_done(self, opening: asyncio.Future[None]) -> None:
        if _failure(opening) is None:
            self._opened = True
        else:
            self._opening = None  # the next use tries again

    async def close(self) -> None:
        """Commit queued writes, then close the connections; later calls raise.

        Calling it again waits for the first close to finish.
        """
        self._closed = True
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._shutdown())
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        try:
            await self._flush()
            if self._opening is not None:
                with contextlib.suppress(Exception):  # a failed open left nothing to close
                    await asyncio.shield(self._opening)
            if self._checkpointing is not None:
                with contextlib.suppress(Exception):  # it logs its own failures
                    await asyncio.shield(self._checkpointing)
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


def _check_keep_last(keep_last: object) -> None:
    if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
        raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")


def _failure(future: asyncio.Future[Any]) -> BaseException | None:
    if future.cancelled():
        return StorageClosedError("opening the database was abandoned")
    return future.exception()


def _settle(future: asyncio.Future[Any], outcome: object) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
