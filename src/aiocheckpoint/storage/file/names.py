"""What the file store's files are called and what its small files hold.

Workflow directory names (``encode_name``), step and temporary file names, the format
marker ``aiocheckpoint.json`` and the latest-step hint (:class:`Hint`): pure functions of
names and bytes, no I/O. docs/file-storage.md describes the format they implement.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import uuid
from typing import Final

from ...errors import StorageSchemaError
from ...format.checksum import crc32

__all__ = [
    "FORMAT_BLOBS",
    "FORMAT_PLAIN",
    "FORMAT_VERSION",
    "HASHED_PREFIX",
    "HINT",
    "ID_FILE",
    "LOCK",
    "LOCKS",
    "MARKER",
    "MAX_PLAIN_NAME",
    "WORKFLOWS",
    "Hint",
    "decode_name",
    "encode_marker",
    "encode_name",
    "hashed_name",
    "parse_marker",
    "parse_step_name",
    "pid_is_dead",
    "step_name",
    "temp_name",
]

#: The newest on-disk format this version reads and writes; higher ones are refused.
#: A store is marked format 1 until its first blob is written, then format 3 (version-2
#: records, blobs in pack files), so that versions without pack support refuse it cleanly.
#: Format 2 (blobs as one file each) is still read and collected; its next blob write
#: marks it format 3.
FORMAT_VERSION: Final = 3
FORMAT_PLAIN: Final = 1
FORMAT_BLOBS: Final = 2
MARKER: Final = "aiocheckpoint.json"
WORKFLOWS: Final = "workflows"
#: The directory of ``base_dir`` holding the integrations' writer locks (``writers.py``).
LOCKS: Final = "locks"
LOCK: Final = "lock"
HINT: Final = "latest"
ID_FILE: Final = "id"

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
        return body + struct.pack(">I", crc32(body))

    @classmethod
    def unpack(cls, data: bytes) -> Hint | None:
        """Parse a hint; None when it is short, torn, foreign or of another version."""
        if len(data) != cls.SIZE:
            return None
        body, (crc,) = data[:-4], struct.unpack(">I", data[-4:])
        if crc32(body) != crc:
            return None
        magic, version, flags, dir_ino, step = cls._STRUCT.unpack(body)
        if magic != cls.MAGIC or version != 1 or flags not in (0, 1) or step > _MAX_STEP:
            return None
        return cls(step if flags else None, dir_ino)


def encode_marker(fmt: int) -> bytes:
    """The bytes of ``aiocheckpoint.json`` for format ``fmt``."""
    return json.dumps({"format": fmt}).encode() + b"\n"


def parse_marker(raw: bytes, path: str, base: str) -> int:
    """The format ``aiocheckpoint.json`` names; :class:`StorageSchemaError` unless readable."""
    try:
        fmt = json.loads(raw)["format"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageSchemaError(f"{path} is not an aiocheckpoint format marker") from exc
    if type(fmt) is not int or fmt < 1:
        raise StorageSchemaError(f"{path} names an unknown format {fmt!r}")
    if fmt > FORMAT_VERSION:
        raise StorageSchemaError(
            f"{base} uses file store format {fmt}; this version of aiocheckpoint "
            f"reads formats up to {FORMAT_VERSION} only (upgrade aiocheckpoint)"
        )
    return fmt
