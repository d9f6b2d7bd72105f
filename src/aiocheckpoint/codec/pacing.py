"""A bound on how long concurrent large-state saves hold the event loop in one of its turns.

asyncio runs every callback that is ready at the start of a loop iteration before any timer
that fell due meanwhile. Twenty saves woken together (a group commit completing) therefore
run back to back, each slicing its own work, and a task waiting on a timer waits for the sum
of their slices: twenty times 0.3-2 ms. :class:`Pacer` lets saves go on within one iteration
only until their combined wall time passes a budget; the rest wait until the loop has been
round once more, so whatever was due runs in between.
"""

from __future__ import annotations

import asyncio
import contextlib
from time import perf_counter
from typing import Final

__all__ = ["PACE_SECONDS", "READY_PACE_SECONDS", "Pacer"]

#: The wall time large-state work may take in one loop iteration before it waits.
PACE_SECONDS: Final = 0.001
#: The same for a storage that never waits for I/O (in memory): its writers are always
#: ready, so a loop iteration runs a step of each of them, and each step must be short.
READY_PACE_SECONDS: Final = 0.00025
#: A renewal's share before any has been measured: every waiter.
_ALL: Final = 1 << 30


class Pacer:
    """Shares out each event-loop iteration among the large-state saves of one codec.

    For one loop at a time (as asyncio objects are); a codec used on a new loop starts
    afresh there.
    """

    __slots__ = (
        "_loop",
        "_passed",
        "_retry",
        "_share",
        "_start",
        "_waiters",
        "_woken",
        "budget",
        "every_step",
    )

    def __init__(self, budget: float = PACE_SECONDS, *, every_step: bool = False) -> None:
        self.budget = budget
        #: Whether :meth:`step` takes a turn: a save's steps outside its split (its
        #: encoding, its wrap-up once stored) then share the budget too.
        self.every_step = every_step
        self._loop: asyncio.AbstractEventLoop | None = None
        #: When work in the current iteration began (None: none has yet).
        self._start: float | None = None
        self._waiters: list[asyncio.Future[None]] = []
        #: Waiters woken that found the budget spent: first at the next renewal.
        self._retry: list[asyncio.Future[None]] = []
        #: How many waiters a renewal wakes (see :meth:`_next_share`).
        self._share = _ALL
        self._woken = 0
        self._passed = 0

    async def turn(self) -> None:
        """Return at once while this iteration's budget lasts; else when the next one's does.

        Returning at once does not suspend, so a caller within the budget pays nothing.
        Waiters go in the order they came.
        """
        if self._within():
            return
        queue = self._waiters
        while True:
            waiter = asyncio.get_running_loop().create_future()
            queue.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._within()  # woken: make sure a renewal wakes the next ones
                raise
            if self._within():
                self._passed += 1
                return
            queue = self._retry

    async def step(self) -> None:
        """:meth:`turn` where a save's next step begins, if this pacer takes every step.

        Otherwise nothing: a storage that waits for I/O gives the loop its turns there,
        and more waits between the steps of its saves would only thin its group commits.
        """
        if self.every_step:
            await self.turn()

    def _within(self) -> bool:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Another loop's renewal may never run (that loop closed): release its waiters.
            self._release([*self._retry, *self._waiters])
            self._loop, self._start, self._waiters, self._retry = loop, None, [], []
            self._share, self._woken, self._passed = _ALL, 0, 0
        if self._start is None:
            self._start = perf_counter()
            loop.call_soon(self._renew)
            return True
        return perf_counter() - self._start < self.budget

    def _renew(self) -> None:
        """Runs in the loop's next iteration; the waiters it wakes, in the one after that.

        So they run behind every timer that fell due in between. It wakes only about as
        many as went on last time: each one woken to find the budget spent would cost a
        task step and wait again.
        """
        self._start = None
        self._share = self._next_share()
        queue = [*self._retry, *self._waiters]
        woken = taken = 0
        for waiter in queue:
            if woken == self._share:
                break
            taken += 1
            if not waiter.done():  # a cancelled waiter is gone
                waiter.set_result(None)
                woken += 1
        self._retry, self._waiters = [], queue[taken:]
        self._woken, self._passed = woken, 0

    def _next_share(self) -> int:
        """Twice as many as were woken if all of them went on, else as many as did (>= 1)."""
        if self._passed < self._woken:
            return max(1, self._passed)
        return max(self._share, 2 * self._woken, 1) if self._share != _ALL else _ALL

    @staticmethod
    def _release(waiters: list[asyncio.Future[None]]) -> None:
        """Wake ``waiters`` of a loop that is not the running one (it may be closed)."""
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # a cancelled waiter is gone
        waiter.set_result(None)
