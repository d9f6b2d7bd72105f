"""Opening the database file: its private creation, connections, busy retries, error mapping.

Code for the database threads only. Every connection (the writer's, the readers', the
checkpointer's) comes from :func:`connect`; every ``sqlite3.Error`` leaves the package as a
:class:`~aiocheckpoint.StorageBackendError` made by :func:`backend_error`.

SQLite is only ever given a ``file:`` URI that :func:`database_uri` builds from the absolute
path: this SQLite build (``SQLITE_USE_URI``) reads a plain name starting with ``file:`` as a
URI even when the caller asks for none, so the name ``file:/abs/p.db`` would open
``/abs/p.db`` while the library created and checked ``./file:/abs/p.db``, and ``:memory:``
would open a database that is not on disk at all.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar
from urllib.parse import quote

from ...errors import StorageBackendError, StorageFullError
from ..diskfull import disk_full, storage_error
from ..private import refuse_unless_private

T = TypeVar("T")

logger = logging.getLogger(__name__)

_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_IOERR: Final = 10


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLITE_BUSY or SQLITE_LOCKED (any extended code), worth a retry."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    message = str(exc).lower()
    return "locked" in message or "busy" in message


def open_error(path: Path, exc: BaseException) -> StorageBackendError:
    """Why ``path`` could not be opened; a full disk says so (see :func:`no_space_to_open`)."""
    message = f"cannot open SQLite database {str(path)!r}"
    if not no_space_to_open(path, exc):
        return backend_error(message, exc)
    error = StorageFullError(f"disk full: {message}: {exc} (the filesystem has no free space)")
    error.__cause__ = exc
    return error


def no_space_to_open(path: Path, exc: BaseException) -> bool:
    """Whether opening ``path`` failed for want of space.

    A WAL connection sizes its ``-shm`` file by writing to it, and on a full disk SQLite
    reports that as a plain I/O error (``SQLITE_IOERR``); the filesystem's free space says
    which it was.
    """
    if disk_full(exc):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or code & 0xFF != _SQLITE_IOERR:
        return False
    try:
        return os.statvfs(path.parent).f_bavail == 0
    except OSError:
        return False


def backend_error(message: str, exc: BaseException) -> StorageBackendError:
    """A :class:`StorageBackendError` with ``exc`` chained (``StorageFullError`` if full)."""
    return storage_error(message, exc, exc)


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
                # Expected with other processes writing: no warning, no traceback.
                logger.debug("SQLite is busy (%s); retry %d of %d", exc, attempt + 1, self.retries)
            delay = min(self.cap, self.base * 2**attempt)
            time.sleep(delay * (0.5 + random.random()))
            attempt += 1


def database_uri(path: Path) -> str:
    """The ``file:`` URI of ``path``, absolute, with every special byte percent-escaped.

    Every byte but ``/`` and the unreserved ones is escaped, so no part of the name reads as
    a URI parameter (``?mode=...``) or a fragment.
    """
    return "file://" + quote(os.fsencode(path.absolute()), safe="/")


def _text(value: bytes) -> str:
    # TEXT that is not UTF-8 (written by hand) decodes with surrogates instead of failing the
    # whole query: the id checks then report the one row as foreign.
    return value.decode("utf-8", "surrogateescape")


def connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """An autocommit connection to the database file ``path``, usable from one thread at a time."""
    conn = sqlite3.connect(
        database_uri(path),
        timeout=busy_timeout,
        isolation_level=None,
        check_same_thread=False,
        uri=True,
    )
    conn.text_factory = _text
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


#: The database files whose directory entry this process made durable: (device, inode) ->
#: the file's ctime then. One entry per database file, whatever the number of opens.
_DURABLE: dict[tuple[int, int], int] = {}
_DURABLE_LOCK = threading.Lock()


def fsync_dir_once(path: Path) -> None:
    """Make database ``path``'s directory entry durable, once per file and process.

    Opening a database this process already made durable skips the directory fsync, the
    largest cost of an open (a manager per request opens it every time). A file replaced
    meanwhile (deleted and created again, renamed over) has a new inode or ctime and is
    fsynced again. The WAL file's entry is SQLite's own: it fsyncs the directory at the
    first sync of a WAL file it created.
    """
    info = os.stat(path)
    key, ctime = (info.st_dev, info.st_ino), info.st_ctime_ns
    with _DURABLE_LOCK:
        if _DURABLE.get(key) == ctime:
            return
    fsync_dir(path.parent)
    with _DURABLE_LOCK:
        _DURABLE[key] = ctime


def secure_files(path: Path) -> None:
    """Refuse the database file, or its -wal or -shm, if another user could have planted it.

    Each of them that exists as a regular file must be owned by this process's effective
    user and grant group and others no write permission; otherwise
    :class:`~aiocheckpoint.errors.StoragePermissionError` names it (its content may be
    forged). One of ours that group or others may only read is made owner-only before
    anything is written to it, as a new file is. Other kinds of entries are left to SQLite,
    which refuses them itself.
    """
    if not hasattr(os, "geteuid"):
        return  # no POSIX owners: nothing to check
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            info = os.stat(file)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        refuse_unless_private(str(file), info, "SQLite file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o044:
            os.chmod(file, mode & 0o700)
            logger.info("made %s owner-only (its mode was %04o)", file, mode)
