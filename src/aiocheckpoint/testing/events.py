"""Conformance of event histories (:class:`~aiocheckpoint.storage.events.EventStorage`)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, ClassVar

import anyio
import pytest

from ..codec import EffectRecord, EffectState
from ..errors import (
    EffectInDoubtError,
    InvalidArgumentError,
    LeaseLostError,
    WorkflowCancelledError,
)
from ..history import WorkflowEvent
from ..leases import Lease, RetryPolicy, WorkflowStatus
from ..manager import CheckpointManager
from ..models import utcnow
from ..retention import RetentionPolicy
from ..storage.base import WorkflowStorage
from ..storage.events import EventKind, EventStorage, Reseal, StoredEvent
from ..workflow import ResumableWorkflow
from ._support import Boom, new_manager


async def kinds(manager: CheckpointManager, workflow_id: str) -> list[str]:
    """The kinds of the workflow's events, oldest first."""
    return [str(e.kind) for e in await manager.get_events(workflow_id)]


async def last(manager: CheckpointManager, workflow_id: str) -> WorkflowEvent:
    """The workflow's newest event."""
    return (await manager.get_events(workflow_id))[-1]


class EventStorageConformance:
    """Each change of a workflow's life appends one event, in order, with its data.

    Its ``storage`` fixture yields a fresh store that keeps workflow records and events.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_pause_resume_and_finish(self, storage: WorkflowStorage) -> None:
        """A driver's pause keeps its reason and data; the resume its input; then completed."""
        manager = new_manager(storage)
        answers: list[Any] = []

        async def run() -> None:
            async with ResumableWorkflow("wf", manager, lease_owner="runner") as wf:
                async with wf.step(0, agent_id="a"):
                    pass
                async with wf.step(1, agent_id="approver"):
                    if wf.resume_input is None:
                        await wf.pause("needs approval", {"amount": 5, "when": [1, 2]})
                    answers.append(wf.resume_input)

        await run()
        paused = await manager.get_events("wf")
        assert [(str(e.kind), e.step, e.attempt) for e in paused] == [("paused", 1, None)]
        assert paused[0].data == {"reason": "needs approval", "data": {"amount": 5, "when": [1, 2]}}
        assert isinstance(paused[0].time, datetime) and paused[0].time.tzinfo is not None
        await manager.resume_workflow("wf", {"approved": True, "by": "ops"})
        event = await last(manager, "wf")
        assert (event.kind, event.data) == (
            EventKind.RESUMED,
            {"input": {"approved": True, "by": "ops"}},
        )
        await run()
        assert answers == [{"approved": True, "by": "ops"}]
        events = await manager.get_events("wf")
        assert [str(e.kind) for e in events] == ["paused", "resumed", "completed"]
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        assert events[-1].step == 1 and events[-1].data == {}

    async def test_failed_runs_retries_and_failure_for_good(self, storage: WorkflowStorage) -> None:
        """A failed run: step_failed (attempt, error), then retry_scheduled (when) or failed."""
        manager = new_manager(storage)
        await manager.create_checkpoint("wf", 3, "a", "failed", {})
        policy = RetryPolicy(max_attempts=2, backoff=60)
        record = await manager.record_failure("wf", Boom("down once"), retry=policy)
        events = await manager.get_events("wf")
        assert [(str(e.kind), e.step, e.attempt) for e in events] == [
            ("step_failed", 3, 1),
            ("retry_scheduled", 3, 1),
        ]
        assert events[0].data == {"type": "Boom", "message": "down once"}
        assert record.retry_at is not None
        scheduled = datetime.fromisoformat(events[1].data["at"])
        assert abs((scheduled - record.retry_at).total_seconds()) < 0.001
        await manager.record_failure("wf", Boom("down twice"), retry=policy)
        events = await manager.get_events("wf")
        assert [(str(e.kind), e.attempt) for e in events[2:]] == [
            ("step_failed", 2),
            ("failed", 2),
        ]
        assert events[2].data == {"type": "Boom", "message": "down twice"}
        await manager.retry_workflow("wf")
        event = await last(manager, "wf")
        assert (event.kind, event.data) == (EventKind.RETRIED, {"previous": "failed"})
        assert len(await manager.get_events("wf")) == 5

    async def test_cancel_and_retry(self, storage: WorkflowStorage) -> None:
        """A cancel keeps its reason; the retry names the status it left."""
        manager = new_manager(storage)
        await manager.register_workflow("wf")
        await manager.cancel_workflow("wf", reason="runaway loop")
        await manager.retry_workflow("wf")
        await manager.cancel_workflow("wf")
        events = await manager.get_events("wf")
        assert [(str(e.kind), e.data) for e in events] == [
            ("cancelled", {"reason": "runaway loop"}),
            ("retried", {"previous": "cancelled"}),
            ("cancelled", {"reason": None}),
        ]

    async def test_status_writes_append_once_per_change(self, storage: WorkflowStorage) -> None:
        """mark_workflow appends only when the status changes; registering appends nothing."""
        manager = new_manager(storage)
        await manager.register_workflow("wf", metadata={"tenant": "t"})
        await manager.create_checkpoint("wf", 0, "a", "completed", {})
        await manager.mark_workflow("wf", WorkflowStatus.UNFINISHED)
        assert await kinds(manager, "wf") == []
        await manager.mark_workflow("wf", WorkflowStatus.PAUSED)
        await manager.mark_workflow("wf", WorkflowStatus.PAUSED)
        await manager.mark_workflow("wf", WorkflowStatus.UNFINISHED)
        await manager.mark_workflow("wf", WorkflowStatus.FAILED)
        await manager.mark_workflow("wf", WorkflowStatus.UNFINISHED)
        await manager.mark_workflow("wf", WorkflowStatus.FINISHED)
        assert await kinds(manager, "wf") == ["paused", "resumed", "failed", "retried", "completed"]
        assert {e.step for e in await manager.get_events("wf")} == {0}

    async def test_a_refused_write_appends_nothing(self, storage: WorkflowStorage) -> None:
        """A stale lease, a cancelled record, a bad resume: refused, and no event."""
        manager = new_manager(storage)
        lease = await manager.acquire_lease("wf", "runner", 30)
        await manager.cancel_workflow("wf", reason="stop")
        with pytest.raises(LeaseLostError):
            await manager.mark_workflow("wf", WorkflowStatus.FINISHED, lease=lease)
        with pytest.raises(WorkflowCancelledError):
            await manager.mark_workflow("wf", WorkflowStatus.FINISHED)
        with pytest.raises(WorkflowCancelledError):
            await manager.record_failure("wf", Boom("late"))
        with pytest.raises(InvalidArgumentError):
            await manager.resume_workflow("wf", 1)
        with pytest.raises(InvalidArgumentError):
            await manager.cancel_workflow("wf")
        assert await kinds(manager, "wf") == ["cancelled"]

    async def test_lease_taken_over_from_an_expired_owner(self, storage: WorkflowStorage) -> None:
        """Taking a lease its owner let expire names that owner; a released one does not."""
        manager = new_manager(storage)
        await manager.acquire_lease("wf", "stalled", 0.05)
        await manager.register_workflow("claimed")
        await manager.acquire_lease("claimed", "stalled-too", 0.05)
        released = await manager.acquire_lease("quiet", "done", 30)
        await manager.release_lease(released)
        await anyio.sleep(0.2)
        await manager.acquire_lease("wf", "rescuer", 30)
        await manager.acquire_lease("quiet", "next", 30)
        claimed = await manager.claim_workflow("claimer")
        assert claimed is not None and claimed.workflow_id == "claimed"
        for workflow_id, owner in (("wf", "stalled"), ("claimed", "stalled-too")):
            events = await manager.get_events(workflow_id)
            assert [(str(e.kind), e.data) for e in events] == [
                ("lease_taken_over", {"previous_owner": owner})
            ]
        assert await kinds(manager, "quiet") == []

    async def test_events_go_with_their_workflow(self, storage: WorkflowStorage) -> None:
        """Deleting a workflow deletes its events; another's stay."""
        manager = new_manager(storage)
        for workflow_id in ("gone", "kept"):
            await manager.create_checkpoint(workflow_id, 0, "a", "completed", {})
            await manager.mark_workflow(workflow_id, WorkflowStatus.PAUSED)
        await manager.delete_checkpoints("gone")
        assert await manager.get_events("gone") == []
        assert await kinds(manager, "kept") == ["paused"]
        await manager.mark_workflow("gone", WorkflowStatus.FINISHED)
        assert await kinds(manager, "gone") == ["completed"]

    async def test_retention_thins_events_with_their_checkpoints(
        self, storage: WorkflowStorage
    ) -> None:
        """A sweep or ``thin_workflow`` deletes the events below the oldest step it keeps.

        Those at or above it, and those of no step, stay; a dry run deletes none.
        """
        manager = new_manager(storage)
        for workflow_id in ("swept", "thinned"):
            await manager.register_workflow(workflow_id)
            await manager.mark_workflow(workflow_id, WorkflowStatus.PAUSED)  # step None
            await manager.resume_workflow(workflow_id, "go")
            for step in range(3):
                await manager.create_checkpoint(workflow_id, step, "a", "completed", {})
            await manager.record_failure(workflow_id, Boom("at 2"), retry=RetryPolicy(backoff=0))
            for step in (3, 4):
                await manager.create_checkpoint(workflow_id, step, "a", "completed", {})
            await manager.mark_workflow(workflow_id, WorkflowStatus.PAUSED)  # step 4
        before = [(str(e.kind), e.step) for e in await manager.get_events("swept")]
        assert before == [
            ("paused", None),
            ("resumed", None),
            ("step_failed", 2),
            ("retry_scheduled", 2),
            ("paused", 4),
        ]
        policy = RetentionPolicy(keep_last=2, keep_terminal=False, keep_paused=False)
        await manager.sweep(policy=policy, dry_run=True)
        assert [(str(e.kind), e.step) for e in await manager.get_events("swept")] == before
        report = await manager.thin_workflow("thinned", policy=policy)
        assert report.checkpoints_deleted == 3
        report = await manager.sweep(policy=policy)
        assert report.checkpoints_deleted == 3  # "swept"'s; "thinned" has two left
        kept = [("paused", None), ("resumed", None), ("paused", 4)]
        for workflow_id in ("swept", "thinned"):
            assert [c.step for c in await manager.list_checkpoints(workflow_id)] == [3, 4]
            assert [(str(e.kind), e.step) for e in await manager.get_events(workflow_id)] == kept

    async def test_pages_in_order_without_gap_or_repeat(self, storage: WorkflowStorage) -> None:
        """get_events pages with limit and cursor, as list_workflow_records does."""
        manager = new_manager(storage)
        await manager.register_workflow("wf")
        await manager.register_workflow("other")
        for n in range(7):
            await manager.mark_workflow("wf", WorkflowStatus.PAUSED)
            await manager.resume_workflow("wf", n)
            await manager.mark_workflow("other", WorkflowStatus.PAUSED)
            await manager.resume_workflow("other", -n)
        whole = await manager.get_events("wf")
        assert len(whole) == 14 and whole.next_cursor is None
        paged: list[WorkflowEvent] = []
        cursor = None
        while True:
            page = await manager.get_events("wf", limit=4, cursor=cursor)
            paged += page
            cursor = page.next_cursor
            if cursor is None:
                break
        assert paged == whole
        assert [e.data.get("input") for e in whole[1::2]] == list(range(7))
        with pytest.raises(InvalidArgumentError):
            await manager.get_events("wf", cursor="not a cursor")
        with pytest.raises(InvalidArgumentError):
            await manager.get_events("wf", limit=0)
        assert await manager.get_events("never") == []

    async def test_fork_and_effects_in_doubt(self, storage: WorkflowStorage) -> None:
        """A fork names its source; a run stopped by a doubt, and the settle that ends it."""
        manager = new_manager(storage)
        for step in range(3):
            await manager.create_checkpoint("src", step, "a", "completed", {"n": step})
        await manager.fork_workflow("src", 1, "copy")
        assert [(str(e.kind), e.data) for e in await manager.get_events("copy")] == [
            ("forked", {"from": "src", "step": 1})
        ]
        assert await manager.get_events("src") == []
        intent = EffectRecord(
            workflow_id="copy",
            step=2,
            key="charge",
            name="f",
            state=EffectState.IN_DOUBT,
            attempt=1,
            intent_at=utcnow(),
            idempotency_key="ack-copy-2-charge",
        )
        await manager.record_effect(intent)
        await manager.record_failure("copy", EffectInDoubtError("copy", 2, "charge", utcnow()))
        await manager.resolve_effect("copy", 2, "charge", happened=True, result="ch-1")
        events = await manager.get_events("copy")
        assert [str(e.kind) for e in events] == [
            "forked",
            "step_failed",
            "effect_in_doubt",
            "failed",
            "effect_resolved",
        ]
        assert events[2].data["type"] == "EffectInDoubtError" and events[2].attempt == 1
        assert events[-1].data == {"step": 2, "key": "charge"}
        record = await manager.get_workflow("copy")
        assert record is not None and record.status is WorkflowStatus.UNFINISHED

    async def test_durable_sleep_is_claimed_only_after_its_time(
        self, storage: WorkflowStorage
    ) -> None:
        """A durable sleep ends the run; no runner claims it before its wake-up time."""
        manager = new_manager(storage)
        ran: list[int] = []

        async def run(workflow_id: str, seconds: float, lease: Lease | None = None) -> None:
            owner = None if lease else "runner"
            async with ResumableWorkflow(
                workflow_id, manager, lease=lease, lease_owner=owner
            ) as wf:
                if wf.resume_step <= 0:
                    async with wf.step(0, agent_id="a"):
                        ran.append(0)
                await wf.sleep(timedelta(seconds=seconds), durable=True)
                async with wf.step(1, agent_id="b"):
                    ran.append(1)

        await run("long", 3600)
        await run("nap", 1.5)
        assert ran == [0, 0]
        for workflow_id in ("long", "nap"):
            record = await manager.get_workflow(workflow_id)
            assert record is not None and record.status is WorkflowStatus.UNFINISHED
            assert record.retry_at is not None and record.lease_owner is None
            event = await last(manager, workflow_id)
            assert (event.kind, event.step) == (EventKind.SLEEPING, 1)
            assert datetime.fromisoformat(event.data["until"]) == record.retry_at
        assert await manager.claim_workflow("early") is None
        lease = None
        with anyio.fail_after(60):
            while lease is None:
                await anyio.sleep(0.1)
                lease = await manager.claim_workflow("on-time")
        assert lease.workflow_id == "nap"
        until = datetime.fromisoformat((await last(manager, "nap")).data["until"])
        assert lease.expires_at - timedelta(seconds=lease.ttl) >= until - timedelta(seconds=0.01)
        await run("nap", 1.5, lease)
        assert ran == [0, 0, 1]  # step 0 not again, the sleep not again
        assert await kinds(manager, "nap") == ["sleeping", "completed"]
        assert await manager.claim_workflow("late") is None  # "long" sleeps on

    async def test_a_short_sleep_waits_in_the_driver(self, storage: WorkflowStorage) -> None:
        """A short sleep writes nothing; one inside a step, or of a bad length, is refused."""
        manager = new_manager(storage)
        async with ResumableWorkflow("wf", manager) as wf:
            async with wf.step(0, agent_id="a"):
                with pytest.raises(InvalidArgumentError):
                    await wf.sleep(60)
            await wf.sleep(0.01)
            await wf.sleep(timedelta(milliseconds=5), durable=False)
            for bad in (-1, float("nan"), "1", True, timedelta(days=400)):
                with pytest.raises(InvalidArgumentError):
                    await wf.sleep(bad)  # type: ignore[arg-type]
            async with wf.step(1, agent_id="a"):
                pass
        assert await kinds(manager, "wf") == ["completed"]
        assert [c.step for c in await manager.list_checkpoints("wf")] == [0, 1]

    async def test_put_events_carries_a_history(self, storage: WorkflowStorage) -> None:
        """put_events appends events as they are, after the rest or instead of them."""
        manager = new_manager(storage)
        assert isinstance(storage, EventStorage)
        await manager.create_checkpoint("src", 2, "a", "failed", {})
        await manager.record_failure("src", Boom("down"), retry=RetryPolicy(backoff=60))
        await manager.mark_workflow("src", WorkflowStatus.PAUSED)
        source = await storage.get_events("src")
        await manager.register_workflow("dst")
        await manager.mark_workflow("dst", WorkflowStatus.PAUSED)  # the transfer's own write
        await storage.put_events("dst", source, replace=True)
        await storage.put_events("dst", source, replace=True)  # again: the same history
        carried = await storage.get_events("dst")

        def same(a: StoredEvent, b: StoredEvent) -> bool:
            fields = (a.kind, a.step, a.attempt, json.loads(a.data))
            near = abs((a.at - b.at).total_seconds()) < 0.001
            return near and fields == (b.kind, b.step, b.attempt, json.loads(b.data))

        assert len(carried) == len(source) == 3
        assert all(same(a, b) for a, b in zip(carried, source, strict=True))
        assert [e.seq for e in carried] == sorted({e.seq for e in carried})
        await storage.put_events("dst", source[:1], replace=False)
        assert [e.kind for e in await storage.get_events("dst")] == [
            "step_failed",
            "retry_scheduled",
            "paused",
            "step_failed",
        ]
        bad = StoredEvent(0, "paused", utcnow(), None, None, "[1]")
        with pytest.raises(InvalidArgumentError):
            await storage.put_events("dst", [bad], replace=True)
        assert len(await storage.get_events("dst")) == 4

    async def test_reseal_replaces_only_what_still_holds_the_old_text(
        self, storage: WorkflowStorage
    ) -> None:
        """Reseal swaps each text that is still the one read, in place; the rest stand."""
        manager = new_manager(storage)
        assert isinstance(storage, EventStorage)
        await manager.register_workflow("wf")
        await manager.mark_workflow("wf", WorkflowStatus.PAUSED)
        await manager.resume_workflow("wf", {"ok": "é"})
        await manager.record_failure("wf", Boom("down"), retry=RetryPolicy(backoff=60))
        before = await storage.get_events("wf")
        record = await storage.get_workflow("wf")
        assert record is not None
        failed = next(e for e in before if e.kind == "step_failed")
        new = json.dumps({"type": "Boom", "message": "sealed-again"})
        changes = [
            Reseal("event", failed.data, new, failed.seq),
            Reseal("event", '{"x": 1}', "{}", before[0].seq),  # not its text: left
            Reseal("resume_input", json.dumps({"ok": "é"}), json.dumps("swapped")),
            Reseal("error_message", json.dumps("down"), json.dumps("sealed-msg")),
        ]
        assert await storage.reseal("wf", changes) == 3
        after = await storage.get_workflow("wf")
        assert after is not None and after.resume_input == "swapped"
        assert after.last_error == {"type": "Boom", "message": "sealed-msg"}
        assert after.updated_at == record.updated_at and after.status is record.status
        events = await storage.get_events("wf")
        assert [(e.seq, e.kind, e.step) for e in events] == [
            (e.seq, e.kind, e.step) for e in before
        ]
        assert next(e for e in events if e.seq == failed.seq).data == new
        assert await storage.reseal("wf", changes) == 0  # none holds its old text now
        # A new failure replaced the message meanwhile: the stale swap leaves it.
        await manager.record_failure("wf", Boom("later"), retry=RetryPolicy(backoff=60))
        stale = [Reseal("error_message", json.dumps("sealed-msg"), json.dumps("x"))]
        assert await storage.reseal("wf", stale) == 0
        latest = await storage.get_workflow("wf")
        assert latest is not None and latest.last_error == {"type": "Boom", "message": "later"}
        with pytest.raises(InvalidArgumentError):
            await storage.reseal("wf", [Reseal("status", "a", "b")])
        assert await storage.reseal("missing", changes) == 0
