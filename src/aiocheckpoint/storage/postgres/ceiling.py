"""How many connections the store holds at once: ``max_size`` until the server refuses one.

A role or database with a ``CONNECTION LIMIT`` (or a server at ``max_connections``) refuses
new connections with SQLSTATE ``53300`` while the pool still holds working ones. The
operation that was refused does not fail: :class:`Ceiling` lowers the store's limit to the
connections the pool holds, and operations over it wait for one of those to be handed back.
The limit goes back to ``max_size`` :data:`REGROW_AFTER` seconds later, so the pool grows
again once the server has room. Every wait is bounded by the operation's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

__all__ = ["REGROW_AFTER", "Ceiling", "NoConnection", "refused"]

#: Seconds after a refusal before the pool tries to open more connections again.
REGROW_AFTER = 1.0


class NoConnection(Exception):
    """The deadline passed while the operation waited for a connection slot."""


def refused(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the server refusing a new connection (too many connections)."""
    return getattr(exc, "sqlstate", None) == "53300"


class Ceiling:
    """A gate of ``max_size`` slots, lowered to what the server allowed when it refuses one."""

    def __init__(self, max_size: int) -> None:
        self._max = max_size
        self._cap = max_size
        self._lowered_at: float | None = None
        self._active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def cap(self) -> int:
        """The number of connections operations may hold now."""
        return self._limit(asyncio.get_running_loop().time())

    def lower(self, held: int) -> None:
        """The server refused a connection while the pool held ``held``: stay at that."""
        self._cap = held
        self._lowered_at = asyncio.get_running_loop().time()

    @contextlib.asynccontextmanager
    async def slot(self, deadline: float) -> AsyncIterator[None]:
        """Hold one slot for the block; :class:`NoConnection` if none frees by ``deadline``."""
        await self._enter(deadline)
        try:
            yield
        finally:
            self._active -= 1
            self._wake()

    async def _enter(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._active >= self._limit(loop.time()):
                now = loop.time()
                if now >= deadline:
                    raise NoConnection
                wait = deadline - now
                if self._lowered_at is not None:
                    wait = min(wait, self._lowered_at + REGROW_AFTER - now)
                await self._wait(max(wait, 0.0))
        except BaseException:
            # A wake-up this waiter may have taken must not be lost with it.
            self._wake()
            raise
        self._active += 1

    async def _wait(self, seconds: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), seconds)
        finally:
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _limit(self, now: float) -> int:
        if self._lowered_at is not None and now - self._lowered_at >= REGROW_AFTER:
            self._cap, self._lowered_at = self._max, None
        return self._cap
