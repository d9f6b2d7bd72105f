"""A sweep's pacing: how many workflows a page takes, how its judging shares the loop.

Pages are sized by the time their writes take. Used by :mod:`aiocheckpoint.retention` only
(``docs/retention.md`` "Cost and the longest pause").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from .codec import Pacer

__all__ = [
    "BATCH_SECONDS",
    "HOLD_SECONDS",
    "MAX_BATCH",
    "MAX_WRITE_REST",
    "REST_SECONDS",
    "WORK_SECONDS",
    "WRITE_REST_SHARE",
    "BatchSizer",
    "Turns",
]

_T = TypeVar("_T")

#: What one batch of a sweep aims to take, and the most workflows it takes (a page of
#: histories also stops where its records no longer fit one read: the sweep's own rule).
BATCH_SECONDS: Final = 0.05
MAX_BATCH: Final = 10_000
#: While saves are being made, a sweep's write waits this share of the last one's time
#: first: the writers then have the store to themselves half the time (``bench/NOTES.md``);
#: never longer than :data:`MAX_WRITE_REST` (a write that waited on a lock, say).
WRITE_REST_SHARE: Final = 1.0
MAX_WRITE_REST: Final = 1.0


class BatchSizer:
    """How many workflows a sweep's batch takes: as many as its write deletes in ~50 ms.

    A batch's write holds up the writers waiting on its row locks (PostgreSQL) or, a
    slice at a time, queued behind it (SQLite's group commit), so batches are sized by the
    time their writes take, as the group commit sizes its own: doubled after a write under
    half the target (and after a batch with nothing to write), halved after one over twice
    it. While ``saving()`` says saves are being made, each write first waits as long as the
    last one took (:data:`WRITE_REST_SHARE`, :data:`MAX_WRITE_REST` at most): a write of
    the sweep shares the disk (the WAL's flushes) and the server's CPU with the saves,
    which then take turns with it.
    """

    def __init__(self, start: int, saving: Callable[[], bool] | None = None) -> None:
        #: Workflows the next batch takes.
        self.size = start
        self._saving = saving
        self._last = 0.0

    async def timed(self, work: Awaitable[_T]) -> _T:
        """``work``'s result; its time sizes the next batch (and the next rest)."""
        if self._last and self._saving is not None and self._saving():
            await asyncio.sleep(min(self._last * WRITE_REST_SHARE, MAX_WRITE_REST))
        started = time.monotonic()
        result = await work
        elapsed = self._last = time.monotonic() - started
        if elapsed < BATCH_SECONDS / 2:
            self.grow()
        elif elapsed > BATCH_SECONDS * 2:
            self.size = max(self.size // 2, 1)
        return result

    def grow(self) -> None:
        """Double the next batch, up to :data:`MAX_BATCH`."""
        self.size = min(self.size * 2, max(self.size, MAX_BATCH))


#: The judging a sweep does on the loop between two rests, and the rest (the loop idle).
WORK_SECONDS: Final = 0.003
REST_SECONDS: Final = 0.001
#: The longest a sweep's turn waits for saves in flight to be written (``settled``): under
#: writes that never stop, the sweep still gets a turn every so often.
HOLD_SECONDS: Final = 0.005


class Turns:
    """The sweep's turns on the event loop: short ones, and a rest every few milliseconds.

    A :class:`~aiocheckpoint.codec.Pacer` of ``budget`` seconds lets the loop's other tasks
    run between the sweep's turns. But the loop's thread keeps the GIL meanwhile: it lets
    go at each loop iteration only to take it back at once, before the SQLite writer thread
    (or any other) waiting for it wakes, and that thread, which needs the GIL between each
    of a save's statements, waited 5-20 ms a time (``bench/sweep_writers.py --trace``). A
    rest of :data:`REST_SECONDS` after every :data:`WORK_SECONDS` leaves the loop idle, the
    GIL free, and the waiting threads take it. Only for a store whose writes run in a
    thread (``rests``), and only while ``rests()`` says saves are being written: for one
    whose writes run on the loop (PostgreSQL's) the rests only made the sweep slower (1.9x
    at 100,000 x 10), and with no save to make room for they only slow the sweep down.
    """

    def __init__(
        self,
        budget: float,
        rests: Callable[[], bool] | None,
        settled: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._pacer = Pacer(budget)
        self._rests = rests
        self._settled = settled
        self._since = time.monotonic()

    async def turn(self) -> None:
        """The pacer's turn, after a rest if :data:`WORK_SECONDS` passed since the last.

        With ``settled`` (a store's ``saves_written``), each turn first waits, up to
        :data:`HOLD_SECONDS`, until the saves in flight are written.
        """
        if self._settled is not None:
            await self._settled(HOLD_SECONDS)
        if self._rests is not None and time.monotonic() - self._since >= WORK_SECONDS:
            if self._rests():
                await asyncio.sleep(REST_SECONDS)
            self._since = time.monotonic()
        await self._pacer.turn()
