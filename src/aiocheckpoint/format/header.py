"""The 20-byte header every record starts with.

::

    offset size  field
    0      4     magic  b"ACKP"
    4      1     format version (1: a whole JSON body, 2: a tree of blobs)
    5      1     flags (0; reserved)
    6      2     reserved (0)
    8      8     body length, big-endian
    16     4     CRC-32 of the body, big-endian

The body of a version-1 record is described in :mod:`aiocheckpoint.codec.v1`, that of a
version-2 record in :mod:`aiocheckpoint.format.tree`.
"""

from __future__ import annotations

import struct
from typing import Final

from ..errors import CheckpointCorruptedError

__all__ = [
    "FORMAT_VERSION",
    "FORMAT_VERSION_2",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "read_header",
    "record_format_version",
]

MAGIC: Final = b"ACKP"
#: A record whose body is the whole checkpoint as JSON.
FORMAT_VERSION: Final = 1
#: A record whose body holds the checkpoint's fields and the root of a tree of blobs.
FORMAT_VERSION_2: Final = 2
#: magic, version, flags, reserved, body length, CRC-32 of the body.
HEADER: Final = struct.Struct(">4sBBHQI")
HEADER_SIZE: Final = HEADER.size


def read_header(data: bytes) -> tuple[int, int, int]:
    """Parse a version-1 record header; return ``(format_version, body_length, crc32)``.

    Raises :class:`CheckpointCorruptedError` when the bytes are not a record.
    """
    if len(data) < HEADER_SIZE:
        raise CheckpointCorruptedError(f"record too short ({len(data)} bytes)")
    magic, version, flags, reserved, length, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointCorruptedError("not an aiocheckpoint record (bad magic)")
    if version != FORMAT_VERSION:
        raise CheckpointCorruptedError(f"unknown record format version {version}")
    if flags != 0:
        raise CheckpointCorruptedError(f"unknown record flags {flags:#x}")
    if reserved != 0:
        raise CheckpointCorruptedError(f"reserved header bytes are not zero ({reserved:#x})")
    return version, length, crc


def record_format_version(record: bytes) -> int:
    """The format version of a record (1 or 2); bad magic raises CheckpointCorruptedError."""
    if len(record) < HEADER_SIZE or record[:4] != MAGIC:
        raise CheckpointCorruptedError("not an aiocheckpoint record (bad magic)")
    return record[4]
