"""What a split remembers between saves of one workflow, and where that memory is kept.

A :class:`~aiocheckpoint.format.tree.SplitMemory` says which regions of a large state the
last split stored as one blob and which cut into chunks, so that the next split of the same
workflow's state cuts them the same way and shares their blobs. The codec keeps one per
recently saved workflow in a :class:`MemoryCache`; a process that has none (a restart, or
another manager saved the workflow) recovers it from the store with
:func:`recovered_memory`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from ...format.tree import SplitMemory

__all__ = ["MemoryCache", "SplitMemory", "recovered_memory"]

#: Bounds of the split memories kept (workflows; integers in all, ~50 bytes each).
_MEMORY_WORKFLOWS = 1024
_MEMORY_ENTRIES = 1_000_000


def recovered_memory(memory: SplitMemory, stored: Collection[bytes]) -> SplitMemory | None:
    """The memory a split without one should have had, given which first chunks are stored.

    ``memory`` comes from a split made with ``previous=None``; ``stored`` holds the hashes
    among its ``first_chunks`` values that the store has. A region whose first chunk is
    stored was written cut into chunks before and is cut again; the others stay bundled.
    None when nothing would change (no first chunk stored): the split stands as it is.
    """
    cut = {key for key, h in memory.first_chunks.items() if h in stored}
    if not cut:
        return None
    recovered = SplitMemory()
    recovered.regions = {key: key not in cut for key in memory.first_chunks}
    return recovered


class MemoryCache:
    """The last split memory of each recently saved workflow, least recently saved dropped.

    Bounded by workflows and by integers held in all (a few per region of a large state).
    """

    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        #: Workflow id -> its memory, least recently saved first.
        self.entries: OrderedDict[str, SplitMemory] = OrderedDict()
        #: The entries' total length (integers held).
        self.size = 0

    def get(self, workflow_id: str) -> SplitMemory | None:
        """The memory of the workflow's last split, if it is still kept."""
        return self.entries.get(workflow_id)

    def remember(self, workflow_id: str, memory: SplitMemory | None) -> None:
        """Keep ``memory`` for the workflow's next split (None forgets the workflow)."""
        old = self.entries.pop(workflow_id, None)
        if old is not None:
            self.size -= len(old)
        if memory is None:
            return
        memory.first_chunks.clear()  # only for recovering a memory; this is one
        if len(memory) > _MEMORY_ENTRIES:
            return
        self.entries[workflow_id] = memory
        self.size += len(memory)
        while len(self.entries) > _MEMORY_WORKFLOWS or self.size > _MEMORY_ENTRIES:
            _, dropped = self.entries.popitem(last=False)
            self.size -= len(dropped)
