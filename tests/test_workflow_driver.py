"""One driver per workflow: a second block on one manager is refused, one owner name is never
granted a live lease twice in one process, and a lost lease logs one warning."""

from __future__ import annotations

import logging

import anyio
import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointManager,
    LeaseHeldError,
    LeaseLostError,
    ResumableWorkflow,
    WorkflowBusyError,
)
from aiocheckpoint.storage.base import CheckpointStorage
from tests.backend_support import any_storage, leasing_storage, pg_schema

__all__ = ["any_storage", "leasing_storage", "pg_schema"]


async def test_second_block_for_one_workflow_is_refused(any_storage: CheckpointStorage) -> None:
    """While a block drives a workflow, a second block on the same manager raises
    WorkflowBusyError naming it, without running anything; afterwards a block may enter."""
    manager = CheckpointManager(any_storage)
    runs: list[str] = []
    async with ResumableWorkflow("wf", manager) as first:
        with pytest.raises(WorkflowBusyError, match="'wf'") as refused:
            async with ResumableWorkflow("wf", manager) as second:
                async with second.step(0, agent_id="b"):
                    runs.append("second")
        assert refused.value.workflow_id == "wf"
        async with ResumableWorkflow("other", manager):
            pass  # another workflow is not affected
        async with first.step(0, agent_id="a"):
            runs.append("first")
    assert runs == ["first"]
    async with ResumableWorkflow("wf", manager) as again:
        assert again.resume_step == 1


async def test_concurrent_blocks_run_each_step_once(any_storage: CheckpointStorage) -> None:
    """Two tasks entering blocks for one workflow at once: exactly one drives it."""
    manager = CheckpointManager(any_storage)
    runs: list[int] = []
    refused: list[WorkflowBusyError] = []

    async def drive() -> None:
        try:
            async with ResumableWorkflow("wf", manager) as wf:
                for n in range(3):
                    if wf.is_completed(n):
                        continue
                    async with wf.step(n, agent_id="a"):
                        runs.append(n)
                        await anyio.sleep(0.01)
        except WorkflowBusyError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        tg.start_soon(drive)
    assert runs == [0, 1, 2]
    assert len(refused) == 1


async def test_a_failed_entry_frees_the_workflow(leasing_storage: CheckpointStorage) -> None:
    """A block whose entry fails (its lease is held elsewhere) leaves no driver behind."""
    manager = CheckpointManager(leasing_storage)
    other = await manager.acquire_lease("wf", "elsewhere", ttl=30)
    with pytest.raises(LeaseHeldError):
        async with ResumableWorkflow("wf", manager, lease_owner="me"):
            pass
    await manager.release_lease(other)
    async with ResumableWorkflow("wf", manager, lease_owner="me") as wf:
        await wf.checkpoint(0, "a", AgentStatus.COMPLETED)


async def test_one_owner_is_not_granted_a_live_lease_twice(
    leasing_storage: CheckpointStorage,
) -> None:
    """acquire_lease by an owner already holding the live lease in this process is refused,
    so the first holder keeps its token; after release the owner may acquire again."""
    manager = CheckpointManager(leasing_storage)
    lease = await manager.acquire_lease("wf", "runner-1", ttl=30)
    with pytest.raises(LeaseHeldError, match="runner-1"):
        await manager.acquire_lease("wf", "runner-1", ttl=30)
    await manager.create_checkpoint("wf", 0, "a", "completed", {}, lease=lease)
    await manager.release_lease(lease)
    again = await manager.acquire_lease("wf", "runner-1", ttl=30)
    assert again.token > lease.token


async def test_two_managers_on_one_storage_share_the_holders(
    leasing_storage: CheckpointStorage,
) -> None:
    """Blocks with one lease_owner on two managers of one storage: the second is refused and
    the first still writes under its lease."""
    first, second = CheckpointManager(leasing_storage), CheckpointManager(leasing_storage)
    async with ResumableWorkflow("wf", first, lease_owner="runner-1") as wf:
        with pytest.raises(LeaseHeldError):
            async with ResumableWorkflow("wf", second, lease_owner="runner-1"):
                pass
        await wf.checkpoint(0, "a", AgentStatus.COMPLETED)
    assert (await first.get_checkpoint("wf", 0)).agent_id == "a"


async def test_an_owner_takes_back_its_expired_lease(leasing_storage: CheckpointStorage) -> None:
    """A lease nobody renewed within its TTL is no longer live here: the owner (a restarted
    runner) may take it back, and the old grant is fenced out."""
    manager = CheckpointManager(leasing_storage)
    old = await manager.acquire_lease("wf", "runner-1", ttl=0.2)
    await anyio.sleep(0.3)
    new = await manager.acquire_lease("wf", "runner-1", ttl=30)
    assert new.token > old.token
    with pytest.raises(LeaseLostError):
        await manager.create_checkpoint("wf", 0, "a", "completed", {}, lease=old)


async def test_stale_runner_logs_one_warning(
    leasing_storage: CheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """A runner whose write is refused because its lease was taken over logs one WARNING,
    without a traceback, and no ERROR."""
    manager = CheckpointManager(leasing_storage)
    stale = await manager.acquire_lease("wf", "runner-a", ttl=0.2)
    caplog.set_level(logging.WARNING, logger="aiocheckpoint")
    with pytest.raises(LeaseLostError):
        async with ResumableWorkflow("wf", manager, lease=stale, lease_ttl=600) as wf:
            await anyio.sleep(0.3)
            await manager.acquire_lease("wf", "runner-b", ttl=30)  # the takeover
            async with wf.step(0, agent_id="a"):
                wf.state.set("done", True)
    records = [r for r in caplog.records if r.name.startswith("aiocheckpoint")]
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "lease lost" in records[0].getMessage()
    assert records[0].exc_info is None
    assert await manager.list_checkpoints("wf") == []
