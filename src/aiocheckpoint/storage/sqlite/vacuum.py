"""Giving freed pages back to the filesystem: incremental vacuum after sweeps, and compaction.

Code for the writer thread only. A store created by this version is
``auto_vacuum=INCREMENTAL`` (:func:`incremental_if_new`, which must run before the first
table is created): the pages a sweep frees stay on SQLite's free list until
:func:`vacuum_pages` moves the pages in use at the end of the file into them and truncates
it, a slice at a time in the writer's transactions (background writes, as a sweep's deletes
are). An older store (``auto_vacuum=NONE``) reuses its free pages for new writes but never
shrinks; :func:`compact` rewrites it (``VACUUM``) and makes
it incremental on the way.
"""

from __future__ import annotations

import sqlite3
from typing import Final

__all__ = ["INCREMENTAL", "compact", "incremental_if_new", "page_size", "vacuum_pages"]

#: ``PRAGMA auto_vacuum``'s value for INCREMENTAL.
INCREMENTAL: Final = 2


def _pragma(conn: sqlite3.Connection, name: str) -> int:
    return int(conn.execute(f"PRAGMA {name}").fetchall()[0][0])


def incremental_if_new(conn: sqlite3.Connection) -> None:
    """Make a database without tables yet ``auto_vacuum=INCREMENTAL`` (a no-op otherwise)."""
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchall()[0][0]
    if tables == 0 and _pragma(conn, "user_version") == 0:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")


def page_size(conn: sqlite3.Connection) -> int:
    """The database's page size in bytes."""
    return _pragma(conn, "page_size")


def vacuum_pages(conn: sqlite3.Connection, pages: int) -> tuple[int, int]:
    """Give up to ``pages`` free pages back, in the caller's transaction; (freed, left).

    A store that is not incremental frees nothing: (0, 0).
    """
    if _pragma(conn, "auto_vacuum") != INCREMENTAL:
        return 0, 0
    before = _pragma(conn, "freelist_count")
    # One page per statement: Python's sqlite3 steps a pragma without result columns once,
    # and executescript() would commit the writer's transaction first.
    for _ in range(min(pages, before)):
        conn.execute("PRAGMA incremental_vacuum(1)")
    after = _pragma(conn, "freelist_count")
    return before - after, after


def compact(conn: sqlite3.Connection) -> tuple[int, int]:
    """Rewrite the database whole (``VACUUM``), incremental from now on; (bytes before, after).

    Outside any transaction; it needs as much free disk as the database's size.
    """
    size = page_size(conn)
    before = _pragma(conn, "page_count") * size
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("VACUUM")
    return before, _pragma(conn, "page_count") * size
