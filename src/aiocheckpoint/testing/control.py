"""Conformance of workflow control: cancel and retry under the workflow's lease."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import anyio
import pytest

from ..errors import (
    CheckpointNotFoundError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLostError,
    WorkflowCancelledError,
)
from ..leases import RetryPolicy, WorkflowStatus
from ..models import utcnow
from ..retention import RetentionPolicy
from ..storage.base import WorkflowStorage
from ..workflow import ResumableWorkflow
from ._support import LATER, Boom, new_manager


class WorkflowControlConformance:
    """Cancel and retry (``WorkflowControlStorage``), through the public API.

    Its ``storage`` fixture yields a fresh store that keeps workflow records.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_cancel_revokes_the_lease_and_is_never_claimed(
        self, storage: WorkflowStorage
    ) -> None:
        """A cancel stores CANCELLED and its reason, and fences the runner's lease out."""
        manager = new_manager(storage)
        await manager.register_workflow("wf")
        lease = await manager.acquire_lease("wf", "runner", 30)
        record = await manager.cancel_workflow("wf", reason="runaway loop")
        assert record.status is WorkflowStatus.CANCELLED
        assert record.last_error == {"type": "WorkflowCancelledError", "message": "runaway loop"}
        assert record.lease_owner is None and record.finished_at is not None
        assert record.fencing_token > lease.token
        with pytest.raises(LeaseLostError):
            await manager.create_checkpoint("wf", 0, "a", "completed", {}, lease=lease)
        with pytest.raises(LeaseLostError):
            await manager.renew_lease(lease)
        assert await manager.claim_workflow("other") is None
        assert await manager.list_checkpoints("wf") == []
        assert await manager.list_workflows(status="cancelled") == ["wf"]

    async def test_cancel_refuses_an_ended_or_unknown_workflow(
        self, storage: WorkflowStorage
    ) -> None:
        """Only UNFINISHED and PAUSED workflows can be cancelled; a refusal changes nothing."""
        manager = new_manager(storage)
        await manager.create_checkpoint("done", 0, "a", "completed", {})
        await manager.mark_workflow("done", WorkflowStatus.FINISHED)
        before = await manager.get_workflow("done")
        with pytest.raises(InvalidArgumentError, match="finished"):
            await manager.cancel_workflow("done")
        assert await manager.get_workflow("done") == before
        with pytest.raises(CheckpointNotFoundError):
            await manager.cancel_workflow("missing")
        with pytest.raises(InvalidArgumentError):
            await manager.cancel_workflow("done", reason=42)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="cancel_workflow"):
            await manager.mark_workflow("done", WorkflowStatus.CANCELLED)
        assert await manager.get_workflow("done") == before
        await manager.mark_workflow("paused", WorkflowStatus.PAUSED)
        cancelled = await manager.cancel_workflow("paused")
        assert cancelled.status is WorkflowStatus.CANCELLED
        assert cancelled.last_error == {"type": "WorkflowCancelledError", "message": ""}

    async def test_retry_gives_a_fresh_attempt_budget(self, storage: WorkflowStorage) -> None:
        """A FAILED or CANCELLED workflow is claimable again, attempts back to 0."""
        manager = new_manager(storage)
        await manager.register_workflow("failed")
        await manager.record_failure("failed", Boom("down"))
        await manager.record_failure("failed", Boom("down"))
        assert (await manager.get_workflow("failed")).attempts == 2  # type: ignore[union-attr]
        assert await manager.claim_workflow("runner") is None
        record = await manager.retry_workflow("failed")
        assert record.status is WorkflowStatus.UNFINISHED
        assert (record.attempts, record.retry_at, record.finished_at) == (0, None, None)
        assert record.lease_owner is None  # the retry's own lease is released
        lease = await manager.claim_workflow("runner")
        assert lease is not None and lease.workflow_id == "failed"
        await manager.register_workflow("cancelled")
        await manager.cancel_workflow("cancelled", reason="by mistake")
        retried = await manager.retry_workflow("cancelled")
        assert retried.status is WorkflowStatus.UNFINISHED
        again = await manager.claim_workflow("runner")
        assert again is not None and again.workflow_id == "cancelled"

    async def test_retry_refuses_other_statuses_and_a_held_lease(
        self, storage: WorkflowStorage
    ) -> None:
        """Retrying a workflow that did not fail names its status; a held lease refuses it."""
        manager = new_manager(storage)
        await manager.register_workflow("wf")
        with pytest.raises(InvalidArgumentError, match="unfinished"):
            await manager.retry_workflow("wf")
        with pytest.raises(CheckpointNotFoundError):
            await manager.retry_workflow("missing")
        assert await manager.get_workflow("missing") is None
        await manager.record_failure("wf", Boom("down"))
        await manager.acquire_lease("wf", "stalled-runner", 60)
        with pytest.raises(LeaseHeldError):
            await manager.retry_workflow("wf")
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.FAILED
        assert record.attempts == 1

    async def test_cancel_stops_the_driver_before_its_next_effect(
        self, storage: WorkflowStorage
    ) -> None:
        """A cancel while a step runs: the next wf.effect raises and its function never runs."""
        manager = new_manager(storage)
        called: list[str] = []

        async def send(what: str) -> str:
            called.append(what)
            return what

        async def run() -> None:
            async with ResumableWorkflow("wf", manager, lease_owner="runner") as wf:
                async with wf.step(0, agent_id="a"):
                    await wf.effect("first", send, "first")
                    await manager.cancel_workflow("wf", reason="stop it")
                    await wf.effect("second", send, "second")
                async with wf.step(1, agent_id="b"):
                    called.append("step 1")

        with pytest.raises(WorkflowCancelledError) as raised:
            await run()
        assert raised.value.reason == "stop it" and raised.value.workflow_id == "wf"
        assert called == ["first"]
        assert await manager.list_checkpoints("wf") == []
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.CANCELLED
        assert record.last_error == {"type": "WorkflowCancelledError", "message": "stop it"}

    async def test_cancel_stops_the_driver_at_the_step_boundary(
        self, storage: WorkflowStorage
    ) -> None:
        """A cancel while a step runs: its checkpoint is refused and no later step starts."""
        manager = new_manager(storage)
        ran: list[int] = []
        await manager.register_workflow("wf")
        lease = await manager.claim_workflow("runner")
        assert lease is not None

        async def run() -> None:
            async with ResumableWorkflow("wf", manager, lease=lease) as wf:
                for n in range(3):
                    async with wf.step(n, agent_id="a"):
                        ran.append(n)
                        if n == 1:
                            await manager.cancel_workflow("wf")

        with pytest.raises(WorkflowCancelledError):
            await run()
        assert ran == [0, 1]
        assert [c.step for c in await manager.list_checkpoints("wf")] == [0]
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.CANCELLED
        with pytest.raises(WorkflowCancelledError):
            await ResumableWorkflow("wf", manager).__aenter__()

    async def test_a_step_failing_after_the_cancel_leaves_it_cancelled(
        self, storage: WorkflowStorage
    ) -> None:
        """The failure of a step cancelled under it records nothing: it stays CANCELLED."""
        manager = new_manager(storage)

        async def run() -> None:
            async with (
                ResumableWorkflow("wf", manager, lease_owner="runner") as wf,
                wf.step(0, agent_id="a"),
            ):
                await manager.cancel_workflow("wf", reason="stop")
                raise Boom("the body's own error")

        with pytest.raises(Boom):
            await run()
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.CANCELLED
        assert record.attempts == 0
        assert record.last_error == {"type": "WorkflowCancelledError", "message": "stop"}
        assert await manager.list_checkpoints("wf") == []

    async def test_cancel_interrupts_a_long_step_at_the_next_renewal(
        self, storage: WorkflowStorage
    ) -> None:
        """A step that waits (no effect, no boundary) is stopped by its lease's renewal."""
        manager = new_manager(storage)
        started = anyio.Event()
        finished: list[int] = []

        async def run() -> None:
            async with ResumableWorkflow("wf", manager, lease_owner="runner", lease_ttl=0.3) as wf:
                async with wf.step(0, agent_id="slow"):
                    started.set()
                    await anyio.sleep_forever()
                finished.append(0)

        async def cancel_when_started() -> None:
            await started.wait()
            await manager.cancel_workflow("wf", reason="too slow")

        async def run_and_cancel() -> WorkflowCancelledError | None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_started)
                try:
                    await run()
                except WorkflowCancelledError as exc:
                    return exc
            return None

        with anyio.fail_after(30):
            raised = await run_and_cancel()
        assert raised is not None and raised.reason == "too slow"
        assert finished == []
        assert await manager.list_checkpoints("wf") == []

    async def test_a_cancelled_workflow_goes_with_the_failed_ttl(
        self, storage: WorkflowStorage
    ) -> None:
        """Cancelled is terminal for retention: ``failed_ttl`` deletes it from its cancel."""
        manager = new_manager(storage)
        await manager.create_checkpoint("wf", 0, "a", "completed", {"k": 1})
        await manager.cancel_workflow("wf")
        await manager.register_workflow("idle")
        policy = RetentionPolicy(failed_ttl=timedelta(days=1))
        report = await manager.sweep(now=utcnow() + LATER, policy=policy)
        assert report.workflows_deleted == {"cancelled": 1}
        assert await manager.get_workflow("wf") is None
        assert [r.workflow_id for r in await manager.list_workflow_records()] == ["idle"]

    async def test_a_driver_without_a_lease_cannot_overwrite_the_cancel(
        self, storage: WorkflowStorage
    ) -> None:
        """No lease to revoke: its closing status write is refused and it raises the cancel."""
        manager = new_manager(storage)
        ran: list[int] = []

        async def run() -> None:
            async with ResumableWorkflow("wf", manager, steps=2) as wf:
                async with wf.step(0, agent_id="a"):
                    ran.append(0)
                await manager.cancel_workflow("wf", reason="stop")
                async with wf.step(1, agent_id="a"):
                    ran.append(1)

        with pytest.raises(WorkflowCancelledError) as raised:
            await run()
        assert raised.value.reason == "stop" and ran == [0, 1]
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.CANCELLED
        assert record.last_error == {"type": "WorkflowCancelledError", "message": "stop"}
        assert record.attempts == 0

    async def test_a_failure_without_a_lease_leaves_the_cancel(
        self, storage: WorkflowStorage
    ) -> None:
        """A lease-less step failing after the cancel: its error propagates, nothing counted."""
        manager = new_manager(storage)
        await manager.register_workflow("wf")

        async def run() -> None:
            async with ResumableWorkflow("wf", manager) as wf, wf.step(0, agent_id="a"):
                await manager.cancel_workflow("wf", reason="stop")
                raise Boom("the body's own error")

        with pytest.raises(Boom):
            await run()
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.CANCELLED
        assert (record.attempts, record.finished_at is not None) == (0, True)

    async def test_only_a_retry_moves_a_cancelled_workflow(self, storage: WorkflowStorage) -> None:
        """Marking or failing a CANCELLED workflow is refused (naming retry_workflow), unchanged."""
        manager = new_manager(storage)
        await manager.register_workflow("wf")
        await manager.cancel_workflow("wf", reason="stop")
        before = await manager.get_workflow("wf")
        for status in WorkflowStatus:
            with pytest.raises(WorkflowCancelledError):
                await storage.set_workflow_status("wf", status)
            if status is not WorkflowStatus.CANCELLED:
                with pytest.raises(InvalidArgumentError, match="retry_workflow"):
                    await manager.mark_workflow("wf", status)
        with pytest.raises(WorkflowCancelledError, match="retry_workflow"):
            await manager.record_failure("wf", Boom("late"), retry=RetryPolicy(max_attempts=3))
        assert await manager.get_workflow("wf") == before
        assert await manager.claim_workflow("runner") is None
        retried = await manager.retry_workflow("wf")
        assert (retried.status, retried.attempts) == (WorkflowStatus.UNFINISHED, 0)
        marked = await manager.mark_workflow("wf", WorkflowStatus.FINISHED)
        assert marked.status is WorkflowStatus.FINISHED

    async def test_a_cancel_after_the_last_step_raises_the_cancel(
        self, storage: WorkflowStorage, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A cancel between the last step and the block's end: WorkflowCancelledError."""
        manager = new_manager(storage)

        async def run() -> None:
            async with ResumableWorkflow("wf", manager, steps=1, lease_owner="runner") as wf:
                async with wf.step(0, agent_id="a"):
                    pass
                await manager.cancel_workflow("wf", reason="too late")

        with (
            caplog.at_level("WARNING", logger="aiocheckpoint"),
            pytest.raises(WorkflowCancelledError) as raised,
        ):
            await run()
        assert raised.value.reason == "too late"
        assert "another runner" not in caplog.text
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.CANCELLED
