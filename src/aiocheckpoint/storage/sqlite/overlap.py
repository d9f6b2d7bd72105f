"""When the writer commits one half of the callers while the event loop serves the other.

The SQLite group commit's. A round with every caller in one batch is serial: the writer
applies the batch and commits it (the fsync, F seconds), then the loop wakes the callers
and runs each one's Python up to its next write (the gap, G seconds), while the writer
idles. With the callers in two halves, the writer applies one half's writes while the loop
is idle, then wakes the other half (committed already) just before its COMMIT: that
half's Python runs during the fsync. A round then costs about 2·max(F, G/2) plus two
hand-overs instead of F + G, and the loop's Python runs slower beside a busy writer: it
wins when F and G/2 are close, loses when the fsync is much the longer (a slow disk, where
it doubles the fsyncs per caller) and when it is much the shorter (measured: F 0.6 ms,
G 1.7 ms lost ~8%). No formula over F and G held on one machine, so the decision is
measured: the seconds per write of each way, kick to kick, the median of the last
:data:`SAMPLES` rounds of each; the better one is kept, and the other tried again after
:data:`PROBE_ROUNDS` rounds (twice as many after each try it lost). The writer never
applies rows while the loop runs Python: each row's ``sqlite3_step`` gives the GIL back,
and a busy loop keeps it for a whole switch interval (docs/sqlite-storage.md "No
pipelining"); only the COMMIT, whose fsync needs no GIL, runs beside the loop.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["MIN_HALF", "PROBE_ROUNDS", "SAMPLES", "Overlap"]

#: The fewest writes in a half: below 2 x this queued, a batch is never split.
MIN_HALF: Final = 32
#: The rounds of one way whose median cost is compared with the other's.
SAMPLES: Final = 5
#: Rounds in the better way after which the other is measured again (doubled each time
#: the other is found worse again, up to ``_MAX_PROBE``).
PROBE_ROUNDS: Final = 64
_MAX_PROBE: Final = 4096


class Overlap:
    """The decision of one group commit: serve the callers in two halves, or all at once.

    Only the event loop's thread uses it: :meth:`round` at each batch taken (the time
    since the last one), :meth:`split` when a free writer takes a batch, :meth:`hold` when
    a batch is done and writes are queued already.
    """

    __slots__ = ("_costs", "_probe", "_rounds", "_split", "_trying")

    def __init__(self) -> None:
        # Seconds per write of the last rounds all at once [0] and in halves [1].
        self._costs: tuple[deque[float], deque[float]] = (
            deque(maxlen=SAMPLES),
            deque(maxlen=SAMPLES),
        )
        self._split = False  # the way being used now
        self._trying = False  # it is being tried against the other, known better so far
        self._rounds = 0  # rounds measured since it was taken up
        self._probe = PROBE_ROUNDS  # rounds before the other way is tried again

    @property
    def splitting(self) -> bool:
        """Whether the callers are being served in two halves."""
        return self._split

    def round(self, split: bool, seconds: float, writes: int) -> None:
        """A batch of ``writes`` (in halves if ``split``) took ``seconds`` to the next one."""
        if writes < MIN_HALF or split is not self._split:
            return  # a small batch says nothing; one from before a switch, nothing of this way
        self._rounds += 1
        if self._rounds == 1:
            return  # the first round after a switch holds the switch
        costs = self._costs[split]
        costs.append(seconds / writes)
        other = self._costs[not split]
        if len(costs) < SAMPLES or self._rounds <= SAMPLES:
            return
        if not other:
            self._switch(trying=True)  # never measured
        elif _median(other) < _median(costs):
            # Back to the other way. A way tried and found worse again waits twice as long
            # before its next try: a slow disk does not pay a split round in ten for good.
            self._probe = min(2 * self._probe, _MAX_PROBE) if self._trying else PROBE_ROUNDS
            self._switch(trying=False)
        elif self._trying:
            self._trying = False  # the tried way is the better one now
            self._probe = PROBE_ROUNDS
        elif self._rounds > self._probe:
            self._switch(trying=True)  # the other way, not measured for a while

    def _switch(self, *, trying: bool) -> None:
        self._split = not self._split
        self._trying = trying
        self._costs[self._split].clear()  # measured afresh
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
        return self._split and queued >= MIN_HALF


def _median(values: deque[float]) -> float:
    return sorted(values)[len(values) // 2]
