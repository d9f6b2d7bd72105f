"""The CRC-32 every stored checksum uses: ``zlib.crc32``'s values, computed ~10x faster.

Record headers, the file store's packs and step files, and a tree record's
``state.text_crc32`` all hold the standard CRC-32 (the polynomial of zlib, gzip and PNG).
``crc32`` is zlib-ng's, which uses the CPU's carry-less multiply instructions: ~0.2 ms
for the 10 MB text of a large state, where the ``zlib`` that CPython links spends ~1.7 ms
(``docs/performance.md``, "Resume at the floor"). The values are the same, so nothing
stored changes; like ``zlib.crc32`` it lets other threads run while it reads a large
buffer.
"""

from __future__ import annotations

from zlib_ng.zlib_ng import crc32

__all__ = ["crc32"]
