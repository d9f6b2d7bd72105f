"""The file store's OS calls: the :class:`FileOps` seam and the helpers built on it.

Every call of the write path goes through a :class:`FileOps` object so that tests can inject
faults (``storage._os``); the helpers below create, fsync, read and remove the store's files
with the flags every one of them needs (``O_NOFOLLOW``, ``O_CLOEXEC``, ``O_EXCL``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import stat
import sys
from collections.abc import Callable
from typing import Final

from .names import temp_name

__all__ = [
    "DIR_FLAGS",
    "NEW_FLAGS",
    "OPEN_FLAGS",
    "READ_FLAGS",
    "FileOps",
    "OddEntry",
    "discard",
    "fsync_path",
    "fsynced_file",
    "is_missing",
    "open_regular",
    "read_bounded",
    "read_small",
    "write_temp",
]

logger = logging.getLogger(__name__)

#: On every open: never through a symlink, never a device as controlling terminal.
OPEN_FLAGS: Final = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY
DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS
#: Every read of a store file: never through a symlink, never waiting for a FIFO's writer.
READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS
NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS


def _find_syncfs() -> Callable[[int], int] | None:
    """The C library's ``syncfs(2)`` on Linux 5.8 and later only; None elsewhere.

    Before 5.8 ``syncfs`` reported no write-back errors, so a failed write of a record
    could go unnoticed: there the store fsyncs file by file instead.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        version = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
        if version < (5, 8):
            return None
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError, ValueError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_SYNCFS: Final = _find_syncfs()


class FileOps:
    """Every OS call the write path makes, in one object so tests can inject faults.

    A test replaces ``storage._os`` with a subclass whose methods raise ``OSError``
    (ENOSPC, EIO, ...) at chosen calls.
    """

    #: Whether :meth:`syncfs` is available (Linux 5.8 or later).
    has_syncfs: bool = _SYNCFS is not None

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        """``os.open``."""
        return os.open(path, flags, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: memoryview) -> int:
        """``os.write``: may write fewer bytes than given."""
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """``os.pwrite``."""
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        """Flush a file's data to stable storage (F_FULLFSYNC on macOS)."""
        if sys.platform == "darwin":  # pragma: no cover - plain fsync skips the disk cache
            import fcntl

            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
        elif hasattr(os, "fdatasync"):
            os.fdatasync(fd)
        else:  # pragma: no cover
            os.fsync(fd)

    def fsync_dir(self, fd: int) -> None:
        """Make a directory's entries (creates, renames, unlinks) durable."""
        os.fsync(fd)

    def syncfs(self, fd: int) -> None:
        """Make everything written to the filesystem holding ``fd`` durable (``syncfs(2)``).

        It reports write-back errors of any file of that filesystem since ``fd`` was
        opened, so a caller opens ``fd`` before it writes the data this must cover.
        """
        if _SYNCFS is None:
            raise OSError(errno.ENOSYS, "syncfs is not available here")
        if _SYNCFS(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        """``os.rename`` (atomically replaces ``dst``)."""
        os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, path: str, *, dir_fd: int | None = None) -> None:
        """``os.unlink``."""
        os.unlink(path, dir_fd=dir_fd)

    def mkdir(self, path: str, mode: int = 0o700, *, dir_fd: int | None = None) -> None:
        """``os.mkdir`` followed by ``chmod`` so the umask cannot widen or narrow the mode."""
        os.mkdir(path, mode, dir_fd=dir_fd)
        os.chmod(path, mode, dir_fd=dir_fd, follow_symlinks=False)

    def close(self, fd: int) -> None:
        """``os.close``."""
        os.close(fd)


def is_missing(exc: OSError) -> bool:
    """Whether an OSError means "no such file or directory"."""
    return exc.errno in (errno.ENOENT, errno.ENOTDIR)


def fsynced_file(ops: FileOps, dfd: int, name: str, data: bytes, *, durable: bool = True) -> int:
    """Create ``name`` (0600, must not exist), write and fsync ``data``; return the fd.

    ``durable=False`` skips the fsync: the caller makes the data durable some other way.
    """
    fd = ops.open(name, NEW_FLAGS, 0o600, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[ops.write(fd, view) :]
        if durable:
            ops.fsync(fd)
    except BaseException:
        os.close(fd)
        discard(name, dfd)
        raise
    return fd


def write_temp(ops: FileOps, dfd: int, data: bytes, *, durable: bool = True) -> str:
    """Write ``data`` to a new temporary file in ``dfd`` (fsynced unless not ``durable``)."""
    tmp = temp_name()
    fd = fsynced_file(ops, dfd, tmp, data, durable=durable)
    try:
        ops.close(fd)
    except BaseException:
        discard(tmp, dfd)
        raise
    return tmp


def discard(name: str, dfd: int) -> None:
    """Remove ``name`` from ``dfd`` if it is there (a failure is logged, not raised)."""
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError as exc:
        if not is_missing(exc):
            logger.warning("could not remove temporary file %r: %s", name, exc)


def fsync_path(ops: FileOps, directory: str) -> None:
    """Make the entries of ``directory`` durable."""
    dfd = os.open(directory, DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        ops.fsync_dir(dfd)
    finally:
        os.close(dfd)


class OddEntry(Exception):
    """A store path holds something other than the regular file the store put there.

    A FIFO, socket, device, directory or symlink, or a file over the size limit: the
    message says which. Callers report it (a typed error, or a warning) and skip it.
    """


def open_regular(name: str, dfd: int | None) -> int | None:
    """Open store file ``name`` for reading; None if it does not exist.

    Non-blocking (a FIFO does not wait for a writer) and never through a symlink; raises
    :class:`OddEntry` unless it is a regular file.
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if is_missing(exc):
            return None
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):
            raise OddEntry("not a regular file (a symlink, socket or device)") from exc
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OddEntry(f"not a regular file ({_KINDS.get(stat.S_IFMT(mode), 'special')})")
    return fd


_KINDS: Final = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symlink",
}


def read_bounded(fd: int, limit: int, *, head: bytes = b"") -> bytes:
    """The rest of the regular file open as ``fd`` after ``head``, if at most ``limit`` bytes.

    Raises :class:`OddEntry` when the file is (or grows) larger than ``limit``: nothing
    larger is ever read into memory, however large a (sparse) file claims to be.
    """
    size = os.fstat(fd).st_size
    if size > limit:
        raise OddEntry(f"file is {size} bytes, over max_record_bytes={limit}")
    chunks = [head]
    total = len(head)
    while chunk := os.read(fd, max(size - total, 0) + 1):
        total += len(chunk)
        if total > limit:
            raise OddEntry(f"file grew over max_record_bytes={limit}")
        chunks.append(chunk)
    return b"".join(chunks)


def read_small(name: str, dfd: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a small store file in ``dfd``.

    None if it does not exist or is not a regular file (logged: an odd entry is skipped).
    """
    try:
        fd = open_regular(name, dfd)
    except OddEntry as exc:
        logger.warning("ignoring %r: %s", name, exc)
        return None
    if fd is None:
        return None
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)
