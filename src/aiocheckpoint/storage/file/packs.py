"""The bytes of the file store's pack files and of their combined index; no other I/O.

A pack (``blobs/packs/<24 hex>.pack``) is ``MAGIC``, the stored blobs back to back, an
index of fixed-size ``(hash, offset, length)`` entries and a fixed trailer (index offset,
entry count, CRC-32 of the index, hash length, ``_TRAILER_MAGIC``). The combined index
``blobs/packs.midx`` caches many packs' indexes (:func:`encode_midx`). docs/file-storage.md,
"Blobs and garbage collection", describes both.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Collection
from typing import Final

__all__ = [
    "GC_LOCK",
    "MAGIC",
    "MIDX",
    "PACKS",
    "PACK_SUFFIX",
    "TMP",
    "TRASH",
    "Index",
    "PackDamagedError",
    "decode_midx",
    "encode_midx",
    "encode_pack",
    "pack_base",
    "read_pack_index",
]

GC_LOCK: Final = "gc.lock"
TMP: Final = "tmp"
PACKS: Final = "packs"
PACK_SUFFIX: Final = ".pack"
#: The prefix of a pack (or format-2 blob file) a sweeper is deciding about.
TRASH: Final = ".gc-"
MAGIC: Final = b"ACKPACK\x01"
# index offset, entries, CRC-32 of the index, hash length, magic
_TRAILER: Final = struct.Struct(">QIIB7s")
_TRAILER_MAGIC: Final = b"ACKPIX1"
MIDX: Final = "packs.midx"
_MIDX_MAGIC: Final = b"ACKMIDX1"

#: Where each blob of a pack lies: hash -> (offset, length).
Index = dict[bytes, tuple[int, int]]


class PackDamagedError(ValueError):
    """A pack's trailer or index is malformed (its blobs count as missing)."""


def encode_pack(blobs: Collection[tuple[bytes, bytes]]) -> bytes:
    """The bytes of a pack of ``blobs``: ``(hash, stored blob)`` pairs, hashes of one length."""
    hlen = len(next(iter(blobs))[0]) if blobs else 0
    entry = _entry(hlen)
    index = bytearray(entry.size * len(blobs))
    parts: list[bytes | bytearray] = [MAGIC]
    offset = len(MAGIC)
    for i, (h, blob) in enumerate(blobs):
        if len(h) != hlen:
            raise ValueError("hashes of one pack must have one length")
        entry.pack_into(index, i * entry.size, h, offset, len(blob))
        parts.append(blob)
        offset += len(blob)
    parts.append(bytes(index))  # bytes only: then join releases the GIL while it copies
    parts.append(_TRAILER.pack(offset, len(blobs), zlib.crc32(index), hlen, _TRAILER_MAGIC))
    return b"".join(parts)


def read_pack_index(fd: int, size: int, max_blob: int) -> Index:
    """Parse the index of the pack open as ``fd`` (``size`` bytes long).

    Raises :class:`PackDamagedError` unless the trailer, the index checksum and every
    entry's bounds are right.
    """
    if size < len(MAGIC) + _TRAILER.size:
        raise PackDamagedError("too short for a pack")
    trailer = os.pread(fd, _TRAILER.size, size - _TRAILER.size)
    if len(trailer) != _TRAILER.size:
        raise PackDamagedError("short read of the trailer")
    start, count, crc, hlen, magic = _TRAILER.unpack(trailer)
    end = size - _TRAILER.size
    entry = _entry(hlen)
    if magic != _TRAILER_MAGIC or not len(MAGIC) <= start <= end:
        raise PackDamagedError("bad trailer")
    if end - start != count * entry.size:
        raise PackDamagedError("index size does not match its entry count")
    raw = os.pread(fd, end - start, start) if end > start else b""
    if len(raw) != end - start or zlib.crc32(raw) != crc:
        raise PackDamagedError("index checksum mismatch")
    return _parse_entries(entry, raw, start, max_blob)


def _entry(hlen: int) -> struct.Struct:
    """An index entry: a hash of ``hlen`` bytes, then its blob's offset and length."""
    return struct.Struct(f">{hlen}sQI")


def _parse_entries(entry: struct.Struct, raw: bytes, blob_end: int, max_blob: int) -> Index:
    """Index entries packed in ``raw``; each blob must lie in ``[len(MAGIC), blob_end)``."""
    index: Index = {}
    for h, offset, length in entry.iter_unpack(raw):
        if offset < len(MAGIC) or offset + length > blob_end or length > max_blob:
            raise PackDamagedError("index entry out of bounds")
        index[h] = (offset, length)
    return index


def encode_midx(indexes: dict[str, Index]) -> bytes:
    """The bytes of a combined index of the packs ``indexes`` describes.

    ``_MIDX_MAGIC``, then per pack its name (u8 length, ASCII), entry count (u32), hash
    length (u8) and its entries as in the pack's own index; then a CRC-32 of all that.
    """
    parts = [_MIDX_MAGIC]
    for name, index in indexes.items():
        if not index:
            continue
        hlen = len(next(iter(index)))
        entry = _entry(hlen)
        raw = name.encode("ascii")
        parts.append(bytes((len(raw),)) + raw + struct.pack(">IB", len(index), hlen))
        parts.append(b"".join([entry.pack(h, o, n) for h, (o, n) in index.items()]))
    body = b"".join(parts)
    return body + struct.pack(">I", zlib.crc32(body))


def decode_midx(data: bytes, max_blob: int) -> dict[str, Index]:
    """Parse a combined index; :class:`PackDamagedError` unless it is whole and plausible."""
    end = len(data) - 4
    if end < len(_MIDX_MAGIC) or not data.startswith(_MIDX_MAGIC):
        raise PackDamagedError("not a combined pack index")
    if zlib.crc32(memoryview(data)[:end]) != int.from_bytes(data[end:], "big"):
        raise PackDamagedError("combined index checksum mismatch")
    out: dict[str, Index] = {}
    pos = len(_MIDX_MAGIC)
    try:
        while pos < end:
            nlen = data[pos]
            name = data[pos + 1 : pos + 1 + nlen].decode("ascii")
            count, hlen = struct.unpack_from(">IB", data, pos + 1 + nlen)
            pos += 1 + nlen + 5
            entry = _entry(hlen)
            size = count * entry.size
            if pos + size > end:
                raise PackDamagedError("truncated combined index")
            # The pack's size is unknown here: a read past its end comes back short.
            out[name] = _parse_entries(entry, data[pos : pos + size], 2**64, max_blob)
            pos += size
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise PackDamagedError(f"malformed combined index ({exc})") from exc
    return out


def pack_base(name: str) -> str | None:
    """The pack name ``name`` stands for (``.gc-`` prefix removed), or None if not a pack."""
    if name.startswith(TRASH):
        name = name[len(TRASH) :]
    stem = name[: -len(PACK_SUFFIX)]
    if not name.endswith(PACK_SUFFIX) or not stem or name.startswith("."):
        return None
    return name
