"""The in-memory store's content-addressed blobs and their reference counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping

from ..format import SplitResult
from .refcounts import Rows, add_references, missing_blob, release_references

__all__ = ["MemoryBlobs"]


class MemoryBlobs:
    """The store's content-addressed blobs with their reference counts.

    The :class:`~aiocheckpoint.storage.refcounts.RefCounts` of ``docs/incremental.md`` §8
    over two dicts. A save's walk that fails halfway (a blob neither stored nor in the
    split) is taken back by :meth:`add`, as a database rolls its transaction back.
    """

    __slots__ = ("_added", "counts", "data", "size")

    def __init__(self) -> None:
        self.counts: dict[bytes, int] = {}
        self.data: dict[bytes, bytes] = {}
        #: The bytes of every blob held.
        self.size = 0
        self._added: Counter[bytes] = Counter()

    def add(self, split: SplitResult) -> None:
        """Count ``split``'s root references, storing its blobs not yet held; all or nothing."""
        self._added = Counter()
        try:
            add_references([split], self)
        except BaseException:
            self.subtract(self._added)
            raise

    def add_stored(self, refs: tuple[bytes, ...]) -> tuple[bytes, ...]:
        """Count the references of a record given whole: those to held blobs (returned)."""
        held = tuple(h for h in refs if h in self.counts)
        for h in held:
            self.counts[h] += 1
        return held

    def release(self, refs: Iterable[bytes]) -> None:
        """Release removed records' references, freeing the blobs no record reaches."""
        release_references(refs, self)

    def upsert(self, rows: Rows) -> Collection[bytes]:
        """Add to the held blobs' counts, store the others; return those stored."""
        counts = self.counts
        inserted: list[bytes] = []
        for h, (n, blob) in rows.items():
            if h in counts:
                counts[h] += n
            elif blob is None:
                raise missing_blob(h)
            else:
                counts[h] = n
                self.data[h] = bytes(blob)
                self.size += len(blob)
                inserted.append(h)
            self._added[h] += n
        return inserted

    def subtract(self, counts: Mapping[bytes, int]) -> Mapping[bytes, bytes]:
        """Subtract from the counts; drop and return the blobs that reach 0."""
        freed: dict[bytes, bytes] = {}
        held = self.counts
        for h, n in counts.items():
            left = held.get(h)
            if left is None:
                continue
            if left > n:
                held[h] = left - n
            else:
                del held[h]
                blob = freed[h] = self.data.pop(h)
                self.size -= len(blob)
        return freed

    def clear(self) -> None:
        """Drop every blob."""
        self.counts.clear()
        self.data.clear()
        self.size = 0
