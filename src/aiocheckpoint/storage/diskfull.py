"""A full disk, said plainly: the backends' "no space" errors become :class:`StorageFullError`.

The OS says ``ENOSPC`` (or ``EDQUOT``, a quota), SQLite ``SQLITE_FULL`` ("database or disk is
full"), PostgreSQL SQLSTATE ``53100`` (``disk_full``). Each backend builds its errors with
:func:`storage_error`, so the message starts with "disk full" and the type says it whatever
the backend; the original exception stays the ``__cause__``.
"""

from __future__ import annotations

import errno
import sqlite3

from ..errors import StorageBackendError, StorageFullError

__all__ = ["disk_full", "storage_error"]

_SQLITE_FULL = 13


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the disk (or the database server's disk) is full."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return bool(code & 0xFF == _SQLITE_FULL)
        return "disk is full" in str(exc)
    return getattr(exc, "sqlstate", None) == "53100"


def storage_error(message: str, detail: object, exc: BaseException) -> StorageBackendError:
    """``message: detail``, caused by ``exc`` (chained): :class:`StorageFullError` if full."""
    error: StorageBackendError
    if disk_full(exc):
        error = StorageFullError(f"disk full: {message}: {detail}")
    else:
        error = StorageBackendError(f"{message}: {detail}")
    error.__cause__ = exc
    return error
