"""Conformance of stores that give space back: ``reclaim_space`` and ``compact``."""

from __future__ import annotations

from ..manager import CheckpointManager
from ..storage.base import CheckpointStorage, CompactingStorage, SpaceReclaimingStorage

__all__ = ["SpaceConformance"]


class SpaceConformance:
    """A store that gives freed space back, or compacts, keeps every record it holds.

    For stores with ``reclaim_space()`` and/or ``compact()``: after deletes, each returns
    its sizes as ints, and every record left reads back byte for byte; writes go on after.
    """

    async def test_giving_space_back_keeps_every_record(self, storage: CheckpointStorage) -> None:
        """Reclaiming and compacting after deletes change no record that is left."""
        reclaims = isinstance(storage, SpaceReclaimingStorage)
        compacts = isinstance(storage, CompactingStorage)
        assert reclaims or compacts, "a store with neither method has nothing to check here"
        manager = CheckpointManager(storage)
        for n in range(8):
            for step in range(6):
                state = {"n": n, "text": f"{n}-{step}-" * 300}
                await manager.create_checkpoint(f"w{n}", step, "a", "running", state)
        for n in range(0, 8, 2):
            await storage.delete(f"w{n}")
        await storage.delete("w1", 0)
        kept = {
            (wf, r.step): r.data for wf in ("w1", "w3", "w5", "w7") for r in await storage.scan(wf)
        }
        if isinstance(storage, SpaceReclaimingStorage):
            given = await storage.reclaim_space()
            assert type(given) is int and given >= 0
        if isinstance(storage, CompactingStorage):
            before, after = await storage.compact()
            assert type(before) is int and type(after) is int and after >= 0
        after_all = {
            (wf, r.step): r.data for wf in ("w1", "w3", "w5", "w7") for r in await storage.scan(wf)
        }
        assert after_all == kept and len(kept) == 4 * 6 - 1
        assert await storage.list_workflows() == ["w1", "w3", "w5", "w7"]
        await manager.create_checkpoint("w9", 0, "a", "running", {"after": True})
        assert (await manager.get_latest_checkpoint("w9")) is not None
