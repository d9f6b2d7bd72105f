"""The CRC-32 every stored checksum uses (``zlib.crc32``), in one place.

Record headers, the file store's packs and step files, and a tree record's
``state.text_crc32`` all hold the standard CRC-32 (the polynomial of zlib, gzip and PNG).

zlib-ng's ``crc32`` gives the same values ~10x faster, and was tried: like ``zlib.crc32``
it lets other threads run while it reads a buffer of a few KB or more, but it is back
within ~3 us, so a store's read thread that checksums a large state run by run (a call
every ~1 ms) takes the GIL back before the event loop's thread, waiting for it, wakes, and
every such hand-over restarts that thread's wait: reading a 50,000-message chat stalled
the loop for 25-40 ms, against 2-5 ms with ``zlib.crc32`` (bench/NOTES.md, "Resume at
the floor"). Its gain on a 10 MB resume was ~1 ms of CPU.
"""

from __future__ import annotations

from zlib import crc32

__all__ = ["crc32"]
