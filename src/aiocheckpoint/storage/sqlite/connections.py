"""Opening the database file: its private creation, connections, busy retries, error mapping.

Code for the database threads only. Every connection (the writer's, the readers', the
checkpointer's) comes from :func:`connect`; every ``sqlite3.Error`` leaves the package as a
:class:`~aiocheckpoint.StorageBackendError` made by :func:`backend_error`.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from ...errors import StorageBackendError

T = TypeVar("T")

_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6


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


def create_private(path: Path) -> bool:
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


def fsync_dir(path: Path) -> None:
    """Make the directory entries of the database and its WAL file durable."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
