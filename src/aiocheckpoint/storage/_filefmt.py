"""On-disk pieces of the file store: workflow name encoding, the latest-step hint, OS calls.

Kept apart from :mod:`aiocheckpoint.storage.file` so each part stays small and testable.
See docs/file-storage.md for the format these functions implement.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import platform
import struct
import sys
import uuid
import zlib
from collections.abc import Callable
from typing import Final

__all__ = [
    "HASHED_PREFIX",
    "MAX_PLAIN_NAME",
    "Hint",
    "decode_name",
    "encode_name",
    "hashed_name",
    "FileOps",
    "is_missing",
    "parse_step_name",
    "pid_is_dead",
    "step_name",
    "temp_name",
]

#: Encoded names longer than this are replaced by a hash-derived name.
MAX_PLAIN_NAME: Final = 200
HASHED_PREFIX: Final = "#"

# Lower-case letters, digits, '_', '-', '.' are kept; upper case is escaped so that two
# names never differ only by case (case-insensitive filesystems stay collision-free).
_KEEP: Final = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_-.")
_HEX: Final = "0123456789ABCDEF"
_MAX_STEP: Final = 2**63 - 1


def hashed_name(raw: bytes) -> str:
    """The fixed-length directory name used for ids whose encoding is too long."""
    return HASHED_PREFIX + hashlib.blake2b(raw, digest_size=32).hexdigest()


@functools.lru_cache(maxsize=4096)  # a store writes the same workflows over and over
def encode_name(workflow_id: str) -> str:
    """Return the directory name of ``workflow_id`` (reversible, collision-free).

    Every UTF-8 byte outside ``[a-z0-9_.-]`` (and a leading ``.``) becomes ``%XX`` with
    upper-case hex; a result over :data:`MAX_PLAIN_NAME` characters becomes
    ``#`` + the 64-hex-digit BLAKE2b-256 of the id.
    """
    raw = workflow_id.encode("utf-8")
    parts = [
        chr(b) if b in _KEEP and not (i == 0 and b == 0x2E) else f"%{b:02X}"
        for i, b in enumerate(raw)
    ]
    name = "".join(parts)
    return hashed_name(raw) if len(name) > MAX_PLAIN_NAME else name


def decode_name(name: str) -> str | None:
    """Invert :func:`encode_name` for a plain (non-hashed) name; None if not canonical."""
    out = bytearray()
    i = 0
    while i < len(name):
        ch = name[i]
        if ch == "%" and i + 2 < len(name) and name[i + 1] in _HEX and name[i + 2] in _HEX:
            out.append(int(name[i + 1 : i + 3], 16))
            i += 3
        elif ord(ch) < 128 and ord(ch) in _KEEP:
            out.append(ord(ch))
            i += 1
        else:
            return None
    try:
        workflow_id = out.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Only the canonical spelling of an id counts: "%61" is not "a", foreign names are ignored.
    if not workflow_id or "\x00" in workflow_id or encode_name(workflow_id) != name:
        return None
    return workflow_id


def step_name(step: int) -> str:
    """File name of a step: 20 zero-padded digits, so names sort numerically."""
    return f"{step:020d}.ckpt"


def parse_step_name(name: str) -> int | None:
    """The step a file name stands for, or None for anything that is not a step file."""
    digits = name[:20]
    if len(name) != 25 or not name.endswith(".ckpt") or not (digits.isascii() and digits.isdigit()):
        return None
    step = int(digits)
    return step if step <= _MAX_STEP else None


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


_PID_NS: Final = _pid_namespace()


def temp_name(kind: str = "tmp") -> str:
    """A unique temporary name: ``.<kind>-<pid namespace>-<pid>-<uuid4 hex>``."""
    return f".{kind}-{_PID_NS}-{os.getpid()}-{uuid.uuid4().hex}"


def pid_is_dead(name: str) -> bool:
    """Whether the process that made temporary ``name`` is known to be gone.

    Only a process in our own pid namespace can be checked; for others this is False.
    """
    parts = name.split("-")
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return False
    if int(parts[1]) != _PID_NS or _PID_NS == 0:
        return False
    pid = int(parts[2])
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


class Hint:
    """The ``latest`` file: an upper bound of the workflow's steps, exact when it exists.

    Layout (28 bytes, big-endian): magic ``ACKH``, version 1, flags (1: names a step,
    0: the workflow is empty), 2 reserved bytes, the 8-byte inode of the workflow
    directory (so a copied or restored directory does not trust it), the 8-byte step,
    and the CRC-32 of the 24 bytes before it.
    """

    MAGIC: Final = b"ACKH"
    _STRUCT: Final = struct.Struct(">4sBB2xQQ")
    SIZE: Final = _STRUCT.size + 4

    __slots__ = ("dir_ino", "step")

    def __init__(self, step: int | None, dir_ino: int) -> None:
        self.step = step
        self.dir_ino = dir_ino

    def pack(self) -> bytes:
        """The bytes written to the hint file."""
        flags = 0 if self.step is None else 1
        body = self._STRUCT.pack(self.MAGIC, 1, flags, self.dir_ino, self.step or 0)
        return body + struct.pack(">I", zlib.crc32(body))

    @classmethod
    def unpack(cls, data: bytes) -> Hint | None:
        """Parse a hint; None when it is short, torn, foreign or of another version."""
        if len(data) != cls.SIZE:
            return None
        body, (crc,) = data[:-4], struct.unpack(">I", data[-4:])
        if zlib.crc32(body) != crc:
            return None
        magic, version, flags, dir_ino, step = cls._STRUCT.unpack(body)
        if magic != cls.MAGIC or version != 1 or flags not in (0, 1) or step > _MAX_STEP:
            return None
        return cls(step if flags else None, dir_ino)


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

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        """``os.mkdir`` followed by ``chmod`` so the umask cannot widen or narrow the mode."""
        os.mkdir(path, mode)
        os.chmod(path, mode)

    def close(self, fd: int) -> None:
        """``os.close``."""
        os.close(fd)


def is_missing(exc: OSError) -> bool:
    """Whether an OSError means "no such file or directory"."""
    return exc.errno in (errno.ENOENT, errno.ENOTDIR)
