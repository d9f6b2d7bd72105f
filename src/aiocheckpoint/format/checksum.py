"""The CRC-32 every stored checksum uses (``zlib.crc32``), in one place.

Record headers, the file store's packs and step files, and a tree record's
``state.text_crc32`` all hold the standard CRC-32 (the polynomial of zlib, gzip and PNG).

``zlib.crc32`` releases the GIL while it reads a buffer of a few KB or more, for long
enough that the event loop's thread, waiting for the GIL while a store's read thread
checksums a large state run by run, takes it in between. A faster implementation that
returns within microseconds (zlib-ng's) takes the GIL back before the loop's thread wakes,
and stalls the loop for tens of milliseconds on a large resume (bench/NOTES.md, "Resume at
the floor").
"""

from __future__ import annotations

from zlib import crc32

__all__ = ["crc32"]
