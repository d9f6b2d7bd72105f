"""Conformance of workflow records, leases and their lifecycle."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import anyio
import pytest

from ..errors import CheckpointNotFoundError, InvalidArgumentError, LeaseHeldError, LeaseLostError
from ..leases import Lease, RetryPolicy, WorkflowStatus
from ..manager import CheckpointManager
from ..models import AgentStatus, utcnow
from ..storage.base import StepInfo, WorkflowStorage
from ..storage.queries import WorkflowQuery
from ..workflow import ResumableWorkflow
from ._support import Boom, big_state, new_manager


class WorkflowLifecycleConformance:
    """Pausing, retries, metadata and filtered pages of workflow records.

    Part of :class:`WorkflowStorageConformance`; it runs through the public API.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_pause_ends_the_block_paused_and_resume_delivers_input(
        self, storage: WorkflowStorage
    ) -> None:
        """pause() ends the block PAUSED; runners skip it until resume_workflow(input)."""
        manager = new_manager(storage)
        async with ResumableWorkflow("wf", manager) as wf:
            async with wf.step(0, agent_id="draft"):
                wf.state.set("draft", "hello")
            async with wf.step(1, agent_id="send"):
                wf.state.set("sent", True)  # rolled back: the step has not run
                await wf.pause("approve the draft", data={"draft": "hello"})
            raise AssertionError("pause() returns only by leaving the block")
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.PAUSED
        latest = await manager.get_latest_checkpoint("wf")
        assert latest is not None
        assert (latest.step, latest.status, latest.agent_id) == (1, AgentStatus.BLOCKED, "send")
        assert latest.metadata["pause"] == {
            "reason": "approve the draft",
            "data": {"draft": "hello"},
        }
        assert "sent" not in latest.state_snapshot.data
        assert await manager.list_workflows(status="paused") == ["wf"]
        assert await manager.claim_workflow("runner") is None
        resumed = await manager.resume_workflow("wf", input={"approved": True})
        assert resumed.status is WorkflowStatus.UNFINISHED
        assert resumed.resume_input == {"approved": True}
        lease = await manager.claim_workflow("runner")
        assert lease is not None and lease.workflow_id == "wf"
        async with ResumableWorkflow("wf", manager, lease=lease) as wf:
            assert wf.resume_input == {"approved": True}
            assert wf.resume_step == 1
            async with wf.step(1, agent_id="send"):
                wf.state.set("sent", True)
            after = await manager.get_workflow("wf")
            assert after is not None and after.resume_input is None  # consumed by the step
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.FINISHED

    async def test_pause_outside_a_step_blocks_the_next_step(
        self, storage: WorkflowStorage
    ) -> None:
        """Between steps, pause() records BLOCKED at the step that comes next."""
        manager = new_manager(storage)
        async with ResumableWorkflow("wf", manager) as wf:
            async with wf.step(0, agent_id="a"):
                pass
            await wf.pause("budget exhausted")
        latest = await manager.get_latest_checkpoint("wf")
        assert latest is not None and (latest.step, latest.status) == (1, AgentStatus.BLOCKED)
        point = await manager.get_resume_point("wf")
        assert point is not None and point[0] == 1

    async def test_blocked_checkpoint_or_early_return_is_not_finished(
        self, storage: WorkflowStorage
    ) -> None:
        """A last BLOCKED checkpoint or an early return ends PAUSED; a whole run FINISHED.

        An early return: the block leaves before step ``steps - 1`` completed.
        """
        manager = new_manager(storage)
        async with ResumableWorkflow("blocked", manager) as wf:
            await wf.checkpoint(0, "agent", AgentStatus.BLOCKED)
        async with (
            ResumableWorkflow("early", manager, steps=3) as wf,
            wf.step(0, agent_id="a"),
        ):
            pass
        async with ResumableWorkflow("whole", manager, steps=2) as wf:
            for n in range(2):
                async with wf.step(n, agent_id="a"):
                    pass
        async with ResumableWorkflow("running", manager) as wf:
            await wf.checkpoint(0, "agent", AgentStatus.RUNNING)
        statuses = {r.workflow_id: r.status for r in await manager.list_workflow_records()}
        assert statuses == {
            "blocked": WorkflowStatus.PAUSED,
            "early": WorkflowStatus.PAUSED,
            "whole": WorkflowStatus.FINISHED,
            "running": WorkflowStatus.UNFINISHED,
        }

    async def test_cancelled_block_stays_unfinished(self, storage: WorkflowStorage) -> None:
        """A deadline or a TaskGroup sibling's failure leaves the workflow UNFINISHED."""
        manager = new_manager(storage)
        stepped = anyio.Event()
        with anyio.move_on_after(30) as deadline:
            async with ResumableWorkflow("deadline", manager) as wf:
                async with wf.step(0, agent_id="a"):
                    pass
                deadline.deadline = anyio.current_time()  # the deadline passes here
                await anyio.sleep(30)

        async def sibling() -> None:
            await stepped.wait()
            raise Boom("sibling failed")

        async def driver() -> None:
            async with ResumableWorkflow("group", manager) as wf:
                async with wf.step(0, agent_id="a"):
                    pass
                stepped.set()
                await anyio.sleep(30)

        caught: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(sibling)
                tg.start_soon(driver)
        except Exception as exc:  # the task group's ExceptionGroup, holding Boom
            caught = exc
        assert any(isinstance(e, Boom) for e in getattr(caught, "exceptions", ()))
        for workflow_id in ("deadline", "group"):
            record = await manager.get_workflow(workflow_id)
            assert record is not None and record.status is WorkflowStatus.UNFINISHED

    async def test_resume_refuses_what_is_not_paused(self, storage: WorkflowStorage) -> None:
        """resume_workflow: unknown workflow, or one that is not paused, is a typed error."""
        manager = new_manager(storage)
        with pytest.raises(CheckpointNotFoundError):
            await manager.resume_workflow("nobody")
        await manager.register_workflow("wf")
        with pytest.raises(InvalidArgumentError):
            await manager.resume_workflow("wf", input=1)
        await manager.mark_workflow("wf", "paused")
        with pytest.raises(InvalidArgumentError):
            await manager.resume_workflow("wf", input=float("nan"))
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.PAUSED

    async def test_failed_run_is_retried_after_backoff_then_gives_up(
        self, storage: WorkflowStorage
    ) -> None:
        """A retryable failure goes back to the pool after the backoff; the last one is final."""
        manager = new_manager(storage)
        policy = RetryPolicy(max_attempts=2, backoff=0.3)
        await manager.register_workflow("wf")
        lease = await manager.claim_workflow("runner", retry=policy)
        assert lease is not None and lease.retry == policy
        with pytest.raises(Boom):
            async with ResumableWorkflow("wf", manager, lease=lease):
                raise Boom("first")
        record = await manager.get_workflow("wf")
        assert record is not None
        assert (record.status, record.attempts) == (WorkflowStatus.UNFINISHED, 1)
        assert record.retry_at is not None and record.retry_at > record.updated_at
        assert await manager.claim_workflow("runner", retry=policy) is None  # backoff
        await anyio.sleep(0.45)
        lease = await manager.claim_workflow("runner", retry=policy)
        assert lease is not None
        with pytest.raises(Boom):
            async with ResumableWorkflow("wf", manager, lease=lease):
                raise Boom("second")
        record = await manager.get_workflow("wf")
        assert record is not None
        assert (record.status, record.attempts) == (WorkflowStatus.FAILED, 2)
        assert record.last_error == {"type": "Boom", "message": "second"}
        assert await manager.claim_workflow("runner", retry=policy) is None

    async def test_non_retryable_error_fails_at_once(self, storage: WorkflowStorage) -> None:
        """An error the policy does not name fails the workflow on the first attempt."""
        manager = new_manager(storage)
        policy = RetryPolicy(max_attempts=5, backoff=0, retry_on=("KeyError",))
        with pytest.raises(ValueError, match="bad input"):
            async with ResumableWorkflow("wf", manager, retry=policy):
                raise ValueError("bad input")
        record = await manager.get_workflow("wf")
        assert record is not None
        assert (record.status, record.attempts) == (WorkflowStatus.FAILED, 1)
        with pytest.raises(KeyError):
            async with ResumableWorkflow("other", manager, retry=policy):
                raise KeyError("flaky")
        record = await manager.get_workflow("other")
        assert record is not None and record.status is WorkflowStatus.UNFINISHED

    async def test_reviving_a_failed_workflow_restores_its_retry_budget(
        self, storage: WorkflowStorage
    ) -> None:
        """Marking a FAILED workflow unfinished resets attempts; other moves keep them."""
        manager = new_manager(storage)
        policy = RetryPolicy(max_attempts=2, backoff=0)
        for _ in range(2):
            with pytest.raises(Boom):
                async with ResumableWorkflow("wf", manager, retry=policy):
                    raise Boom("again")
        record = await manager.mark_workflow("wf", "paused")
        assert (record.status, record.attempts) == (WorkflowStatus.PAUSED, 2)
        await manager.mark_workflow("wf", "failed")
        record = await manager.mark_workflow("wf", "unfinished")
        assert (record.status, record.attempts) == (WorkflowStatus.UNFINISHED, 0)
        assert record.last_error == {"type": "Boom", "message": "again"}
        with pytest.raises(Boom):
            async with ResumableWorkflow("wf", manager, retry=policy):
                raise Boom("once more")
        after = await manager.get_workflow("wf")
        assert after is not None
        assert (after.status, after.attempts) == (WorkflowStatus.UNFINISHED, 1)

    async def test_record_names_latest_step_agent_and_status(
        self, storage: WorkflowStorage
    ) -> None:
        """Each save updates the latest step, its agent and agent status; it never goes back."""
        manager = new_manager(storage)
        await manager.create_checkpoint("wf", 0, "planner", "completed", {})
        await manager.create_checkpoint("wf", 2, "writer", "blocked", {})
        await manager.create_checkpoint("wf", 1, "late", "completed", {})
        record = await manager.get_workflow("wf")
        assert record is not None
        assert (record.latest_step, record.latest_agent_id, record.latest_agent_status) == (
            2,
            "writer",
            "blocked",
        )
        assert await manager.list_workflows(agent_status="blocked") == ["wf"]
        assert await manager.list_workflows(agent_status=AgentStatus.COMPLETED) == []

    async def test_filters_and_pages(self, storage: WorkflowStorage) -> None:
        """Status, metadata and time filters combine; pages with cursors cover every match."""
        manager = new_manager(storage)
        for n in range(24):
            meta = {"tenant": f"t{n % 3}", "kind": "chat" if n % 2 else "batch"}
            await manager.register_workflow(f"wf-{n:02}", metadata=meta)
        for n in range(0, 24, 4):
            await manager.mark_workflow(f"wf-{n:02}", "finished")
        middle = utcnow()
        await anyio.sleep(0.01)
        await manager.mark_workflow("wf-23", "failed")
        wanted = [
            f"wf-{n:02}" for n in range(24) if n % 3 == 1 and n % 4 and n != 23
        ]  # tenant t1, unfinished
        pages: list[str] = []
        cursor: str | None = None
        while True:
            page = await manager.list_workflow_records(
                "unfinished", metadata={"tenant": "t1"}, limit=2, cursor=cursor
            )
            pages += [r.workflow_id for r in page]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert pages == wanted
        both = await manager.list_workflows(metadata={"tenant": "t1", "kind": "chat"})
        assert both == [f"wf-{n:02}" for n in range(24) if n % 3 == 1 and n % 2]
        assert await manager.list_workflows(updated_after=middle) == ["wf-23"]
        early = await manager.list_workflows(updated_before=middle, metadata={"tenant": "t2"})
        assert "wf-23" not in early and len(early) == 7
        record = await manager.get_workflow("wf-05")
        assert record is not None and record.metadata == {"tenant": "t2", "kind": "chat"}
        with pytest.raises(InvalidArgumentError):
            await manager.list_workflows(cursor="not a cursor")
        with pytest.raises(InvalidArgumentError):
            await manager.register_workflow("bad", metadata={"x": object()})
        assert await manager.get_workflow("bad") is None

    async def test_metadata_is_replaced_and_goes_with_the_workflow(
        self, storage: WorkflowStorage
    ) -> None:
        """Registering again replaces metadata; deleting the workflow drops it from filters."""
        manager = new_manager(storage)
        await manager.register_workflow("wf", metadata={"tenant": "a"})
        async with ResumableWorkflow("wf", manager, metadata={"tenant": "b"}):
            pass
        assert await manager.list_workflows(metadata={"tenant": "a"}) == []
        assert await manager.list_workflows(metadata={"tenant": "b"}) == ["wf"]
        assert await manager.delete_checkpoints("wf")
        await manager.register_workflow("wf")
        assert await manager.list_workflows(metadata={"tenant": "b"}) == []
        assert await manager.list_workflows(updated_after=utcnow() - timedelta(hours=1)) == ["wf"]


class WorkflowStorageConformance(WorkflowLifecycleConformance):
    """What backends with workflow records and leases must show (``WorkflowStorage``)."""

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_save_creates_unfinished_record(self, storage: WorkflowStorage) -> None:
        """The first checkpoint of a workflow creates an UNFINISHED record."""
        assert await storage.get_workflow("wf") is None
        await storage.save("wf", 0, b"x")
        record = await storage.get_workflow("wf")
        assert record is not None
        assert record.status is WorkflowStatus.UNFINISHED
        assert record.fencing_token == 0
        assert record.lease_owner is None

    async def test_status_changes_and_filters(self, storage: WorkflowStorage) -> None:
        """Statuses are set and listed by status; finished_at is set when a workflow ends."""
        await storage.save("a", 0, b"x")
        await storage.save("b", 0, b"x")
        await storage.set_workflow_status("c", WorkflowStatus.UNFINISHED)
        done = await storage.set_workflow_status("a", WorkflowStatus.FINISHED)
        await storage.set_workflow_status("b", WorkflowStatus.FAILED)
        assert done.finished_at is not None
        assert done.finished_at >= done.created_at
        unfinished = await storage.list_workflow_records(WorkflowStatus.UNFINISHED)
        assert [r.workflow_id for r in unfinished] == ["c"]
        everything = await storage.list_workflow_records()
        assert [(r.workflow_id, r.status) for r in everything] == [
            ("a", WorkflowStatus.FINISHED),
            ("b", WorkflowStatus.FAILED),
            ("c", WorkflowStatus.UNFINISHED),
        ]
        await storage.save("a", 1, b"y")
        record = await storage.get_workflow("a")
        assert record is not None
        assert record.status is WorkflowStatus.FINISHED  # a save never changes a status

    async def test_delete_workflow_deletes_record(self, storage: WorkflowStorage) -> None:
        """Deleting a whole workflow removes its record and lease too."""
        await storage.save("wf", 0, b"x")
        await storage.acquire_lease("wf", "runner", 30)
        assert await storage.delete("wf")
        assert await storage.get_workflow("wf") is None

    async def test_delete_of_a_registered_workflow_without_checkpoints(
        self, storage: WorkflowStorage
    ) -> None:
        """A workflow that has a record and a lease but no checkpoint is deleted whole."""
        await storage.set_workflow_status("wf", WorkflowStatus.UNFINISHED)
        await storage.acquire_lease("wf", "runner", 30)
        assert await storage.delete("wf")
        assert await storage.get_workflow("wf") is None
        assert await storage.claim_next_workflow("other", 30) is None

    async def test_lease_excludes_other_owners(self, storage: WorkflowStorage) -> None:
        """A live lease refuses other owners; the same owner re-acquires with a new token."""
        first = await storage.acquire_lease("wf", "a", 30)
        with pytest.raises(LeaseHeldError):
            await storage.acquire_lease("wf", "b", 30)
        again = await storage.acquire_lease("wf", "a", 30)
        assert again.token > first.token
        record = await storage.get_workflow("wf")
        assert record is not None
        assert (record.lease_owner, record.fencing_token) == ("a", again.token)

    async def test_expired_lease_can_be_taken_over(self, storage: WorkflowStorage) -> None:
        """After expiry another owner gets the lease with a larger token; the old one is lost."""
        old = await storage.acquire_lease("wf", "a", 0.05)
        await anyio.sleep(0.2)
        new = await storage.acquire_lease("wf", "b", 30)
        assert new.token > old.token
        with pytest.raises(LeaseLostError):
            await storage.renew_lease(old, 30)
        with pytest.raises(LeaseLostError):
            await storage.save("wf", 0, b"stale", fence=old)
        await storage.save("wf", 0, b"fresh", fence=new)
        got = await storage.load("wf", 0)
        assert got is not None
        assert got.data == b"fresh"
        with pytest.raises(LeaseLostError):
            await storage.set_workflow_status("wf", WorkflowStatus.FINISHED, fence=old)

    async def test_renew_and_release(self, storage: WorkflowStorage) -> None:
        """Renewal extends a current lease; release frees it; a stale release does nothing."""
        lease = await storage.acquire_lease("wf", "a", 1)
        renewed = await storage.renew_lease(lease, 60)
        assert renewed.token == lease.token
        assert renewed.expires_at > lease.expires_at
        await storage.release_lease(renewed)
        other = await storage.acquire_lease("wf", "b", 30)
        await storage.release_lease(renewed)  # stale: ignored
        record = await storage.get_workflow("wf")
        assert record is not None
        assert (record.lease_owner, record.fencing_token) == ("b", other.token)

    async def test_expired_but_untaken_lease_still_fences(self, storage: WorkflowStorage) -> None:
        """An expired lease nobody took over still writes and renews (its token is current)."""
        lease = await storage.acquire_lease("wf", "a", 0.05)
        await anyio.sleep(0.2)
        await storage.save("wf", 0, b"late but fine", fence=lease)
        renewed = await storage.renew_lease(lease, 30)
        assert renewed.token == lease.token

    async def test_claim_next_hands_out_each_workflow_once(self, storage: WorkflowStorage) -> None:
        """Concurrent claimers get distinct unfinished workflows, then None."""
        for n in range(20):
            await storage.set_workflow_status(f"wf-{n:02}", WorkflowStatus.UNFINISHED)
        await storage.set_workflow_status("done", WorkflowStatus.FINISHED)
        held = await storage.acquire_lease("wf-00", "someone", 30)
        claims: list[Lease | None] = []

        async def claim(owner: str) -> None:
            claims.append(await storage.claim_next_workflow(owner, 30))

        async with anyio.create_task_group() as tg:
            for n in range(25):
                tg.start_soon(claim, f"runner-{n}")
        got = [c.workflow_id for c in claims if c is not None]
        assert sorted(got) == [f"wf-{n:02}" for n in range(1, 20)]
        assert claims.count(None) == 6
        assert held.workflow_id not in got

    async def test_claim_takes_expired_leases(self, storage: WorkflowStorage) -> None:
        """An unfinished workflow whose lease expired can be claimed by another runner."""
        # Long enough that the claim below comes before it expires on a loaded machine.
        old = await storage.acquire_lease("wf", "dead-runner", 1.0)
        assert await storage.claim_next_workflow("b", 30) is None
        await anyio.sleep(1.2)
        claimed = await storage.claim_next_workflow("b", 30)
        assert claimed is not None
        assert claimed.workflow_id == "wf"
        assert claimed.token > old.token

    async def test_save_with_a_kind_makes_a_record_runners_never_claim(
        self, storage: WorkflowStorage
    ) -> None:
        """A save's kind goes on the record it creates; claims take the 'workflow' kind only."""
        thread = StepInfo("langgraph", "completed", "langgraph")
        await storage.save("lg:thread", 0, b"x", step_info=thread)
        await storage.save("wf", 0, b"x", step_info=StepInfo("agent", "completed"))
        await storage.save("plain", 0, b"x")
        kinds = {r.workflow_id: r.kind for r in await storage.list_workflow_records()}
        assert kinds == {"lg:thread": "langgraph", "wf": "workflow", "plain": "workflow"}
        claimed = {(await storage.claim_next_workflow(f"r{n}", 30)) for n in range(3)}
        assert {c.workflow_id for c in claimed if c is not None} == {"wf", "plain"}
        assert None in claimed
        record = await storage.get_workflow("lg:thread")
        assert record is not None and record.lease_owner is None

    async def test_a_kind_sticks_and_reaches_a_leased_record(
        self, storage: WorkflowStorage
    ) -> None:
        """A record made by a lease takes a save's kind; later saves never set it back."""
        lease = await storage.acquire_lease("lg:t", "saver", 30)
        thread = StepInfo("langgraph", "completed", "langgraph")
        await storage.save("lg:t", 2, b"x", fence=lease, step_info=thread)
        await storage.save("lg:t", 4, b"y", fence=lease, step_info=StepInfo("a", "completed"))
        await storage.save("lg:t", 6, b"z", fence=lease)
        await storage.release_lease(lease)
        record = await storage.get_workflow("lg:t")
        assert record is not None
        assert (record.kind, record.latest_step) == ("langgraph", 4)
        assert await storage.claim_next_workflow("runner", 30) is None

    async def test_kinds_in_one_batch_of_saves(self, storage: WorkflowStorage) -> None:
        """Concurrent saves of both kinds (one group commit) each give their record its kind."""
        thread = StepInfo("langgraph", "completed", "langgraph")
        plain = StepInfo("agent", "completed")

        async def save(n: int) -> None:
            await storage.save(f"w{n:02}", 1, b"x", step_info=thread if n % 2 else plain)

        async with anyio.create_task_group() as tg:
            for n in range(20):
                tg.start_soon(save, n)
        kinds = {r.workflow_id: r.kind for r in await storage.list_workflow_records()}
        assert kinds == {f"w{n:02}": "langgraph" if n % 2 else "workflow" for n in range(20)}

    async def test_registration_with_a_kind(self, storage: WorkflowStorage) -> None:
        """register_workflow's kind: a new record's, a default record's; others keep theirs."""
        await storage.register_workflow("lg:new", kind="langgraph")
        await storage.save("lg:new", 0, b"x")
        await storage.save("lg:old", 0, b"x")
        await storage.register_workflow("lg:old", kind="langgraph")
        await storage.save("other", 0, b"x", step_info=StepInfo("a", "completed", "other"))
        await storage.register_workflow("other", kind="langgraph")
        await storage.register_workflow("other", metadata='{"a": 1}')
        await storage.register_workflow("plain")
        with pytest.raises(InvalidArgumentError):
            await storage.register_workflow("bad", kind="Bad Kind!")
        kinds = {r.workflow_id: r.kind for r in await storage.list_workflow_records()}
        assert kinds == {
            "lg:new": "langgraph",
            "lg:old": "langgraph",
            "other": "other",
            "plain": "workflow",
        }
        claimed = await storage.claim_next_workflow("runner", 30)
        assert claimed is not None and claimed.workflow_id == "plain"
        assert await storage.claim_next_workflow("runner-2", 30) is None

    async def test_listings_filter_by_kind(self, storage: WorkflowStorage) -> None:
        """Listings take 'workflow' records by default; kind=None is every kind."""
        saver = CheckpointManager(storage, workflow_kind="langgraph")
        manager = CheckpointManager(storage)
        await saver.create_checkpoint("lg:t", 2, "langgraph", "completed", big_state(1))
        await manager.create_checkpoint("wf", 0, "agent", "completed", {"n": 1})
        assert await manager.list_workflows("unfinished") == ["wf"]
        assert await manager.list_workflows(kind="langgraph") == ["lg:t"]
        assert await manager.list_workflows("unfinished", kind=None) == ["lg:t", "wf"]
        assert await manager.list_workflows() == ["lg:t", "wf"]  # ids with checkpoints
        assert [r.workflow_id for r in await manager.list_workflow_records()] == ["wf"]
        every = await manager.list_workflow_records(kind=None)
        assert [(r.workflow_id, r.kind) for r in every] == [
            ("lg:t", "langgraph"),
            ("wf", "workflow"),
        ]
        query = WorkflowQuery(status=WorkflowStatus.UNFINISHED, kind="langgraph")
        assert [r.workflow_id for r in await storage.query_workflow_records(query)] == ["lg:t"]
        got = await saver.get_checkpoint("lg:t", 2)
        assert got.state_snapshot.data == big_state(1)  # also when saved as a tree
        assert (await manager.claim_workflow("runner")) is not None
        assert await manager.claim_workflow("runner") is None

    async def test_a_kind_is_checked(self, storage: WorkflowStorage) -> None:
        """A kind must be a short lowercase name: anything else is refused, nothing written."""
        for bad in ("", "Lang Graph", "x" * 33, 3, "lg\n"):
            with pytest.raises(InvalidArgumentError):
                CheckpointManager(storage, workflow_kind=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError):
                await CheckpointManager(storage).list_workflow_records(kind=bad)  # type: ignore[arg-type]
        assert await storage.list_workflow_records() == []
