"""The writer: the one write connection, and the batch of writes it commits per call.

Code for the writer thread only; nothing here touches the event loop. :class:`Writer`
opens the database (creates it private, WAL, ``synchronous=FULL``, migrations) and commits
a whole batch of operations per call (one thread hop and one fsync per batch). The event
loop's half of the group commit (the queue, when a batch is taken) is
:mod:`~aiocheckpoint.storage.sqlite.groupcommit`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final, NamedTuple, TypeVar

from ...errors import (
    CheckpointNotFoundError,
    InvalidArgumentError,
    LeaseError,
    StorageBackendError,
    StorageClosedError,
)
from ..queries import StepInfo
from . import effects, records
from .blobs import PAGE_SIZE, SaveTreeOp, drain_releases, save_tree
from .connections import (
    BusyRetry,
    backend_error,
    connect,
    create_private,
    fsync_dir_once,
    open_error,
    secure_files,
)
from .schema import MIGRATIONS, Migration, migrate
from .sql import _DELETE_STEP, _DELETE_WORKFLOW, _PRUNE, upsert_sql
from .vacuum import compact, incremental_if_new, page_size, vacuum_pages
from .walcheckpoint import wal_checkpoint

logger = logging.getLogger(__name__)

_WORKFLOW_BYTES: Final = (
    "SELECT coalesce(sum(length(data)), 0) FROM checkpoints WHERE workflow_id = ?"
)

#: What a record operation raises before it writes anything: only its caller fails.
_REFUSALS: Final = (InvalidArgumentError, CheckpointNotFoundError)


class SaveOp(NamedTuple):
    """Store ``data`` as ``step``, then keep the ``keep_last`` highest steps.

    With ``token`` (a lease's fencing token), only if it is the workflow's current one. A
    tuple of atoms, which the garbage collector stops tracking while the write is queued.
    """

    workflow_id: str
    step: int
    data: bytes
    keep_last: int | None
    token: int | None = None
    step_info: StepInfo | None = None


#: ``SaveOp(*fields)`` without ``NamedTuple.__new__``'s Python frame (every checked save).
make_save_op: Callable[[tuple[object, ...]], SaveOp] = functools.partial(tuple.__new__, SaveOp)


@dataclass(frozen=True, slots=True)
class DeleteOp:
    """Delete one step, or the whole workflow when ``step`` is None."""

    workflow_id: str
    step: int | None


@dataclass(frozen=True, slots=True)
class RecordOp:
    """Run ``fn(conn, now)`` in the write transaction (workflow records and leases).

    ``fn`` may raise a :class:`~aiocheckpoint.LeaseError` only before it writes anything.
    """

    what: str
    fn: Callable[[sqlite3.Connection, float], object]
    #: A slice of a long background write (a sweep's deletes): a batch never takes it
    #: behind other writes, so those queued while the last slice ran go first; a batch of
    #: it alone commits without an fsync (:meth:`Writer._synchronous`).
    background: bool = False


#: What one slice of a background write (a sweep's deletes) spends in the writer at most
#: before it commits. A slice ends sooner, after the item it is on, as soon as a write
#: waits: that write then waits for one item and a commit that does not wait for the disk
#: (a slice's commit does not fsync: the next write's commit makes it durable with its own,
#: :meth:`Writer.run_batch`), not for a whole slice and its fsync.
LONG_SLICE_SECONDS: Final = 0.05
#: What a slice spends at least before it yields to a waiting write: under writers that
#: never stop, a slice of one item per commit would leave the sweep ~1 workflow per fsync.
MIN_SLICE_SECONDS: Final = 0.001
#: Free pages an incremental vacuum's slice gives back between two looks at the clock.
VACUUM_PAGES: Final = 32

_I = TypeVar("_I")
_R = TypeVar("_R")


def slice_of(
    items: Sequence[_I],
    start: int,
    fn: Callable[[sqlite3.Connection, float, _I], _R],
    waiting: Callable[[], bool],
) -> Callable[[sqlite3.Connection, float], list[_R]]:
    """A record op's function: ``fn`` over ``items[start:]`` for one slice's time.

    Up to :data:`LONG_SLICE_SECONDS`, or until ``waiting()`` says a write waits once
    :data:`MIN_SLICE_SECONDS` are spent. It takes
    at least one item; its result is one outcome per item taken, in order.
    """

    def run(conn: sqlite3.Connection, now: float) -> list[_R]:
        began = time.monotonic()
        done: list[_R] = []
        for n in range(start, len(items)):
            done.append(fn(conn, now, items[n]))
            spent = time.monotonic() - began
            if spent >= LONG_SLICE_SECONDS or (spent >= MIN_SLICE_SECONDS and waiting()):
                break
        return done

    return run


Op = SaveOp | DeleteOp | RecordOp | SaveTreeOp


def _estimate_pages(ops: Sequence[Op], blob_pages: int) -> int:
    """The WAL frames a batch adds, roughly: its records' bytes, a few pages per op.

    ``blob_pages`` are what its tree saves found they wrote (:func:`.blobs.save_tree`): not
    every blob a split names, which for a split made from cached sub-trees is the whole
    tree (~2 MB for a chat of 2,000 messages whose step inserts ~1 KB; counting it started
    a WAL checkpoint every other save); plus the rows its record operations changed (a
    sweep's batch: thousands, which otherwise left the WAL growing unchecked); plus the
    pointer map of an ``auto_vacuum`` store (a page per commit, one more per 800 pages
    written: uncounted, it pushed the WAL past its bound under load).
    """
    size = 0
    for op in ops:
        if isinstance(op, SaveOp | SaveTreeOp):
            size += len(op.data)
    pages = size // PAGE_SIZE + blob_pages
    return pages + pages // 800 + 1 + 2 * len(ops)


#: What a batch returns per operation: its result or the exception it raised.
Outcome = object


class Writer:
    """The single write connection and the group-commit batch it runs.

    Used from one thread only (the writer executor), so it needs no lock.
    """

    def __init__(
        self,
        path: Path,
        busy_timeout: float,
        retry: BusyRetry,
        migrations: Sequence[Migration] = MIGRATIONS,
        *,
        allow_shared: bool = False,
    ) -> None:
        self.path = path
        #: Open a file that another user owns or that group/others may read or write.
        self.allow_shared = allow_shared
        self.busy_timeout = busy_timeout
        self.retry = retry
        self.migrations = migrations
        self.conn: sqlite3.Connection | None = None
        #: Transactions committed by this writer (group commit shows as commits < writes).
        self.commits = 0
        #: Estimated WAL pages committed since a checkpoint last started (read by the loop).
        self.wal_pages = 0
        #: Set from the event loop: finish a checkpoint before the next batch (WAL bound).
        self.catch_up = False
        #: Checkpoints this writer ran itself (catch-ups; the last one at close included).
        self.checkpoints = 0
        #: Whether the connection commits without an fsync now (:meth:`_synchronous`).
        self._lazy = False

    def open(self) -> None:
        """Create the file if needed, switch to WAL with synchronous=FULL, migrate."""
        try:
            create_private(self.path)
            if not self.allow_shared:
                secure_files(self.path)
            conn = connect(self.path, self.busy_timeout)
        except (OSError, sqlite3.Error) as exc:
            raise open_error(self.path, exc) from exc
        try:
            # Before WAL mode and the first table: only a new database takes it.
            self.retry(lambda: incremental_if_new(conn))
            mode = self.retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchall())
            if mode[0][0].lower() != "wal":
                raise StorageBackendError(
                    f"SQLite database {str(self.path)!r} cannot use WAL mode (got {mode[0][0]})"
                )
            # FULL: every commit fsyncs the WAL, so a committed checkpoint survives power loss.
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA journal_size_limit = 67108864")
            # Checkpoints run beside the commits (Checkpointer) or between two batches
            # (catch_up), never inside a COMMIT: docs/sqlite-storage.md "WAL checkpoints".
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            self.retry(lambda: migrate(conn, self.migrations))
            fsync_dir_once(self.path)
        except sqlite3.Error as exc:
            conn.close()
            raise open_error(self.path, exc) from exc
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def close(self) -> None:
        """Checkpoint and truncate the WAL if no other connection is in the way, then close.

        The truncation does not wait: a reader in another process leaves the WAL as it is
        (the last connection to close, in whichever process, checkpoints it then).
        """
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.execute("PRAGMA busy_timeout = 0")
                self._checkpoint(conn, "TRUNCATE")
                conn.close()
            except sqlite3.Error as exc:
                raise backend_error("closing the SQLite database failed", exc) from exc

    def reclaim_slice(
        self, waiting: Callable[[], bool]
    ) -> Callable[[sqlite3.Connection, float], tuple[int, int]]:
        """A background op's function: free pages given back for one slice's time.

        :func:`slice_of`'s rule (a write waiting ends it after :data:`MIN_SLICE_SECONDS`),
        in the batch's transaction (:mod:`.vacuum`). Its result: the bytes freed and the
        free pages left.
        """

        def run(conn: sqlite3.Connection, _now: float) -> tuple[int, int]:
            began = time.monotonic()
            freed = 0
            while True:
                got, left = vacuum_pages(conn, VACUUM_PAGES)
                freed += got
                # Each page moved and the free list's: counted for the WAL's checkpoints.
                self.wal_pages += 2 * got
                spent = time.monotonic() - began
                if not got or not left or spent >= LONG_SLICE_SECONDS:
                    return freed * page_size(conn), left
                if spent >= MIN_SLICE_SECONDS and waiting():
                    return freed * page_size(conn), left

        return run

    def compact(self) -> tuple[int, int]:
        """``VACUUM`` the database (:func:`.vacuum.compact`): its bytes before and after."""
        conn = self._open_conn()
        try:
            self._synchronous(conn, lazy=False)
            self._checkpoint(conn, "TRUNCATE")
            result = self.retry(lambda: compact(conn))
            self._checkpoint(conn, "TRUNCATE")
            return result
        except sqlite3.Error as exc:
            raise backend_error("SQLite VACUUM failed", exc) from exc

    def _open_conn(self) -> sqlite3.Connection:
        if self.conn is None:
            raise StorageClosedError("SQLiteCheckpointStorage is closed")
        return self.conn

    def run_batch(self, ops: Sequence[Op]) -> list[Outcome]:
        """Commit every op in one transaction; return one outcome per op, in order.

        Fast path: all ops in one ``BEGIN IMMEDIATE ... COMMIT`` (one fsync). If any op or
        the commit fails, the transaction is rolled back and each op is retried in its own
        transaction, so one bad write fails only its own caller.
        """
        conn = self.conn
        if conn is None:
            raise StorageClosedError("SQLiteCheckpointStorage is closed")
        if self.catch_up:
            self.catch_up = False
            self._checkpoint(conn, "PASSIVE")
        try:
            self._synchronous(conn, lazy=all(is_background(op) for op in ops))
            self._begin(conn)
        except sqlite3.Error as exc:
            # One exception object per caller: a shared one would collect their tracebacks.
            return [backend_error("SQLite could not start a write transaction", exc) for _ in ops]
        blob_pages: list[int] = []
        released: list[int] = []
        try:
            results = self._apply_all(conn, ops, blob_pages, released)
            if _may_release(ops, released):
                drain_releases(conn)
            self._commit(conn)
        except Exception as exc:
            _rollback(conn)
            if len(ops) == 1:
                return [_outcome_error(ops[0], exc)]
        else:
            self.commits += 1
            self.wal_pages += _estimate_pages(ops, sum(blob_pages))
            return results
        return [self._run_alone(conn, op) for op in ops]

    def _synchronous(self, conn: sqlite3.Connection, *, lazy: bool) -> None:
        """FULL for every commit but a batch of background writes alone (a sweep's slice).

        That one commits without an fsync (``NORMAL``): the next commit's fsync makes it
        durable with its own (the WAL is one file, written in order), so a save queued
        behind a slice waits for one fsync, not two. A power loss before then undoes the
        slice's deletes whole, which the next sweep makes again. Set before the transaction
        (SQLite refuses it inside one); if FULL cannot be set back, the batch fails.
        """
        if lazy != self._lazy:
            conn.execute(f"PRAGMA synchronous = {'NORMAL' if lazy else 'FULL'}")
            self._lazy = lazy

    def _run_alone(self, conn: sqlite3.Connection, op: Op) -> Outcome:
        blob_pages: list[int] = []
        released: list[int] = []
        try:
            self._begin(conn)
            result = self._apply(conn, op, blob_pages, released)
            if _may_release([op], released):
                drain_releases(conn)
            self._commit(conn)
        except Exception as exc:
            _rollback(conn)
            return _outcome_error(op, exc)
        self.commits += 1
        self.wal_pages += _estimate_pages([op], sum(blob_pages))
        return result

    def _checkpoint(self, conn: sqlite3.Connection, mode: str) -> None:
        """A checkpoint outside any transaction; failing one never fails a write."""
        try:
            result = wal_checkpoint(conn, mode)
        except sqlite3.Error as exc:
            logger.warning("SQLite WAL checkpoint (%s) of %s failed: %s", mode, self.path, exc)
            return
        self.checkpoints += 1
        if result.busy:
            logger.debug("SQLite WAL checkpoint (%s) of %s was busy", mode, self.path)

    def _begin(self, conn: sqlite3.Connection) -> None:
        # IMMEDIATE takes the write lock up front: a deferred transaction that upgrades
        # later can fail with SQLITE_BUSY_SNAPSHOT without consulting the busy handler.
        self.retry(lambda: conn.execute("BEGIN IMMEDIATE"))

    def _commit(self, conn: sqlite3.Connection) -> None:
        self.retry(lambda: conn.execute("COMMIT"))

    @classmethod
    def _apply_all(
        cls,
        conn: sqlite3.Connection,
        ops: Sequence[Op],
        blob_pages: list[int],
        released: list[int],
    ) -> list[Outcome]:
        """Apply ops in order; a run of saves sharing one keep_last goes through executemany.

        The WAL pages each tree save's blobs take are appended to ``blob_pages``, the rows
        the saves' upserts added to ``blob_releases`` (:func:`_upsert`) to ``released``.

        Keeping the top N steps is idempotent (top_N(top_N(A) | {x}) == top_N(A | {x})), so
        pruning once after a run of saves with the same N leaves what pruning after each one
        would. executemany loops in C, which keeps this thread off the GIL the event loop
        needs.
        """
        results: list[Outcome] = []
        start = 0
        while start < len(ops):
            op = ops[start]
            if not isinstance(op, SaveOp):
                try:
                    results.append(cls._apply(conn, op, blob_pages, released))
                except LeaseError as exc:  # refused before writing: only this caller fails
                    results.append(exc)
                except _REFUSALS as exc:
                    if not isinstance(op, RecordOp):
                        raise  # a save may have written part: the batch reruns op by op
                    results.append(exc)  # record ops refuse before writing
                start += 1
                continue
            run = [op]
            for other in ops[start + 1 :]:
                if not isinstance(other, SaveOp) or other.keep_last != op.keep_last:
                    break
                run.append(other)
            results.extend(cls._save_run(conn, run, released))
            start += len(run)
        return results

    @staticmethod
    def _save_run(
        conn: sqlite3.Connection, run: Sequence[SaveOp], released: list[int]
    ) -> list[Outcome]:
        """Write a run of saves sharing one keep_last; a stale fence fails only its op."""
        fenced = [o.workflow_id for o in run if o.token is not None]
        tokens = records.current_tokens(conn, fenced) if fenced else {}
        outcomes: list[Outcome] = [
            None
            if o.token is None or tokens.get(o.workflow_id) == o.token
            # One exception object per caller: a shared one would collect their tracebacks.
            else records.lost(o.workflow_id, o.token)
            for o in run
        ]
        ok = [o for o, outcome in zip(run, outcomes, strict=True) if outcome is None]
        records.note_saves(conn, time.time(), [(o.workflow_id, o.step, o.step_info) for o in ok])
        released.append(_upsert(conn, ok))
        keep_last = run[0].keep_last
        if keep_last is not None:
            workflows = dict.fromkeys(o.workflow_id for o in ok)
            conn.executemany(_PRUNE, [(wf, wf, keep_last - 1) for wf in workflows])
        return outcomes

    @classmethod
    def _apply(
        cls, conn: sqlite3.Connection, op: Op, blob_pages: list[int], released: list[int]
    ) -> Outcome:
        if isinstance(op, RecordOp):
            before = conn.total_changes
            try:
                return op.fn(conn, time.time())
            finally:
                # A sweep's batch deletes thousands of rows: a page of WAL each, at most.
                blob_pages.append(conn.total_changes - before)
        if isinstance(op, SaveTreeOp):
            blob_pages.append(save_tree(conn, op))
            return None
        wf = op.workflow_id
        if isinstance(op, SaveOp):
            outcome = cls._save_run(conn, [op], released)[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return None
        # Effects of steps without a checkpoint too (the trigger takes those with one).
        effects.delete(conn, wf, op.step)
        if op.step is None:
            # The record and lease go with the checkpoints, in the same transaction.
            gone = conn.execute(records.DELETE_RECORD, (wf,)).rowcount > 0
            return conn.execute(_DELETE_WORKFLOW, (wf,)).rowcount > 0 or gone
        return conn.execute(_DELETE_STEP, (wf, op.step)).rowcount > 0


def _upsert(conn: sqlite3.Connection, saves: Sequence[SaveOp]) -> int:
    """Write the rows of ``saves``: one statement per 128 (:func:`.sql.upsert_sql`).

    Padded as :func:`.records.padded_chunks` pads. Returns the rows its triggers wrote:
    those of ``blob_releases`` (a replaced version-2 record's references), counted as the
    connection's total changes beyond the statements' own rows.
    """
    triggered = 0
    for chunk in records.padded_chunks(saves):
        params: list[object] = []
        for save in chunk:
            params += save[:3]  # workflow_id, step, data
        before = conn.total_changes
        cursor = conn.execute(upsert_sql(len(chunk)), params)
        triggered += conn.total_changes - before - cursor.rowcount
    return triggered


def _may_release(ops: Sequence[Op], released: list[int]) -> bool:
    """Whether the batch may have left references in ``blob_releases`` to drain.

    A batch of plain saves without retention whose upserts' triggers wrote nothing left
    none: the drain's query is skipped (in the writer, each statement takes the GIL back
    from the event loop once more).
    """
    if any(released):
        return True
    return not all(type(op) is SaveOp and op.keep_last is None for op in ops)


def delete_untouched(
    conn: sqlite3.Connection, now: float, *, workflow_id: str, updated_at: datetime
) -> int | None:
    """Delete the workflow whole if its record is untouched since ``updated_at``.

    Returns the bytes of the checkpoint records deleted, or None (changed, leased, gone).
    The writer's one transaction makes the check and the delete one step: a save that
    commits first moved ``updated_at``, one that commits after writes a new workflow.
    """
    if not records.untouched(conn, now, workflow_id, updated_at):
        return None
    size = conn.execute(_WORKFLOW_BYTES, (workflow_id,)).fetchone()[0]
    effects.delete(conn, workflow_id, None)
    conn.execute(records.DELETE_RECORD, (workflow_id,))
    conn.execute(_DELETE_WORKFLOW, (workflow_id,))
    return int(size)


def is_background(op: Op) -> bool:
    """Whether ``op`` is a slice of a background write (:attr:`RecordOp.background`)."""
    return isinstance(op, RecordOp) and op.background


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        # If even ROLLBACK fails the transaction is gone anyway; the next BEGIN will tell.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _outcome_error(op: Op, exc: Exception) -> BaseException:
    if not isinstance(exc, sqlite3.Error):
        return exc
    if isinstance(op, RecordOp):
        return backend_error(f"SQLite {op.what} failed", exc)
    kind = "delete" if isinstance(op, DeleteOp) else "save"
    step = "" if op.step is None else f" step {op.step}"
    return backend_error(f"SQLite {kind} of workflow {op.workflow_id!r}{step} failed", exc)
