"""When a group commit's writer, free again, waits for the callers its last batch woke.

The SQLite group commit's (the file store's was measured with it and keeps its own order:
docs/sqlite-storage.md). Once a batch is durable its callers
are woken and the writer is free; whatever is queued then goes in the next batch. A caller
out of step with the others (its write queued while the batch ran: it yielded once more,
after a slow copy or a garbage collection) would then be taken alone, or with the few woken
callers that were quick enough, while the rest queue behind that commit; the next round
the stragglers are those behind them, and so on: batches of 1 and C-1 (or C-k and k) for
good, two commits per round and most callers waiting through both. So a writer that is
free with some writes queued, but fewer than the callers its last batch woke plus the
stragglers already queued when it did, waits up to :data:`REJOIN_ITERATIONS` loop
iterations for the woken callers to queue theirs. With none queued, or all of those, it
goes at once: a lone caller (C=1) never waits, and callers that do other work between
their writes delay the next batch by at most those iterations.
docs/sqlite-storage.md "Group commit" has the measurements.
"""

from __future__ import annotations

from typing import Final

__all__ = ["REJOIN_ITERATIONS", "Rejoin"]

#: Loop iterations a free writer waits for the callers its last batch woke to queue again.
REJOIN_ITERATIONS: Final = 2


class Rejoin:
    """The decision of one group commit's writer: take the queued writes now, or wait.

    Only the event loop's thread uses it: :meth:`woke` after a batch's callers are woken,
    :meth:`wait` each time the writer is free (once per loop iteration while it says so).
    """

    __slots__ = ("_expected", "_left")

    def __init__(self) -> None:
        self._expected = 0  # writes the next batch should take: the woken callers' and stragglers'
        self._left = 0  # loop iterations left to wait for them

    def woke(self, callers: int, queued: int) -> None:
        """A batch of ``callers`` writes is durable and its callers are being woken.

        ``queued`` writes are queued for the next batch already: the stragglers'.
        """
        self._expected, self._left = callers + queued, REJOIN_ITERATIONS

    def wait(self, queued: int, max_batch: int) -> bool:
        """Whether the free writer should wait a loop iteration before taking ``queued``.

        True while some writes are queued, fewer than :meth:`woke`'s callers and stragglers
        (or than ``max_batch``, the most a batch takes), for at most
        :data:`REJOIN_ITERATIONS` calls after :meth:`woke`.
        """
        if 0 < queued < min(self._expected, max_batch) and self._left > 0:
            self._left -= 1
            return True
        return False
