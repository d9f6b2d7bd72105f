"""The time one operation may take: ``command_timeout``, shared by its tries and waits.

asyncpg applies ``command_timeout`` to each statement; the store applies it to the whole
call, so a caller waits at most that long whatever the retries, and the error it gets says
what timed out, the timeout and how long it waited.
"""

from __future__ import annotations

import asyncio

from ...errors import StorageTimeoutError

__all__ = ["Budget"]

#: A timer may fire a hair before its deadline: time left below this counts as none.
_MARGIN = 0.001


class Budget:
    """The clock of one operation: started now, over ``limit`` seconds (``None``: no limit).

    ``wait_limit`` bounds the wait for a connection when there is no ``limit`` (asyncpg's
    connect ``timeout``, 60 s by default).
    """

    def __init__(self, limit: float | None, wait_limit: float) -> None:
        self.limit = limit
        self._loop = asyncio.get_running_loop()
        self.start = self._loop.time()
        self.attempts = 0
        self.wait_deadline = self.start + (limit if limit is not None else wait_limit)

    def remaining(self) -> float | None:
        """Seconds left, or ``None`` without a limit."""
        if self.limit is None:
            return None
        return self.start + self.limit - self._loop.time()

    def wait_left(self) -> float:
        """Seconds left to wait for a connection (``wait_deadline``; at least a moment)."""
        return max(self.wait_deadline - self._loop.time(), _MARGIN)

    def expired(self) -> bool:
        """Whether the limit has passed (or is a millisecond away: no try fits in that)."""
        left = self.remaining()
        return left is not None and left <= _MARGIN

    def elapsed(self) -> float:
        """Seconds since the operation started."""
        return self._loop.time() - self.start

    def timed_out(self, what: str, cause: str = "") -> StorageTimeoutError:
        """The error of ``what`` having run out of time, naming the limit and the wait."""
        limit = f"command_timeout {self.limit:g} s" if self.limit is not None else "its timeout"
        tries = f"{self.attempts} attempt{'s' if self.attempts != 1 else ''}"
        text = f"PostgreSQL {what} timed out after {self.elapsed():.2f} s ({limit}, {tries})"
        return StorageTimeoutError(f"{text}: {cause}" if cause else text)
