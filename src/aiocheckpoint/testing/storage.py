"""Conformance of every checkpoint store, and of durable ones across a reopen."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import anyio
import pytest

from ..codec import decode_checkpoint
from ..errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    CheckpointSerializationError,
    InvalidArgumentError,
    InvalidStepError,
    InvalidWorkflowIdError,
    StorageClosedError,
)
from ..manager import CheckpointManager
from ..models import AgentStatus
from ..storage.base import CheckpointStorage
from ._support import TRICKY_IDS, Reopen, rec


class StorageConformance:
    """Behaviour every :class:`~aiocheckpoint.CheckpointStorage` must show."""

    pytestmark: ClassVar = [pytest.mark.asyncio]

    # --- the raw protocol -------------------------------------------------------------

    async def test_load_of_unknown_workflow_is_none(self, storage: CheckpointStorage) -> None:
        """Loading from a workflow that was never written returns None, latest or by step."""
        assert await storage.load("nope") is None
        assert await storage.load("nope", 3) is None

    async def test_save_then_load_step_and_latest(self, storage: CheckpointStorage) -> None:
        """A saved record comes back byte for byte, by step and as the latest."""
        await storage.save("wf", 0, b"zero")
        await storage.save("wf", 1, b"one")
        one = await storage.load("wf", 1)
        assert one is not None and (one.step, one.data) == (1, b"one")
        latest = await storage.load("wf")
        assert latest is not None and (latest.step, latest.data) == (1, b"one")
        zero = await storage.load("wf", 0)
        assert zero is not None and zero.data == b"zero"

    async def test_latest_is_highest_step_not_last_written(
        self, storage: CheckpointStorage
    ) -> None:
        """The latest record is the one with the highest step, whatever the write order."""
        for step in (5, 9, 2):
            await storage.save("wf", step, rec(step))
        latest = await storage.load("wf")
        assert latest is not None and latest.step == 9

    async def test_save_existing_step_replaces_it(self, storage: CheckpointStorage) -> None:
        """Saving a step twice keeps only the second record."""
        await storage.save("wf", 3, b"first")
        await storage.save("wf", 3, b"second")
        got = await storage.load("wf", 3)
        assert got is not None and got.data == b"second"
        assert [r.step for r in await storage.scan("wf")] == [3]

    async def test_missing_step_is_none(self, storage: CheckpointStorage) -> None:
        """Loading a step that was not written returns None even if others exist."""
        await storage.save("wf", 1, b"x")
        assert await storage.load("wf", 2) is None

    async def test_binary_data_round_trips(self, storage: CheckpointStorage) -> None:
        """Every byte value survives storage unchanged, including NUL and 0xFF."""
        data = bytes(range(256)) * 4
        await storage.save("wf", 0, data)
        got = await storage.load("wf", 0)
        assert got is not None and got.data == data

    async def test_large_record_round_trips(self, storage: CheckpointStorage) -> None:
        """A 2 MB record is stored and loaded whole."""
        data = rec(7, 2 * 1024 * 1024)
        await storage.save("wf", 0, data)
        got = await storage.load("wf")
        assert got is not None and got.data == data

    async def test_scan_orders_by_step(self, storage: CheckpointStorage) -> None:
        """Scan returns records in ascending step order, or descending when asked."""
        for step in (3, 1, 2, 10):
            await storage.save("wf", step, rec(step))
        assert [r.step for r in await storage.scan("wf")] == [1, 2, 3, 10]
        assert [r.step for r in await storage.scan("wf", descending=True)] == [10, 3, 2, 1]
        assert (await storage.scan("wf"))[0].data == rec(1)

    async def test_scan_pages_with_bounds_and_limit(self, storage: CheckpointStorage) -> None:
        """after/before are exclusive bounds and limit takes from the scan's start."""
        for step in range(10):
            await storage.save("wf", step, rec(step))
        assert [r.step for r in await storage.scan("wf", limit=3)] == [0, 1, 2]
        assert [r.step for r in await storage.scan("wf", after=2, limit=3)] == [3, 4, 5]
        assert [r.step for r in await storage.scan("wf", before=4)] == [0, 1, 2, 3]
        assert [r.step for r in await storage.scan("wf", after=2, before=6)] == [3, 4, 5]
        desc = await storage.scan("wf", limit=3, descending=True)
        assert [r.step for r in desc] == [9, 8, 7]
        desc = await storage.scan("wf", before=7, limit=2, descending=True)
        assert [r.step for r in desc] == [6, 5]
        assert await storage.scan("wf", after=9) == []
        assert await storage.scan("other") == []

    async def test_exists(self, storage: CheckpointStorage) -> None:
        """exists() answers per step and per workflow."""
        assert not await storage.exists("wf")
        await storage.save("wf", 4, b"x")
        assert await storage.exists("wf")
        assert await storage.exists("wf", 4)
        assert not await storage.exists("wf", 5)

    async def test_delete_one_step(self, storage: CheckpointStorage) -> None:
        """Deleting a step removes only it and reports whether it existed."""
        for step in range(3):
            await storage.save("wf", step, rec(step))
        assert await storage.delete("wf", 1) is True
        assert await storage.delete("wf", 1) is False
        assert [r.step for r in await storage.scan("wf")] == [0, 2]

    async def test_delete_latest_step_moves_latest_back(self, storage: CheckpointStorage) -> None:
        """After deleting the highest step, the latest is the next highest."""
        for step in range(3):
            await storage.save("wf", step, rec(step))
        await storage.delete("wf", 2)
        latest = await storage.load("wf")
        assert latest is not None and latest.step == 1

    async def test_delete_whole_workflow(self, storage: CheckpointStorage) -> None:
        """Deleting a workflow removes all its steps and it leaves list_workflows()."""
        await storage.save("wf", 0, b"x")
        await storage.save("wf", 1, b"y")
        await storage.save("other", 0, b"z")
        assert await storage.delete("wf") is True
        assert await storage.delete("wf") is False
        assert await storage.load("wf") is None
        assert await storage.list_workflows() == ["other"]

    async def test_deleting_last_step_removes_workflow(self, storage: CheckpointStorage) -> None:
        """A workflow whose only step was deleted no longer appears."""
        await storage.save("wf", 0, b"x")
        await storage.delete("wf", 0)
        assert await storage.list_workflows() == []
        assert not await storage.exists("wf")

    async def test_keep_last_prunes_lowest_steps(self, storage: CheckpointStorage) -> None:
        """keep_last=N keeps the N highest steps of that workflow only."""
        await storage.save("other", 0, b"o")
        for step in range(6):
            await storage.save("wf", step, rec(step), keep_last=3)
        assert [r.step for r in await storage.scan("wf")] == [3, 4, 5]
        assert await storage.exists("other", 0)

    @pytest.mark.parametrize(
        ("workflow_id", "step", "keep_last", "error"),
        [
            ("", 0, None, InvalidWorkflowIdError),
            ("a\x00b", 0, None, InvalidWorkflowIdError),
            (7, 0, None, InvalidWorkflowIdError),
            ("wf", -1, None, InvalidStepError),
            ("wf", 2**63, None, InvalidStepError),
            ("wf", True, None, InvalidStepError),
            ("wf", 9, 0, InvalidArgumentError),
            ("wf", 9, -1, InvalidArgumentError),
            ("wf", 9, 2.0, InvalidArgumentError),
            ("wf", 9, True, InvalidArgumentError),
        ],
    )
    async def test_save_refuses_bad_arguments_and_changes_nothing(
        self,
        storage: CheckpointStorage,
        workflow_id: Any,
        step: Any,
        keep_last: Any,
        error: type[Exception],
    ) -> None:
        """A save with a bad id, step or keep_last raises its typed error; nothing changes.

        A keep_last of 0 must not delete the workflow's records.
        """
        for n in range(3):
            await storage.save("wf", n, rec(n))
        with pytest.raises(error):
            await storage.save(workflow_id, step, rec(9), keep_last=keep_last)
        assert [r.step for r in await storage.scan("wf")] == [0, 1, 2]

    async def test_workflows_are_isolated(self, storage: CheckpointStorage) -> None:
        """Ids that differ only in separators or escaping are different workflows."""
        for n, wf in enumerate(TRICKY_IDS):
            await storage.save(wf, 0, rec(n))
        assert await storage.list_workflows() == sorted(TRICKY_IDS)
        for n, wf in enumerate(TRICKY_IDS):
            got = await storage.load(wf, 0)
            assert got is not None and got.data == rec(n), wf
        await storage.delete("a/b")
        assert await storage.exists("a_b") and await storage.exists("a%2Fb")

    async def test_max_length_workflow_id(self, storage: CheckpointStorage) -> None:
        """A 255-byte id (multi-byte characters included) is stored and listed."""
        ids = ["x" * 255, "日" * 85, "é" * 127 + "x"]
        for wf in ids:
            await storage.save(wf, 1, b"v")
        assert await storage.list_workflows() == sorted(ids)

    async def test_huge_step_number(self, storage: CheckpointStorage) -> None:
        """The largest allowed step (2**63 - 1) is stored and ordered correctly."""
        await storage.save("wf", 2**63 - 1, b"max")
        await storage.save("wf", 10, b"ten")
        latest = await storage.load("wf")
        assert latest is not None and latest.step == 2**63 - 1
        assert [r.step for r in await storage.scan("wf")] == [10, 2**63 - 1]

    async def test_concurrent_writers(self, storage: CheckpointStorage) -> None:
        """Two hundred concurrent saves across workflows all land."""
        async with anyio.create_task_group() as tg:
            for n in range(200):
                tg.start_soon(storage.save, f"wf-{n % 20}", n, rec(n))
        assert len(await storage.list_workflows()) == 20
        for w in range(20):
            steps = [r.step for r in await storage.scan(f"wf-{w}")]
            assert steps == list(range(w, 200, 20))

    async def test_closed_storage_refuses_use(self, storage: CheckpointStorage) -> None:
        """Every method raises StorageClosedError after close; close is idempotent."""
        await storage.save("wf", 0, b"x")
        await storage.close()
        await storage.close()
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: storage.save("wf", 1, b"y"),
            lambda: storage.load("wf"),
            lambda: storage.scan("wf"),
            lambda: storage.exists("wf"),
            lambda: storage.delete("wf"),
            storage.list_workflows,
        ]
        for call in calls:
            with pytest.raises(StorageClosedError):
                await call()

    async def test_async_with_closes(self, storage: CheckpointStorage) -> None:
        """``async with storage`` closes it on exit."""
        async with storage as entered:
            assert entered is storage
            await storage.save("wf", 0, b"x")
        with pytest.raises(StorageClosedError):
            await storage.load("wf")

    # --- through the manager ----------------------------------------------------------

    async def test_manager_round_trip(self, storage: CheckpointStorage) -> None:
        """A checkpoint written through the manager reads back equal, state included."""
        manager = CheckpointManager(storage)
        state = {"plan": {"items": [1, 2.5, "three", None, True]}, "big": 10**40}
        made = await manager.create_checkpoint("wf", 2, "agent", AgentStatus.COMPLETED, state)
        got = await manager.get_checkpoint("wf", 2)
        assert got == made
        assert got.state_snapshot.data == state

    async def test_manager_resume_point(self, storage: CheckpointStorage) -> None:
        """Resume at step+1 after COMPLETED and at the same step otherwise."""
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("wf", 1, "a", AgentStatus.COMPLETED, {"n": 1})
        point = await manager.get_resume_point("wf")
        assert point is not None and point[0] == 2 and point[1].data == {"n": 1}
        await manager.create_checkpoint("wf", 2, "a", AgentStatus.FAILED, {"n": 2})
        point = await manager.get_resume_point("wf")
        assert point is not None and point[0] == 2 and point[1].data == {"n": 2}

    async def test_manager_max_checkpoints(self, storage: CheckpointStorage) -> None:
        """max_checkpoints keeps only the newest N steps."""
        manager = CheckpointManager(storage, max_checkpoints=2)
        for step in range(5):
            await manager.create_checkpoint("wf", step, "a", "completed", {"s": step})
        assert [c.step for c in await manager.list_checkpoints("wf")] == [3, 4]

    async def test_manager_rejects_bad_input_without_writing(
        self, storage: CheckpointStorage
    ) -> None:
        """Invalid ids, steps and states raise typed errors and store nothing."""
        manager = CheckpointManager(storage)
        with pytest.raises(InvalidWorkflowIdError):
            await manager.create_checkpoint("", 0, "a", "completed", {})
        with pytest.raises(InvalidStepError):
            await manager.create_checkpoint("wf", -1, "a", "completed", {})
        with pytest.raises(CheckpointSerializationError):
            await manager.create_checkpoint("wf", 0, "a", "completed", {"s": object()})
        assert await storage.list_workflows() == []

    async def test_manager_detects_corruption(self, storage: CheckpointStorage) -> None:
        """A record whose bytes were altered raises CheckpointCorruptedError naming the step."""
        manager = CheckpointManager(storage)
        cp = await manager.create_checkpoint("wf", 0, "a", "completed", {"k": "value"})
        stored = await storage.load("wf", 0)
        assert stored is not None
        assert decode_checkpoint(stored.data) == cp
        flipped = bytearray(stored.data)
        flipped[-3] ^= 0x01
        await storage.save("wf", 0, bytes(flipped))
        with pytest.raises(CheckpointCorruptedError) as info:
            await manager.get_checkpoint("wf", 0)
        assert info.value.workflow_id == "wf" and info.value.step == 0

    async def test_manager_not_found(self, storage: CheckpointStorage) -> None:
        """get_checkpoint of a missing step raises CheckpointNotFoundError."""
        manager = CheckpointManager(storage)
        with pytest.raises(CheckpointNotFoundError):
            await manager.get_checkpoint("wf", 0)
        assert await manager.get_latest_checkpoint("wf") is None
        assert await manager.get_resume_point("wf") is None


class PersistentStorageConformance:
    """What durable backends add: records outlive the storage object that wrote them."""

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_records_survive_reopen(self, storage: CheckpointStorage, reopen: Reopen) -> None:
        """Everything written is there, unchanged, after close and reopen."""
        for n, wf in enumerate(TRICKY_IDS):
            await storage.save(wf, n, rec(n, 100))
        await storage.save("kept", 1, b"a", keep_last=1)
        await storage.save("kept", 2, b"b", keep_last=1)
        await storage.close()
        again = await reopen()
        try:
            assert await again.list_workflows() == sorted([*TRICKY_IDS, "kept"])
            for n, wf in enumerate(TRICKY_IDS):
                got = await again.load(wf)
                assert got is not None and (got.step, got.data) == (n, rec(n, 100))
            assert [r.step for r in await again.scan("kept")] == [2]
        finally:
            await again.close()

    async def test_two_instances_see_each_others_writes(
        self, storage: CheckpointStorage, reopen: Reopen
    ) -> None:
        """A second storage object on the same location reads what the first wrote."""
        other = await reopen()
        try:
            await storage.save("wf", 0, b"from-first")
            await other.save("wf", 1, b"from-second")
            latest = await storage.load("wf")
            assert latest is not None and latest.data == b"from-second"
            got = await other.load("wf", 0)
            assert got is not None and got.data == b"from-first"
        finally:
            await other.close()
