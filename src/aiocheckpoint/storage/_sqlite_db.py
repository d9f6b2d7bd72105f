"""The blocking half of the SQLite backend: code that runs only in the database threads.

Nothing here touches the event loop. :class:`Writer` owns the one write connection and
commits a whole batch of operations per call (one thread hop per batch);
:class:`ReaderPool` hands out read-only connections to the read threads. Both retry
``SQLITE_BUSY``/``SQLITE_LOCKED`` with backoff on top of SQLite's own busy timeout, so that
several processes can share one database file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from ..errors import (
    CheckpointCorruptedError,
    LeaseError,
    StorageBackendError,
    StorageClosedError,
)
from . import _sqlite_records as records
from ._sqlite_blobs import SaveTreeOp, drain_releases, save_tree
from ._sqlite_schema import MIGRATIONS, Migration, migrate
from .base import StoredCheckpoint

T = TypeVar("T")

logger = logging.getLogger("aiocheckpoint")

#: Estimated WAL pages written since the last checkpoint after which a background
#: checkpoint starts (SQLite's automatic checkpoint, turned off here, uses 1,000).
CHECKPOINT_PAGES: Final = 1000
#: WAL length (frames) at which the writer itself finishes a checkpoint between two batches,
#: so that the next transaction starts the WAL over: the bound when the writer is never idle.
WAL_LIMIT_PAGES: Final = 4000
_PAGE_SIZE: Final = 4096


@dataclass(frozen=True, slots=True)
class SaveOp:
    """Store ``data`` as ``step``, then keep the ``keep_last`` highest steps.

    With ``token`` (a lease's fencing token), only if it is the workflow's current one.
    """

    workflow_id: str
    step: int
    data: bytes
    keep_last: int | None
    token: int | None = None


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


Op = SaveOp | DeleteOp | RecordOp | SaveTreeOp


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """What one ``PRAGMA wal_checkpoint`` reported.

    ``busy``: it could not run or finish (another checkpoint held the lock, or a reader or
    writer was in the way); ``log``/``done``: frames in the WAL and frames copied into the
    database file (-1 when it could not run).
    """

    busy: bool
    log: int
    done: int


def wal_checkpoint(conn: sqlite3.Connection, mode: str) -> CheckpointResult:
    """Run a WAL checkpoint (``PASSIVE``, ``RESTART``, ``TRUNCATE``); SQLITE_BUSY is a result."""
    row = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    return CheckpointResult(bool(row[0]), int(row[1]), int(row[2]))


def _estimate_pages(ops: Sequence[Op]) -> int:
    # The WAL frames a batch adds, roughly: its bytes plus a few index/record pages per op.
    size = 0
    for op in ops:
        if isinstance(op, SaveOp | SaveTreeOp):
            size += len(op.data)
            if isinstance(op, SaveTreeOp) and op.split is not None:
                size += sum(len(blob) for blob in op.split.blobs.values())
    return size // _PAGE_SIZE + 2 * len(ops)


#: What a batch returns per operation: its result or the exception it raised.
Outcome = object

_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6

_UPSERT: Final = (
    "INSERT INTO checkpoints (workflow_id, step, data) VALUES (?, ?, ?) "
    "ON CONFLICT (workflow_id, step) DO UPDATE SET data = excluded.data, refs = NULL"
)
# Keep the N highest steps: delete below the N-th highest (NULL, so nothing, if fewer exist).
_PRUNE: Final = (
    "DELETE FROM checkpoints WHERE workflow_id = ? AND step < ("
    "SELECT step FROM checkpoints WHERE workflow_id = ? ORDER BY step DESC LIMIT 1 OFFSET ?)"
)
_DELETE_STEP: Final = "DELETE FROM checkpoints WHERE workflow_id = ? AND step = ?"
_DELETE_WORKFLOW: Final = "DELETE FROM checkpoints WHERE workflow_id = ?"
# The blob is only fetched when it is small enough; length() of a blob reads no content.
_COLUMNS: Final = "step, length(data), CASE WHEN length(data) <= ? THEN data END"
_LATEST: Final = (
    f"SELECT {_COLUMNS} FROM checkpoints WHERE workflow_id = ? ORDER BY step DESC LIMIT 1"
)
_ONE: Final = f"SELECT {_COLUMNS} FROM checkpoints WHERE workflow_id = ? AND step = ?"
_SCAN: Final = (
    f"SELECT {_COLUMNS} FROM checkpoints WHERE workflow_id = ? AND step > ? AND step <= ? "
    "ORDER BY step {order} LIMIT ?"
)
_EXISTS_ANY: Final = "SELECT 1 FROM checkpoints WHERE workflow_id = ? LIMIT 1"
_EXISTS_STEP: Final = "SELECT 1 FROM checkpoints WHERE workflow_id = ? AND step = ?"
# A loose index scan: one index seek per workflow instead of a pass over every row.
_WORKFLOWS: Final = """
    WITH RECURSIVE ids(id) AS (
        SELECT min(workflow_id) FROM checkpoints
        UNION ALL
        SELECT (SELECT min(workflow_id) FROM checkpoints WHERE workflow_id > ids.id)
        FROM ids WHERE ids.id IS NOT NULL
    )
    SELECT id FROM ids WHERE id IS NOT NULL
"""


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLITE_BUSY or SQLITE_LOCKED (any extended code), worth a retry."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    message = str(exc).lower()
    return "locked" in message or "busy" in message


def backend_error(message: str, exc: BaseException) -> StorageBackendError:
    """A :class:`StorageBackendError` with ``exc`` chained as its cause."""
    err = StorageBackendError(f"{message}: {exc}")
    err.__cause__ = exc
    return err


class BusyRetry:
    """Run a callable, retrying on SQLITE_BUSY/LOCKED with jittered exponential backoff."""

    def __init__(self, retries: int, base: float = 0.005, cap: float = 0.5) -> None:
        self.retries = retries
        self.base = base
        self.cap = cap

    def __call__(self, fn: Callable[[], T]) -> T:
        """Return ``fn()``; a busy error is retried up to ``retries`` times, then raised."""
        attempt = 0
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if attempt >= self.retries or not is_busy(exc):
                    raise
            delay = min(self.cap, self.base * 2**attempt)
            time.sleep(delay * (0.5 + random.random()))
            attempt += 1


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """An autocommit connection usable from any one thread at a time."""
    conn = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    return conn


def _create_private(path: Path) -> bool:
    """Create an empty database file readable by its owner only; False if it existed.

    SQLite gives the -wal and -shm files the database file's permission bits.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _fsync_dir(path: Path) -> None:
    """Make the directory entries of the database and its WAL file durable."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    ) -> None:
        self.path = path
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

    def open(self) -> None:
        """Create the file if needed, switch to WAL with synchronous=FULL, migrate."""
        try:
            _create_private(self.path)
            conn = connect(str(self.path), self.busy_timeout)
        except (OSError, sqlite3.Error) as exc:
            raise backend_error(f"cannot open SQLite database {str(self.path)!r}", exc) from exc
        try:
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
            _fsync_dir(self.path.parent)
        except sqlite3.Error as exc:
            conn.close()
            raise backend_error(f"cannot open SQLite database {str(self.path)!r}", exc) from exc
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
            self._begin(conn)
        except sqlite3.Error as exc:
            # One exception object per caller: a shared one would collect their tracebacks.
            return [backend_error("SQLite could not start a write transaction", exc) for _ in ops]
        try:
            results = self._apply_all(conn, ops)
            drain_releases(conn)
            self._commit(conn)
        except Exception as exc:
            _rollback(conn)
            if len(ops) == 1:
                return [_outcome_error(ops[0], exc)]
        else:
            self.commits += 1
            self.wal_pages += _estimate_pages(ops)
            return results
        return [self._run_alone(conn, op) for op in ops]

    def _run_alone(self, conn: sqlite3.Connection, op: Op) -> Outcome:
        try:
            self._begin(conn)
            result = self._apply(conn, op)
            drain_releases(conn)
            self._commit(conn)
        except Exception as exc:
            _rollback(conn)
            return _outcome_error(op, exc)
        self.commits += 1
        self.wal_pages += _estimate_pages([op])
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
    def _apply_all(cls, conn: sqlite3.Connection, ops: Sequence[Op]) -> list[Outcome]:
        """Apply ops in order; a run of saves sharing one keep_last goes through executemany.

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
                    results.append(cls._apply(conn, op))
                except LeaseError as exc:  # refused before writing: only this caller fails
                    results.append(exc)
                start += 1
                continue
            run = [op]
            for other in ops[start + 1 :]:
                if not isinstance(other, SaveOp) or other.keep_last != op.keep_last:
                    break
                run.append(other)
            results.extend(cls._save_run(conn, run))
            start += len(run)
        return results

    @staticmethod
    def _save_run(conn: sqlite3.Connection, run: Sequence[SaveOp]) -> list[Outcome]:
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
        records.ensure_records(conn, (o.workflow_id for o in ok), time.time())
        conn.executemany(_UPSERT, [(o.workflow_id, o.step, o.data) for o in ok])
        keep_last = run[0].keep_last
        if keep_last is not None:
            workflows = dict.fromkeys(o.workflow_id for o in ok)
            conn.executemany(_PRUNE, [(wf, wf, keep_last - 1) for wf in workflows])
        return outcomes

    @classmethod
    def _apply(cls, conn: sqlite3.Connection, op: Op) -> Outcome:
        if isinstance(op, RecordOp):
            return op.fn(conn, time.time())
        if isinstance(op, SaveTreeOp):
            save_tree(conn, op, _PRUNE)
            return None
        wf = op.workflow_id
        if isinstance(op, SaveOp):
            outcome = cls._save_run(conn, [op])[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return None
        if op.step is None:
            # The record and lease go with the checkpoints, in the same transaction.
            gone = conn.execute(records.DELETE_RECORD, (wf,)).rowcount > 0
            return conn.execute(_DELETE_WORKFLOW, (wf,)).rowcount > 0 or gone
        return conn.execute(_DELETE_STEP, (wf, op.step)).rowcount > 0


class Checkpointer:
    """A connection of its own, in a thread of its own, running PASSIVE checkpoints.

    A PASSIVE checkpoint takes no write lock: it copies committed WAL frames into the
    database file while the writer goes on committing. It never waits (a busy result just
    ends it) and its failure is logged, never raised: the commits it follows are durable in
    the WAL already.
    """

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.conn: sqlite3.Connection | None = None
        #: Checkpoints run, and how many of those were busy or failed.
        self.runs = 0
        self.busy = 0
        self.failures = 0
        #: The last checkpoint's report (None before the first, or after a failure).
        self.last: CheckpointResult | None = None

    def run(self) -> CheckpointResult | None:
        """One PASSIVE checkpoint; None if it failed."""
        self.runs += 1
        try:
            if self.conn is None:
                self.conn = connect(str(self.path), self.busy_timeout)
            result = wal_checkpoint(self.conn, "PASSIVE")
        except sqlite3.Error as exc:
            self.failures += 1
            self.last = None
            logger.warning("SQLite WAL checkpoint of %s failed: %s", self.path, exc)
            return None
        if result.busy:
            self.busy += 1
        self.last = result
        return result

    def close(self) -> None:
        """Close the connection (errors are logged: there is nothing left to lose)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error as exc:
                logger.warning("closing the SQLite checkpoint connection failed: %s", exc)


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


class ReaderPool:
    """Read connections (``query_only``) shared by the read threads, opened on demand.

    WAL lets these read while the writer commits, so reads never queue behind writes.
    """

    def __init__(self, path: Path, busy_timeout: float, retry: BusyRetry) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.retry = retry
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` with a read connection; map driver errors to StorageBackendError."""
        conn = self._acquire()
        try:
            return self.retry(lambda: fn(conn))
        except sqlite3.Error as exc:
            raise backend_error("SQLite read failed", exc) from exc
        finally:
            self._release(conn)

    def close(self) -> None:
        """Close idle connections now and busy ones as they are released."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _acquire(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise StorageClosedError("SQLiteCheckpointStorage is closed")
            if self._idle:
                return self._idle.pop()
        try:
            conn = connect(str(self.path), self.busy_timeout)
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            raise backend_error(f"cannot open SQLite database {str(self.path)!r}", exc) from exc
        return conn

    def _release(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()


def _record(
    workflow_id: str, row: tuple[int, int, bytes | None], max_bytes: int
) -> StoredCheckpoint:
    step, size, data = row
    if data is None:
        raise CheckpointCorruptedError(
            f"record is {size} bytes, more than max_record_bytes={max_bytes}",
            workflow_id=workflow_id,
            step=step,
        )
    if not isinstance(data, bytes):
        raise CheckpointCorruptedError(
            f"record is stored as {type(data).__name__}, not bytes",
            workflow_id=workflow_id,
            step=step,
        )
    return StoredCheckpoint(step, data)


def read_one(
    conn: sqlite3.Connection, workflow_id: str, step: int | None, max_bytes: int
) -> StoredCheckpoint | None:
    """The latest record (``step`` None) or one step's record, or None."""
    if step is None:
        rows = conn.execute(_LATEST, (max_bytes, workflow_id)).fetchall()
    else:
        rows = conn.execute(_ONE, (max_bytes, workflow_id, step)).fetchall()
    return _record(workflow_id, rows[0], max_bytes) if rows else None


def read_scan(
    conn: sqlite3.Connection,
    workflow_id: str,
    after: int | None,
    before: int | None,
    limit: int | None,
    descending: bool,
    max_bytes: int,
) -> list[StoredCheckpoint]:
    """Records with ``after < step < before`` in step order, at most ``limit`` (an index range)."""
    low = -1 if after is None else after
    high = 2**63 - 1 if before is None else before - 1
    sql = _SCAN.format(order="DESC" if descending else "ASC")
    params = (max_bytes, workflow_id, low, high, -1 if limit is None else limit)
    # fetchall() runs each statement to completion, which ends its read transaction.
    return [_record(workflow_id, row, max_bytes) for row in conn.execute(sql, params).fetchall()]


def read_exists(conn: sqlite3.Connection, workflow_id: str, step: int | None) -> bool:
    """Whether the step (or any step) exists: a covering-index probe."""
    if step is None:
        return bool(conn.execute(_EXISTS_ANY, (workflow_id,)).fetchall())
    return bool(conn.execute(_EXISTS_STEP, (workflow_id, step)).fetchall())


def read_workflows(conn: sqlite3.Connection) -> list[str]:
    """Every workflow id, sorted (UTF-8 byte order is code point order)."""
    return [row[0] for row in conn.execute(_WORKFLOWS).fetchall()]
