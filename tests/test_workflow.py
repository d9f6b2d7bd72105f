from typing import Any

import anyio
import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointManager,
    InvalidStepError,
    InvalidWorkflowIdError,
    ResumableWorkflow,
)


@pytest.fixture
async def manager() -> Any:
    async with CheckpointManager() as m:
        yield m


async def test_fresh_workflow_starts_at_zero(manager: CheckpointManager) -> None:
    """With nothing stored, try_resume returns 0 and keeps the initial state."""
    wf = ResumableWorkflow("wf", manager, initial_state={"topic": "x"})
    assert await wf.try_resume() == 0
    assert not wf.is_resumed
    assert (wf.resume_step, wf.current_step) == (0, 0)
    assert wf.state.to_dict() == {"topic": "x"}
    assert wf.metrics.start_time is not None


async def test_invalid_id_is_refused_at_construction(manager: CheckpointManager) -> None:
    """A bad workflow id fails fast, before any I/O."""
    with pytest.raises(InvalidWorkflowIdError):
        ResumableWorkflow("", manager)


async def test_step_checkpoints_completed(manager: CheckpointManager) -> None:
    """A step block that exits normally writes a COMPLETED checkpoint with the current state."""
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="researcher", metadata={"tool": "search"}):
            wf.state.set("notes", ["found"], agent_id="researcher")
            wf.metrics.total_tokens += 10
    cp = await manager.get_checkpoint("wf", 0)
    assert cp.status is AgentStatus.COMPLETED
    assert cp.agent_id == "researcher"
    assert cp.metadata == {"tool": "search"}
    assert cp.state_snapshot.data == {"notes": ["found"]}
    assert cp.metrics.total_tokens == 10
    assert cp.metrics.total_steps == 1
    assert cp.metrics.elapsed_seconds >= 0


async def test_failed_step_records_error_and_propagates(manager: CheckpointManager) -> None:
    """An exception in a step writes FAILED with its type and message, then propagates as is."""
    wf = ResumableWorkflow("wf", manager)
    error = KeyError("missing thing")
    with pytest.raises(KeyError) as info:
        async with wf.step(3, agent_id="writer"):
            raise error
    assert info.value is error
    cp = await manager.get_checkpoint("wf", 3)
    assert cp.status is AgentStatus.FAILED
    assert cp.metadata["error"] == {"type": "KeyError", "message": "'missing thing'"}
    point = await manager.get_resume_point("wf")
    assert point is not None
    assert point[0] == 3  # a failed step is retried


async def test_cancelled_step_records_nothing(manager: CheckpointManager) -> None:
    """A cancelled step writes no checkpoint; the previous one stays the resume point."""
    wf = ResumableWorkflow("wf", manager)
    async with wf.step(0, agent_id="a"):
        wf.state.set("done", 0)
    started = anyio.Event()

    async def slow_step() -> None:
        async with wf.step(1, agent_id="a"):
            wf.state.set("done", 1)
            started.set()
            await anyio.sleep(10)

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow_step)
        await started.wait()
        tg.cancel_scope.cancel()
    assert not await manager.has_checkpoint("wf", 1)
    point = await manager.get_resume_point("wf")
    assert point is not None
    assert point[0] == 1
    assert point[1].data == {"done": 0}


async def test_timeout_inside_step_records_nothing(manager: CheckpointManager) -> None:
    """A timeout cancelling a step body also leaves no checkpoint for it."""
    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.01):
            async with wf.step(0, agent_id="a"):
                await anyio.sleep(5)
    assert await manager.list_workflows() == []


async def test_resume_skips_completed_steps(manager: CheckpointManager) -> None:
    """A second run resumes after the last completed step and never re-runs earlier ones."""
    calls: list[tuple[int, int]] = []

    async def run(attempt: int, crash_at: int | None) -> None:
        async with ResumableWorkflow("wf", manager, initial_state={"log": []}) as wf:
            for n in range(5):
                if wf.is_completed(n):
                    continue
                async with wf.step(n, agent_id=f"agent-{n}"):
                    if n == crash_at:
                        raise RuntimeError("crash")
                    calls.append((attempt, n))
                    wf.state.set("log", [*wf.state.get("log"), n])

    with pytest.raises(RuntimeError):
        await run(1, crash_at=3)
    await run(2, crash_at=None)
    assert calls == [(1, 0), (1, 1), (1, 2), (2, 3), (2, 4)]
    latest = await manager.get_latest_checkpoint("wf")
    assert latest is not None
    assert latest.state_snapshot.data == {"log": [0, 1, 2, 3, 4]}
    assert latest.metrics.total_steps == 5


async def test_try_resume_restores_state_and_metrics(manager: CheckpointManager) -> None:
    """try_resume brings back state (with its version) and metrics."""
    first = ResumableWorkflow("wf", manager)
    first.state.set("k", "v")
    first.metrics.total_cost = 2.5
    await first.checkpoint(4, "a", AgentStatus.COMPLETED)
    second = ResumableWorkflow("wf", manager)
    assert await second.try_resume() == 5
    assert second.is_resumed
    assert (second.resume_step, second.current_step) == (5, 5)
    assert second.state.to_dict() == {"k": "v"}
    assert second.state.version == 1
    assert second.metrics.total_cost == 2.5
    assert second.is_completed(4)
    assert not second.is_completed(5)
    with pytest.raises(InvalidStepError):
        second.is_completed(-1)


async def test_clear_checkpoints(manager: CheckpointManager) -> None:
    """clear_checkpoints deletes the workflow's checkpoints so the next run starts fresh."""
    wf = ResumableWorkflow("wf", manager)
    await wf.checkpoint(0, "a", "completed")
    assert await wf.clear_checkpoints()
    assert not await wf.clear_checkpoints()
    assert await ResumableWorkflow("wf", manager).try_resume() == 0


async def test_failure_to_record_failure_keeps_original_error(
    manager: CheckpointManager, caplog: pytest.LogCaptureFixture
) -> None:
    """If the FAILED checkpoint cannot be written, the step's own exception still propagates."""
    wf = ResumableWorkflow("wf", manager)
    await manager.close()
    with pytest.raises(ZeroDivisionError):
        async with wf.step(0, agent_id="a"):
            _ = 1 / 0
    assert "could not record the failure" in caplog.text
