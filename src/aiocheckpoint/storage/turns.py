"""How a sweep's work makes way for writers: loops cut into short stretches, a save clock.

A sweep handles thousands of rows per batch. A loop over them on the event loop holds up
every other task for its whole length; one in a worker thread holds the GIL, which the
event loop and the SQLite writer thread each get back only after the interpreter's switch
interval (5 ms) while it runs, at every step of a save. Either way a writer's save waits.
These helpers cut such loops into stretches of :data:`ROWS` rows. A store's
:class:`SaveClock` tells a sweep whether saves are being made now.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, TypeVar

__all__ = ["ROWS", "SAVING_LATELY", "SaveClock", "gil_breaks", "in_turns"]

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Rows per stretch: a few hundred microseconds of Python.
ROWS: Final = 256
#: How long a worker thread rests after each stretch (:func:`gil_breaks`).
REST_SECONDS: Final = 0.0005
#: The longest a stretch's rest goes on while ``held()`` says saves are in flight.
HOLD_SECONDS: Final = 0.005
#: How long after a save a store still counts as saving (:meth:`SaveClock.lately`).
SAVING_LATELY: Final = 0.1


class SaveClock:
    """When a store's last save was queued: whether it is saving now, for a sweep.

    Read from any thread (one float).
    """

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at = float("-inf")

    def saved(self) -> None:
        """A save was queued just now."""
        self._at = time.monotonic()

    def lately(self) -> bool:
        """Whether a save was queued within the last :data:`SAVING_LATELY` seconds."""
        return time.monotonic() - self._at < SAVING_LATELY


async def in_turns(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``[fn(item) for item in items]`` on the event loop, other tasks running every ROWS."""
    done: list[_R] = []
    for start in range(0, len(items), ROWS):
        if start:
            await asyncio.sleep(0)
        done += map(fn, items[start : start + ROWS])
    return done


def _always() -> bool:
    return True


def gil_breaks(
    rows: Iterable[_T],
    busy: Callable[[], bool] = _always,
    held: Callable[[], bool] | None = None,
) -> Iterator[_T]:
    """``rows``, for a worker thread: the GIL given away every ROWS rows, for a moment.

    A thread that gives the GIL up itself lets a waiting thread take it instead of after
    the switch interval (measured: an event loop's 1 ms heartbeat beside a thread running
    Python was 11 ms late at the median, under 1 ms with these breaks). Not ``sleep(0)``:
    the thread takes the GIL back before a thread waiting for it wakes, more often than
    not, so the break rests :data:`REST_SECONDS`, while ``busy()`` says a thread may be
    waiting (a store's saves being written); otherwise the loop runs on without a break.
    While ``held()`` says saves are in flight, the rest goes on (up to :data:`HOLD_SECONDS`):
    their statements then have the GIL to themselves.
    """
    for n, row in enumerate(rows, 1):
        yield row
        if n % ROWS == 0 and busy():
            time.sleep(REST_SECONDS)
            if held is not None:
                _hold(held)


def _hold(held: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HOLD_SECONDS
    while held() and time.monotonic() < deadline:
        time.sleep(REST_SECONDS)
