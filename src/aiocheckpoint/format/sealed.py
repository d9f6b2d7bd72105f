"""What backends read of an encrypted incremental checkpoint: addresses, never content.

An encrypted tree (``docs/encryption.md``) seals every node, but a backend still counts
references and collects garbage, so the addresses each sealed part references stay in the
clear in front of its envelope (:mod:`aiocheckpoint.codec.sealing`)::

    sealed tree record: header (version 2, flags 0x03, CRC-32 field 0) | digest: u8 |
                        n: u32 BE | n root references | envelope of the plain record
    sealed blob:        0x02 | n: u32 BE | n child names | envelope of the plain blob

A blob's name is keyed (an HMAC of its node), so a name reveals nothing about the content;
the references are part of the envelope's associated data, so changing them fails
authentication when the record or blob is read.
"""

from __future__ import annotations

import struct
from typing import Final

from ..errors import CheckpointCorruptedError
from .header import FORMAT_VERSION_2, HEADER, HEADER_SIZE, MAGIC

__all__ = [
    "BLOB_SEALED",
    "FLAG_REFS",
    "FLAG_SEALED",
    "blob_refs_end",
    "is_sealed_tree_record",
    "refs_block",
    "sealed_blob_children",
    "sealed_tree_refs",
    "tree_refs_end",
]

#: A record header's flags bit of a sealed record.
FLAG_SEALED: Final = 0x01
#: A record header's flags bit of a sealed record that lists its root references.
FLAG_REFS: Final = 0x02
#: The flags byte of a sealed blob.
BLOB_SEALED: Final = 0x02
_COUNT: Final = struct.Struct(">I")


def refs_block(refs: tuple[bytes, ...]) -> bytes:
    """``n: u32 BE`` and the ``n`` references, back to back."""
    return _COUNT.pack(len(refs)) + b"".join(refs)


def _refs(data: bytes, at: int, digest: int) -> tuple[tuple[bytes, ...], int]:
    """The references of the block at ``at`` and where the block ends."""
    if len(data) < at + 4:
        raise CheckpointCorruptedError("sealed part truncated")
    (count,) = _COUNT.unpack_from(data, at)
    start = at + 4
    end = start + count * digest
    if len(data) < end:
        raise CheckpointCorruptedError("sealed part truncated")
    return tuple(data[i : i + digest] for i in range(start, end, digest)), end


def is_sealed_tree_record(record: bytes) -> bool:
    """Whether a stored record is a sealed version-2 record (with its root references)."""
    return (
        len(record) > HEADER_SIZE
        and record[:4] == MAGIC
        and record[4] == FORMAT_VERSION_2
        and record[5] == FLAG_SEALED | FLAG_REFS
    )


def tree_refs_end(record: bytes) -> tuple[int, tuple[bytes, ...], int]:
    """A sealed tree record's digest size, root references and where its envelope starts."""
    _magic, _version, _flags, _reserved, length, _crc = HEADER.unpack_from(record)
    if len(record) - HEADER_SIZE != length:
        raise CheckpointCorruptedError("sealed record truncated or padded")
    digest = record[HEADER_SIZE]
    if not 16 <= digest <= 32:
        raise CheckpointCorruptedError("malformed sealed record")
    refs, end = _refs(record, HEADER_SIZE + 1, digest)
    return digest, refs, end


def sealed_tree_refs(record: bytes) -> tuple[bytes, ...]:
    """The distinct blob names a sealed tree record's root references."""
    return tuple(dict.fromkeys(tree_refs_end(record)[1]))


def blob_refs_end(blob: bytes, digest: int) -> tuple[tuple[bytes, ...], int]:
    """A sealed blob's child names and where its envelope starts."""
    if not blob or blob[0] != BLOB_SEALED:
        raise CheckpointCorruptedError("not a sealed blob")
    return _refs(blob, 1, digest)


def sealed_blob_children(blob: bytes, digest: int) -> tuple[bytes, ...]:
    """The distinct names a sealed blob references (stored distinct)."""
    return tuple(dict.fromkeys(blob_refs_end(blob, digest)[0]))
