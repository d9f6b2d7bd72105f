"""How many workflows a sweep's page takes: sized by the time its writes take.

Used by :mod:`aiocheckpoint.retention` only (``docs/retention.md`` "Cost and the longest
pause").
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Final, TypeVar

__all__ = ["BATCH_SECONDS", "MAX_BATCH", "BatchSizer"]

_T = TypeVar("_T")

#: What one batch of a sweep aims to take, and the most workflows it takes (a page of
#: histories also stops where its records no longer fit one read: the sweep's own rule).
BATCH_SECONDS: Final = 0.05
MAX_BATCH: Final = 10_000


class BatchSizer:
    """How many workflows a sweep's batch takes: as many as its write deletes in ~50 ms.

    A batch's write holds up the writers waiting on its row locks (PostgreSQL) or, a
    slice at a time, queued behind it (SQLite's group commit), so batches are sized by the
    time their writes take, as the group commit sizes its own: doubled after a write under
    half the target (and after a batch with nothing to write), halved after one over twice
    it.
    """

    def __init__(self, start: int) -> None:
        #: Workflows the next batch takes.
        self.size = start

    async def timed(self, work: Awaitable[_T]) -> _T:
        """``work``'s result; its time sizes the next batch."""
        started = time.monotonic()
        result = await work
        elapsed = time.monotonic() - started
        if elapsed < BATCH_SECONDS / 2:
            self.grow()
        elif elapsed > BATCH_SECONDS * 2:
            self.size = max(self.size // 2, 1)
        return result

    def grow(self) -> None:
        """Double the next batch, up to :data:`MAX_BATCH`."""
        self.size = min(self.size * 2, max(self.size, MAX_BATCH))
