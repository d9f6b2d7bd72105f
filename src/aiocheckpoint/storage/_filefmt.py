"""On-disk pieces of the file store: workflow name encoding, the latest-step hint, OS calls.

Kept apart from :mod:`aiocheckpoint.storage.file` so each part stays small and testable.
See docs/file-storage.md for the format these functions implement.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import struct
import sys
import uuid
import zlib
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
    "read_boot_id",
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
_STEP_RE: Final = re.compile(r"[0-9]{20}\.ckpt")
_MAX_STEP: Final = 2**63 - 1


def hashed_name(raw: bytes) -> str:
    """The fixed-length directory name used for ids whose encoding is too long."""
    return HASHED_PREFIX + hashlib.blake2b(raw, digest_size=32).hexdigest()


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
    if len(name) != 25 or not _STEP_RE.fullmatch(name):
        return None
    step = int(name[:20])
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


def read_boot_id() -> bytes | None:
    """The kernel's boot id (16 bytes), which changes at every boot; None if unavailable."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return uuid.UUID(f.read().decode().strip()).bytes
    except (OSError, ValueError):
        return None


class Hint:
    """The ``latest`` file: which step is the highest, valid for one directory and boot.

    Layout (44 bytes, big-endian): magic ``ACKH``, version 1, flags (1: has a step,
    0: the workflow is empty), 2 reserved bytes, 16-byte boot id (zeros if unknown),
    8-byte inode of the workflow directory, 8-byte step, CRC-32 of the 40 bytes before it.
    """

    MAGIC: Final = b"ACKH"
    _STRUCT: Final = struct.Struct(">4sBB2x16sQQ")
    SIZE: Final = _STRUCT.size + 4

    __slots__ = ("boot_id", "dir_ino", "step")

    def __init__(self, step: int | None, boot_id: bytes, dir_ino: int) -> None:
        self.step = step
        self.boot_id = boot_id
        self.dir_ino = dir_ino

    def pack(self) -> bytes:
        """The 44 bytes written to the hint file."""
        flags = 0 if self.step is None else 1
        body = self._STRUCT.pack(self.MAGIC, 1, flags, self.boot_id, self.dir_ino, self.step or 0)
        return body + struct.pack(">I", zlib.crc32(body))

    @classmethod
    def unpack(cls, data: bytes) -> Hint | None:
        """Parse a hint; None when it is short, torn, foreign or of another version."""
        if len(data) != cls.SIZE:
            return None
        body, (crc,) = data[:-4], struct.unpack(">I", data[-4:])
        if zlib.crc32(body) != crc:
            return None
        magic, version, flags, boot_id, dir_ino, step = cls._STRUCT.unpack(body)
        if magic != cls.MAGIC or version != 1 or flags not in (0, 1) or step > _MAX_STEP:
            return None
        return cls(step if flags else None, boot_id, dir_ino)


class FileOps:
    """Every OS call the write path makes, in one object so tests can inject faults.

    A test replaces ``storage._os`` with a subclass whose methods raise ``OSError``
    (ENOSPC, EIO, ...) at chosen calls.
    """

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
