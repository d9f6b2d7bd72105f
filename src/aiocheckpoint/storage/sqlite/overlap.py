"""When the writer commits one half of the callers while the event loop serves the other.

The SQLite group commit's. A round with every caller in one batch is serial: the writer
applies the batch and commits it (the fsync, F seconds), then the loop wakes the callers
and runs each one's Python up to its next write (the gap, G seconds), while the writer
idles. With the callers in two halves, the writer applies one half's writes while the loop
is idle, then wakes the other half (committed already) just before its COMMIT: that
half's Python runs during the fsync. A round then costs about 2·max(F, G/2) instead of
F + G (plus the applies, the same in both): it wins when G > F, and loses when the fsync
is the longer (a slow disk, few callers), where it would double the fsyncs per caller.
So the writer measures F and G on each round of one batch, splits the next rounds only if
G is the longer in the median of the last :data:`SAMPLES` such rounds (one fsync can take
three times another, and one gap can hold a garbage collection), and every
:data:`PROBE_ROUNDS` split rounds takes one whole round to measure again. The writer
never applies rows while the loop runs Python: each row's ``sqlite3_step`` gives the GIL
back, and a busy loop keeps it for a whole switch interval (docs/sqlite-storage.md "No
pipelining"); only the COMMIT's fsync, which needs no GIL, runs beside the loop.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["MIN_HALF", "PROBE_ROUNDS", "SAMPLES", "Overlap"]

#: The fewest writes in a half: below 2 x this queued, a batch is never split.
MIN_HALF: Final = 32
#: Split rounds between two whole rounds that measure F and G again.
PROBE_ROUNDS: Final = 32
#: The whole rounds whose median F and G decide (none is made before there are as many).
SAMPLES: Final = 3


class Overlap:
    """The decision of one group commit: split the queued writes in two halves, or not.

    Only the event loop's thread uses it: :meth:`measured` after a whole round,
    :meth:`split` when a free writer takes a batch, :meth:`hold` when a batch is done
    and writes are queued already.
    """

    __slots__ = ("_commits", "_gaps", "_rounds", "_split")

    def __init__(self) -> None:
        self._commits: deque[float] = deque(maxlen=SAMPLES)  # the last whole rounds' COMMITs
        self._gaps: deque[float] = deque(maxlen=SAMPLES)  # and the gaps after them (seconds)
        self._split = False  # the median gap is longer than the median COMMIT
        self._rounds = 0  # split rounds since the last whole one

    def measured(self, commit: float, gap: float) -> None:
        """A whole round: its COMMIT took ``commit`` seconds, the loop's gap ``gap``."""
        self._commits.append(commit)
        self._gaps.append(gap)
        if len(self._gaps) == SAMPLES:
            self._split = sorted(self._gaps)[SAMPLES // 2] > sorted(self._commits)[SAMPLES // 2]
        self._rounds = 0

    def split(self, queued: int) -> bool:
        """Whether a free writer takes only half of the ``queued`` writes."""
        return self._split and queued >= 2 * MIN_HALF

    def hold(self, queued: int) -> bool:
        """Whether a batch just done waits for the ``queued`` writes to be applied.

        True: they are handed to the writer now, and the done batch's callers are woken
        from the writer thread once they are applied, before their COMMIT. False: the done
        batch's callers are woken now and the next batch is taken once they have queued
        (a whole round).
        """
        if not self._split or queued < MIN_HALF:
            return False
        self._rounds += 1
        if self._rounds > PROBE_ROUNDS:
            self._split = False  # one whole round, to measure F and G again
            return False
        return True
