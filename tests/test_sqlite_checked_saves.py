"""The manager's plain-dict saves on SQLite through the store's checked save (no coroutine
of the store's per waiting save): the same outcomes as ``save``, cancellation included."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    InvalidArgumentError,
    StorageClosedError,
)
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.test_sqlite_storage import until, write_lock, writer_blocked


class _CountingSaves(SQLiteCheckpointStorage):
    """A subclass with a save of its own: every save must still come through it."""

    saves = 0

    async def save(self, workflow_id: str, step: int, data: bytes, **kwargs: Any) -> None:
        self.saves += 1
        await super().save(workflow_id, step, data, **kwargs)


async def test_plain_dict_saves_take_the_checked_save(tmp_path: Path) -> None:
    """A store that keeps its own save offers the checked save; the record and the
    workflow record are what ``save`` would have written."""
    store = SQLiteCheckpointStorage(tmp_path / "c.db")
    assert store.checked_saves() is not None
    async with CheckpointManager(store) as manager:
        await manager.create_checkpoint("wf", 1, "a", "running", {"n": 1})
        await manager.create_checkpoint("wf", 2, "a", "completed", {"n": 2})
        record = await manager.get_workflow("wf")
        latest = await manager.get_latest_checkpoint("wf")
    assert record is not None
    assert (record.latest_step, record.latest_agent_id) == (2, "a")
    assert record.latest_agent_status == "completed"  # one StepInfo per status, not per agent
    assert latest is not None and latest.state_snapshot.data == {"n": 2}


async def test_a_subclass_save_is_still_called(tmp_path: Path) -> None:
    """A subclass that replaces ``save`` gets no checked save: its own runs for each save."""
    store = _CountingSaves(tmp_path / "c.db")
    assert store.checked_saves() is None
    async with CheckpointManager(store) as manager:
        await manager.create_checkpoint("wf", 1, "a", "completed", {"n": 1})
        await manager.create_checkpoint("wf", 2, "a", "completed", {"n": 2})
    assert store.saves == 2


async def test_checked_save_refuses_a_record_over_the_limit(tmp_path: Path) -> None:
    """The store's max_record_bytes still holds: nothing is written."""
    async with CheckpointManager(
        SQLiteCheckpointStorage(tmp_path / "c.db", max_record_bytes=300)
    ) as m:
        with pytest.raises(InvalidArgumentError, match="max_record_bytes"):
            await m.create_checkpoint("wf", 1, "a", "completed", {"text": "x" * 400})
        assert await m.get_latest_checkpoint("wf") is None


async def test_checked_save_on_a_closed_store(tmp_path: Path) -> None:
    """A store closed under the manager refuses the save as ``save`` does."""
    store = SQLiteCheckpointStorage(tmp_path / "c.db")
    manager = CheckpointManager(store)
    await manager.create_checkpoint("wf", 1, "a", "completed", {"n": 1})
    await store.close()
    with pytest.raises(StorageClosedError):
        await manager.create_checkpoint("wf", 2, "a", "completed", {"n": 2})
    await manager.close()


async def test_cancelled_while_queued_writes_nothing(tmp_path: Path) -> None:
    """A create_checkpoint cancelled while its write is queued writes nothing; the saves
    around it land, and the workflow's record names the last of them."""
    store = SQLiteCheckpointStorage(tmp_path / "c.db")
    async with CheckpointManager(store) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 0})
        await until(lambda: not store._busy)  # the writer is free: first goes alone
        with write_lock(store.path):
            first = asyncio.create_task(manager.create_checkpoint("wf", 1, "a", "running", {}))
            await until(lambda: writer_blocked(store))
            queued = asyncio.create_task(manager.create_checkpoint("wf", 3, "b", "failed", {}))
            later = asyncio.create_task(manager.create_checkpoint("wf", 2, "a", "completed", {}))
            await until(lambda: len(store._pending) == 2)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
        await asyncio.gather(first, later)
        steps = [c.step for c in await manager.list_checkpoints("wf")]
        record = await manager.get_workflow("wf")
    assert steps == [0, 1, 2]
    assert record is not None
    assert (record.latest_step, record.latest_agent_status) == (2, "completed")
