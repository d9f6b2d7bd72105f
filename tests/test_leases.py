import anyio
import anyio.lowlevel
import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointManager,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLostError,
    ResumableWorkflow,
    UnsupportedOperationError,
    WorkflowBusyError,
    WorkflowStatus,
)
from aiocheckpoint.storage.base import BaseStorage


async def test_workflow_block_marks_finished_and_failed() -> None:
    """Leaving the block normally marks FINISHED; with an error, FAILED; cancelled, UNFINISHED."""
    async with CheckpointManager() as manager:
        async with ResumableWorkflow("ok", manager) as wf:
            async with wf.step(0, agent_id="a"):
                pass
        with pytest.raises(RuntimeError):
            async with ResumableWorkflow("bad", manager):
                raise RuntimeError("boom")
        with anyio.move_on_after(0.05):
            async with ResumableWorkflow("cut", manager) as wf:
                await wf.checkpoint(0, "a", AgentStatus.COMPLETED)
                await anyio.sleep(5)
        statuses = {r.workflow_id: r.status for r in await manager.list_workflow_records()}
        assert statuses == {
            "ok": WorkflowStatus.FINISHED,
            "bad": WorkflowStatus.FAILED,
            "cut": WorkflowStatus.UNFINISHED,
        }
        assert await manager.list_workflows(status="unfinished") == ["cut"]
        assert await manager.list_workflows() == ["cut", "ok"]  # ids with checkpoints


async def test_lease_owner_acquires_fences_and_releases() -> None:
    """lease_owner takes the lease on entry, fences checkpoints and releases it on exit."""
    async with CheckpointManager() as manager:
        async with ResumableWorkflow("wf", manager, lease_owner="runner-1") as wf:
            assert wf.lease is not None
            with pytest.raises(LeaseHeldError):
                await manager.acquire_lease("wf", "runner-2")
            with pytest.raises(WorkflowBusyError):  # one driver per workflow and manager
                async with ResumableWorkflow("wf", manager, lease_owner="runner-2"):
                    pass
            with pytest.raises(LeaseHeldError):
                async with ResumableWorkflow(
                    "wf", CheckpointManager(manager.storage), lease_owner="runner-2"
                ):
                    pass
            await wf.checkpoint(0, "a", AgentStatus.COMPLETED)
        record = await manager.get_workflow("wf")
        assert record is not None
        assert record.lease_owner is None
        assert record.status is WorkflowStatus.FINISHED
        assert (await manager.acquire_lease("wf", "runner-2")).token == 2


async def test_lease_is_renewed_in_the_background() -> None:
    """A block that outlives its TTL keeps the lease because it is renewed."""
    async with CheckpointManager() as manager:
        async with ResumableWorkflow("wf", manager, lease_owner="a", lease_ttl=0.15) as wf:
            await anyio.sleep(0.6)
            with pytest.raises(LeaseHeldError):
                await manager.acquire_lease("wf", "b")
            await wf.checkpoint(0, "a", AgentStatus.COMPLETED)


async def test_stale_runner_is_fenced_out() -> None:
    """After expiry and takeover, the old holder's checkpoint is refused and nothing changes."""
    async with CheckpointManager() as manager:
        old = await manager.acquire_lease("wf", "paused-runner", ttl=0.05)
        await manager.create_checkpoint("wf", 0, "paused-runner", "completed", {"v": 0}, lease=old)
        await anyio.sleep(0.2)
        new = await manager.claim_workflow("new-runner")
        assert new is not None
        assert new.token > old.token
        await manager.create_checkpoint("wf", 1, "new-runner", "completed", {"v": 1}, lease=new)
        with pytest.raises(LeaseLostError):
            await manager.create_checkpoint("wf", 1, "paused", "completed", {"v": -1}, lease=old)
        latest = await manager.get_latest_checkpoint("wf")
        assert latest is not None
        assert latest.state_snapshot.data == {"v": 1}
        with pytest.raises(LeaseLostError):
            await manager.create_checkpoint("other", 0, "x", "completed", {}, lease=new)


async def test_losing_the_lease_cancels_the_block() -> None:
    """When renewal finds the lease taken over, the block is cancelled with LeaseLostError."""
    reached_end = False
    async with CheckpointManager() as manager:
        wf = ResumableWorkflow("wf", manager, lease_owner="a", lease_ttl=0.3)
        with pytest.raises(LeaseLostError):
            async with wf:
                assert wf.lease is not None
                # Simulate a pause past expiry and a takeover: the lease is freed and granted
                # to someone else behind the workflow's back.
                await manager.release_lease(wf.lease)
                await manager.acquire_lease("wf", "b")
                await anyio.sleep(5)
                reached_end = True
        assert not reached_end
        record = await manager.get_workflow("wf")
        assert record is not None
        assert record.lease_owner == "b"
        assert record.status is WorkflowStatus.UNFINISHED


async def test_runner_loop_claims_every_workflow_once() -> None:
    """Several concurrent runners claiming work finish every registered workflow exactly once."""
    runs: list[str] = []
    async with CheckpointManager() as manager:
        for n in range(30):
            await manager.register_workflow(f"wf-{n}")

        async def runner(name: str) -> None:
            while (lease := await manager.claim_workflow(name)) is not None:
                async with ResumableWorkflow(lease.workflow_id, manager, lease=lease) as wf:
                    for step in range(3):
                        if wf.is_completed(step):
                            continue
                        async with wf.step(step, agent_id=name):
                            runs.append(f"{lease.workflow_id}:{step}")
                            await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for r in range(4):
                tg.start_soon(runner, f"runner-{r}")
        assert sorted(runs) == sorted(f"wf-{n}:{s}" for n in range(30) for s in range(3))
        assert await manager.list_workflows(status=WorkflowStatus.UNFINISHED) == []
        finished = await manager.list_workflows(status="finished")
        assert len(finished) == 30


async def test_backends_without_records_say_so() -> None:
    """A backend without workflow records raises UnsupportedOperationError for lease calls."""

    class Bare(BaseStorage):
        pass

    manager = CheckpointManager(Bare())  # type: ignore[arg-type]
    assert not manager.supports_workflow_records()
    with pytest.raises(UnsupportedOperationError, match="no workflow records"):
        await manager.acquire_lease("wf", "me")
    with pytest.raises(UnsupportedOperationError):
        await manager.list_workflows(status="unfinished")


async def test_lease_arguments_are_validated() -> None:
    """Owners, TTLs and statuses are checked before reaching the storage."""
    async with CheckpointManager() as manager:
        for owner in ("", 5, "x" * 256):
            with pytest.raises(InvalidArgumentError):
                await manager.acquire_lease("wf", owner)  # type: ignore[arg-type]
        for ttl in (0, -1, True, "5"):
            with pytest.raises(InvalidArgumentError):
                await manager.acquire_lease("wf", "me", ttl)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await manager.mark_workflow("wf", "done")


async def test_claimed_lease_is_renewed_for_its_own_ttl() -> None:
    """A lease claimed with a short TTL is renewed for that TTL without passing lease_ttl."""
    async with CheckpointManager() as manager:
        await manager.register_workflow("wf")
        lease = await manager.claim_workflow("a", ttl=0.3)
        assert lease is not None
        assert lease.ttl == 0.3
        async with ResumableWorkflow("wf", manager, lease=lease) as wf:
            await anyio.sleep(0.8)  # well past the TTL: only renewal keeps it
            with pytest.raises(LeaseHeldError):
                await manager.acquire_lease("wf", "b")
            await wf.checkpoint(0, "a", AgentStatus.COMPLETED)
