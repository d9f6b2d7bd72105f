"""The file store's writer lock: one holder per workflow, across store objects (and so across
processes: ``flock`` locks belong to an open file, not to a process); a waiter times out with
LeaseHeldError, a cancelled waiter or a failing holder leaves the lock free; bad input is
refused before anything is made."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from aiocheckpoint import InvalidArgumentError, InvalidWorkflowIdError, LeaseHeldError
from aiocheckpoint.storage.file import FileCheckpointStorage


async def test_one_holder_at_a_time(tmp_path: Path) -> None:
    first, second = FileCheckpointStorage(tmp_path / "s"), FileCheckpointStorage(tmp_path / "s")
    async with first.writer_lock("wf"):
        with pytest.raises(LeaseHeldError):
            async with second.writer_lock("wf", wait=0.05):
                pytest.fail("two holders")
        async with second.writer_lock("other", wait=0.05):
            pass  # another workflow's lock is another lock
        with anyio.move_on_after(0.05) as scope:  # a cancelled waiter gives up cleanly
            async with second.writer_lock("wf"):
                pytest.fail("two holders")
        assert scope.cancelled_caught
    async with second.writer_lock("wf", wait=0.05):
        pass  # released on exit
    with pytest.raises(RuntimeError):
        async with first.writer_lock("wf"):
            raise RuntimeError("boom")
    async with second.writer_lock("wf", wait=0.05):
        pass  # released on an error
    assert sorted(p.name for p in (tmp_path / "s" / "locks").iterdir()) == ["other", "wf"]


async def test_a_waiter_gets_the_lock_when_it_is_given_back(tmp_path: Path) -> None:
    first, second = FileCheckpointStorage(tmp_path / "s"), FileCheckpointStorage(tmp_path / "s")
    order: list[str] = []

    async def waiter() -> None:
        async with second.writer_lock("wf", wait=30):
            order.append("second")

    async with anyio.create_task_group() as tg:
        async with first.writer_lock("wf"):
            tg.start_soon(waiter)
            await anyio.sleep(0.05)
            order.append("first")
    assert order == ["first", "second"]


async def test_bad_input_is_refused(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(tmp_path / "s")
    with pytest.raises(InvalidWorkflowIdError):
        storage.writer_lock("")
    for wait in (0, -1, True, "1"):
        with pytest.raises(InvalidArgumentError):
            storage.writer_lock("wf", wait=wait)  # type: ignore[arg-type]
    assert not (tmp_path / "s").exists()
