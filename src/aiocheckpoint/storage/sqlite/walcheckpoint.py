"""WAL checkpoints: when they run, and the connection that runs them beside the commits.

SQLite's automatic checkpoint is turned off on the write connection (it would run inside a
``COMMIT`` and make that whole batch wait); the store schedules ``PASSIVE`` checkpoints
itself (docs/sqlite-storage.md "WAL checkpoints"). :class:`Checkpointer` runs them on a
connection and a thread of their own; the writer runs one itself between two batches when
the WAL has grown past :data:`WAL_LIMIT_PAGES`.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .connections import connect

logger = logging.getLogger(__name__)

#: Estimated WAL pages written since the last checkpoint after which a background
#: checkpoint starts (SQLite's automatic checkpoint, turned off here, uses 1,000).
CHECKPOINT_PAGES: Final = 1000
#: The same while a background write (a sweep's slices) runs: a checkpoint copies its pages
#: into the database file and fsyncs it, and a save's fsync beside it waited for those
#: writes (commits of 20-30 ms, ``bench/sweep_writers.py --trace``). Smaller checkpoints,
#: more often, cost the sweep nothing measurable and its writers' p99 less.
BACKGROUND_CHECKPOINT_PAGES: Final = 250
#: WAL length (frames) at which the writer itself finishes a checkpoint between two batches,
#: so that the next transaction starts the WAL over: the bound when the writer is never idle.
WAL_LIMIT_PAGES: Final = 4000
#: The same bound while a background write (a sweep's slices, its vacuum) runs. Each
#: catch-up copies what was committed during the background checkpoint before it and fsyncs
#: the database file, with the saves queued meanwhile waiting: a sweep that writes steadily
#: made one every ~1.5 s, the slowest saves' wait. SQLite's ``journal_size_limit`` here.
BACKGROUND_WAL_LIMIT_PAGES: Final = 16384


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
                conn = connect(self.path, self.busy_timeout)
                # FULL: the database file is fsynced before the WAL may start over, whatever
                # this build's default for a new connection.
                conn.execute("PRAGMA synchronous = FULL")
                self.conn = conn
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
