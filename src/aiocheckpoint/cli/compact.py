"""``aiocheckpoint compact``: give a store's unused space back to the filesystem.

SQLite: ``VACUUM`` (the file rewritten whole; an older store becomes incremental, so later
sweeps give their freed pages back themselves). PostgreSQL: ``VACUUM (ANALYZE)`` of the
store's tables (dead rows reusable, statistics fresh; not ``VACUUM FULL``). A file store
and the in-memory store have nothing to compact: a file store frees a file as it deletes
it, and ``sweep`` collects its garbage blobs.
"""

from __future__ import annotations

import argparse

from ..storage.base import CompactingStorage
from .output import Output
from .store import open_store

__all__ = ["cmd_compact"]


async def cmd_compact(args: argparse.Namespace, out: Output) -> int:
    """Compact the store; print its bytes before and after."""
    async with open_store(args.url, must_exist=True, allow_shared=args.allow_shared) as manager:
        storage = manager.storage
        if not isinstance(storage, CompactingStorage):
            kind = type(storage).__name__
            if out.json_mode:
                out.json({"compacted": False, "storage": kind})
            else:
                out.line(f"{kind}: nothing to compact (it frees space as it deletes)")
            return 0
        before, after = await storage.compact()
    if out.json_mode:
        out.json({"compacted": True, "bytes_before": before, "bytes_after": after})
    else:
        out.line(f"compacted: {before:,} bytes -> {after:,} bytes ({before - after:,} given back)")
    return 0
