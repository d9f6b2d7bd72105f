"""Reads: the read-only connections and the queries they run, in the read threads.

WAL lets these read the last committed state while the writer commits, so reads never
queue behind writes. Records larger than the reader's ``max_record_bytes`` are refused
without fetching them (``length(data)`` is answered from the record header).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ...errors import CheckpointCorruptedError, StorageClosedError
from ..base import StoredCheckpoint
from .connections import BusyRetry, backend_error, connect, open_error
from .foreign import ForeignRow, id_problem, warn_skipped
from .sql import _ALL_ROWS, _EXISTS_ANY, _EXISTS_STEP, _LATEST, _ONE, _SCAN, _WORKFLOWS

T = TypeVar("T")
#: A read connection's page cache (KiB, negative as SQLite takes it), allocated as used:
#: the default 2 MiB re-reads a tree of more than 2 MiB from the OS at every resume, a
#: ``pread`` per 4 KiB page (~7 ms against ~3.5 ms for 10 MB held in the cache).
_CACHE_KIB = -16384


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
        self._alone_lock = threading.Lock()

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` with a read connection; map driver errors to StorageBackendError."""
        conn = self._acquire()
        try:
            return self.retry(lambda: fn(conn))
        except sqlite3.Error as exc:
            raise backend_error("SQLite read failed", exc) from exc
        finally:
            self._release(conn)

    def run_alone(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on a connection of its own that needs no ``-shm`` file, then close it.

        On a full disk a WAL connection cannot size the shared ``-shm`` file. In exclusive
        locking mode SQLite keeps the WAL index in its own memory instead, and still reads
        what the WAL holds; the database is locked against every other connection while it
        reads, so these reads run one at a time and each closes its connection at once.
        """
        with self._alone_lock:
            self._check_open()
            try:
                conn = connect(self.path, self.busy_timeout)
            except sqlite3.Error as exc:
                raise open_error(self.path, exc) from exc
            try:
                conn.execute("PRAGMA locking_mode = EXCLUSIVE")
                conn.execute("PRAGMA query_only = ON")
                return self.retry(lambda: fn(conn))
            except sqlite3.Error as exc:
                raise open_error(self.path, exc) from exc
            finally:
                conn.close()

    def _check_open(self) -> None:
        with self._lock:
            if self._closed:
                raise StorageClosedError("SQLiteCheckpointStorage is closed")

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
            conn = connect(self.path, self.busy_timeout)
            conn.execute("PRAGMA query_only = ON")
            conn.execute(f"PRAGMA cache_size = {_CACHE_KIB}")
        except sqlite3.Error as exc:
            raise open_error(self.path, exc) from exc
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
    """Every workflow id, sorted (UTF-8 byte order is code point order); foreign ones skipped."""
    ids = [row[0] for row in conn.execute(_WORKFLOWS).fetchall()]
    valid = [wf for wf in ids if id_problem(wf) is None]
    warn_skipped("checkpoints", len(ids) - len(valid))
    return valid


def _row_problem(workflow_id: object, step: object, kind: str) -> str | None:
    problem = id_problem(workflow_id)
    if problem is not None:
        return problem
    if type(step) is not int or step < 0:
        return f"step {step!r} is not an integer >= 0"
    if kind != "blob":
        return f"the record is stored as {kind}, not as a blob"
    return None


def foreign_checkpoints(conn: sqlite3.Connection) -> list[ForeignRow]:
    """The rows of the ``checkpoints`` table that the library could not have written."""
    foreign: list[ForeignRow] = []
    for rowid, workflow_id, step, kind in conn.execute(_ALL_ROWS).fetchall():
        problem = _row_problem(workflow_id, step, kind)
        if problem is not None:
            foreign.append(ForeignRow("checkpoints", rowid, problem))
    return foreign
