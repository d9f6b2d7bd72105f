"""Conformance of sweeps: retention policies, workflow TTLs and blob collection."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest

from .. import retention as _retention
from ..codec import encode_checkpoint_v2
from ..errors import InvalidArgumentError, LeaseHeldError
from ..leases import WorkflowStatus
from ..manager import CheckpointManager
from ..models import utcnow
from ..retention import RetentionPolicy, SweepReport
from ..storage.base import (
    BlobCheckpointStorage,
    CheckpointStorage,
    EffectStorage,
    SweepStorage,
    WorkflowStorage,
)
from ._support import LATER, big_state

_THIN = RetentionPolicy(keep_last=3, keep_every=5, batch_size=4)


async def _history(manager: CheckpointManager, workflow_id: str, steps: int) -> None:
    """Steps 0..steps-1, all RUNNING except step 7 (FAILED) and steps 2 and 11 (COMPLETED)."""
    for step in range(steps):
        status = {7: "failed", 2: "completed", 11: "completed"}.get(step, "running")
        await manager.create_checkpoint(workflow_id, step, "a", status, {"step": step})


async def _steps(storage: CheckpointStorage, workflow_id: str) -> list[int]:
    return [r.step for r in await storage.scan(workflow_id)]


class RetentionConformance:
    """What a sweep does to any storage: thin histories by a :class:`RetentionPolicy`."""

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_sweep_thins_by_the_policy(self, storage: CheckpointStorage) -> None:
        """Newest 3, every 5th, every FAILED and the newest COMPLETED stay; the rest goes."""
        manager = CheckpointManager(storage, retention=_THIN)
        await _history(manager, "wf", 20)
        assert len(await _steps(storage, "wf")) == 20  # sweeps prune, not writes
        report = await manager.sweep()
        assert await _steps(storage, "wf") == [0, 5, 7, 10, 11, 15, 17, 18, 19]
        assert report.checkpoints_deleted == 11 and report.workflows_thinned == 1
        assert report.checkpoint_bytes > 0 and report.deleted == 11
        assert await manager.list_workflows() == ["wf"]
        assert (await manager.sweep()).checkpoints_deleted == 0

    async def test_dry_run_deletes_nothing_and_reports_the_same(
        self, storage: CheckpointStorage
    ) -> None:
        """A dry run counts what a sweep deletes, and deletes none of it."""
        manager = CheckpointManager(storage, retention=_THIN)
        await _history(manager, "wf", 20)
        dry = await manager.sweep(dry_run=True)
        assert dry.dry_run and len(await _steps(storage, "wf")) == 20
        real = await manager.sweep()
        assert (dry.checkpoints_deleted, dry.checkpoint_bytes) == (
            real.checkpoints_deleted,
            real.checkpoint_bytes,
        )

    async def test_without_terminal_rule_only_the_window_and_multiples_stay(
        self, storage: CheckpointStorage
    ) -> None:
        """keep_terminal=False lets FAILED and COMPLETED checkpoints go like any other."""
        policy = RetentionPolicy(keep_last=2, keep_every=10, keep_terminal=False)
        manager = CheckpointManager(storage, retention=policy)
        await _history(manager, "wf", 14)
        await manager.sweep()
        assert await _steps(storage, "wf") == [0, 10, 12, 13]

    async def test_max_checkpoints_is_the_write_time_shorthand(
        self, storage: CheckpointStorage
    ) -> None:
        """max_checkpoints=N prunes at each write, as RetentionPolicy.latest(N) does."""
        short = CheckpointManager(storage, max_checkpoints=2)
        assert short.retention == RetentionPolicy.latest(2)
        await _history(short, "a", 6)
        assert await _steps(storage, "a") == [4, 5]
        assert (await short.sweep()).checkpoints_deleted == 0
        with pytest.raises(InvalidArgumentError):
            CheckpointManager(storage, max_checkpoints=2, retention=_THIN)

    async def test_sweep_racing_writers_keeps_every_kept_step(
        self, storage: CheckpointStorage
    ) -> None:
        """Sweeps running while writers add steps never delete one the policy keeps."""
        policy = RetentionPolicy(keep_last=4, keep_every=8, keep_terminal=False, batch_size=3)
        manager = CheckpointManager(storage, retention=policy)
        ids = ["w0", "w1", "w2"]

        async def write(workflow_id: str) -> None:
            for step in range(40):
                await manager.create_checkpoint(workflow_id, step, "a", "running", {"n": step})

        async def sweep_while(done: anyio.Event) -> None:
            while not done.is_set():
                await manager.sweep()
                await anyio.lowlevel.checkpoint()

        done = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(sweep_while, done)
            async with anyio.create_task_group() as writers:
                for workflow_id in ids:
                    writers.start_soon(write, workflow_id)
            done.set()
        await manager.sweep()
        for workflow_id in ids:
            assert await _steps(storage, workflow_id) == [0, 8, 16, 24, 32, 36, 37, 38, 39]
        assert await manager.list_workflows() == ids

    async def test_thin_workflow_applies_a_policy_to_one_workflow(
        self, storage: CheckpointStorage
    ) -> None:
        """thin_workflow thins the one workflow, by the manager's policy or the one given."""
        manager = CheckpointManager(storage, retention=_THIN)
        await _history(manager, "a", 12)
        await _history(manager, "b", 12)
        dense = RetentionPolicy(keep_last=6, keep_terminal=False)
        report = await manager.thin_workflow("a", policy=dense)
        assert report.checkpoints_deleted == 6 and report.workflows_thinned == 1
        assert await _steps(storage, "a") == [6, 7, 8, 9, 10, 11]
        assert len(await _steps(storage, "b")) == 12
        assert (await manager.thin_workflow("b")).checkpoints_deleted == 6

    async def test_thinning_drops_effects_below_the_oldest_kept_checkpoint(
        self, storage: CheckpointStorage
    ) -> None:
        """Thinning drops the effects of its steps, and of checkpointless steps below.

        Below the oldest kept checkpoint, a step without a checkpoint has no run that may
        still use its journal; above it (and the running step after the newest) all stay.
        """
        assert isinstance(storage, EffectStorage)
        manager = CheckpointManager(storage, retention=RetentionPolicy(keep_last=2))
        for step in (0, 2, 4, 6, 8):
            await manager.create_checkpoint("wf", step, "a", "running", {"s": step})
        effects = {1: ["a"], 3: ["a", "b"], 4: ["a"], 7: ["a"], 8: ["a"], 9: ["a"]}
        for step, keys in effects.items():
            for key in keys:
                await storage.put_effect("wf", step, key, b"r", in_doubt=step == 9)

        async def journal() -> dict[int, int]:
            found = {s: len(await storage.load_effects("wf", s)) for s in range(10)}
            return {s: n for s, n in found.items() if n}

        dry = await manager.sweep(dry_run=True)
        assert dry.effects_deleted == 0 and await journal() == {1: 1, 3: 2, 4: 1, 7: 1, 8: 1, 9: 1}
        report = await manager.sweep()
        assert await _steps(storage, "wf") == [6, 8]
        assert report.effects_deleted == 3  # steps 1 and 3; step 4's went with its checkpoint
        assert await journal() == {7: 1, 8: 1, 9: 1}
        assert await storage.in_doubt_workflows() == ["wf"]  # the running step 9's intent
        assert (await manager.sweep()).effects_deleted == 0

    async def test_a_sweep_batch_thins_each_workflow_by_its_own_history(
        self, storage: CheckpointStorage
    ) -> None:
        """Workflows swept in one batch each lose what the policy drops of their own history.

        One to thin by every rule, one with one step over the window, one with nothing to
        delete but an orphaned effect below its oldest checkpoint, one with nothing at all.
        """
        manager = CheckpointManager(
            storage, retention=RetentionPolicy(keep_last=2, keep_every=5, batch_size=50)
        )
        await _history(manager, "long", 12)
        for workflow_id, steps in (("three", (3, 4, 5)), ("orphan", (4, 6)), ("short", (0, 1))):
            for step in steps:
                await manager.create_checkpoint(workflow_id, step, "a", "running", {"s": step})
        effects = isinstance(storage, EffectStorage)
        if effects:
            for step in (1, 7):  # below the oldest checkpoint, and the running step
                await storage.put_effect("orphan", step, "k", b"r", in_doubt=False)  # type: ignore[attr-defined]
        report = await manager.sweep()
        kept = {wf: await _steps(storage, wf) for wf in ("long", "three", "orphan", "short")}
        assert kept == {
            "long": [0, 5, 7, 10, 11],
            "three": [4, 5],
            "orphan": [4, 6],
            "short": [0, 1],
        }
        assert (report.checkpoints_deleted, report.workflows_thinned) == (8, 2)
        if effects:
            assert report.effects_deleted == 1
            assert await storage.load_effects("orphan", 1) == []  # type: ignore[attr-defined]
            assert len(await storage.load_effects("orphan", 7)) == 1  # type: ignore[attr-defined]
        again = await manager.sweep()
        assert (again.checkpoints_deleted, again.effects_deleted) == (0, 0)

    async def test_bad_policies_are_refused(self, storage: CheckpointStorage) -> None:
        """Bad policies raise InvalidArgumentError; a manager without one cannot sweep."""
        for bad in (
            {"keep_last": 0},
            {"keep_last": True},
            {"keep_every": 5},
            {"keep_last": 3, "keep_interval": timedelta(0)},
            {"finished_ttl": 3600},
            {"idle_ttl": timedelta(seconds=-1)},
            {"batch_size": 0},
            {"keep_lastt": 3},
        ):
            with pytest.raises(InvalidArgumentError):
                RetentionPolicy(**bad)
        with pytest.raises(InvalidArgumentError):
            CheckpointManager(storage, retention={"keep_last": 3})  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await CheckpointManager(storage).sweep()


class BatchRetentionConformance(RetentionConformance):
    """The retention cases of a store that sweeps a page of workflows at a time.

    :class:`RetentionConformance`, plus the batch of
    :class:`~aiocheckpoint.storage.base.SweepStorage`: it deletes only what it read.
    """

    async def test_a_batch_deletes_only_what_it_read(self, storage: CheckpointStorage) -> None:
        """Steps written (freely or under a lease) between a batch's read and its delete stay.

        The batch deletes the steps it judged below each workflow's window, nothing else:
        a workflow written meanwhile keeps its new steps and their effects.
        """
        assert isinstance(storage, SweepStorage)
        policy = RetentionPolicy(keep_last=2)  # every step RUNNING: the newest 2 stay
        manager = CheckpointManager(storage, retention=policy)
        ids = ["a", "b", "c"]
        for workflow_id in ids:
            for step in range(5):
                await manager.create_checkpoint(workflow_id, step, "a", "running", {"s": step})
        budget = {"more_than": 2, "max_records": 100, "max_bytes": 1 << 20}
        histories = await storage.histories(after=None, limit=10, **budget)
        assert [(h.workflow_id, h.count, h.oldest, h.paused) for h in histories] == [
            (wf, 5, 0, False) for wf in ids
        ]
        page = await storage.histories(after="a", limit=1, **budget)
        assert [h.workflow_id for h in page] == ["b"]
        await manager.create_checkpoint("b", 5, "a", "running", {"s": 5})
        lease = None
        if isinstance(storage, WorkflowStorage):
            lease = await storage.acquire_lease("c", "runner", 30)
        await manager.create_checkpoint("c", 5, "a", "running", {"s": 5}, lease=lease)
        if isinstance(storage, EffectStorage):
            await storage.put_effect("c", 6, "k", b"r", in_doubt=True, fence=lease)
        sweep = _retention._Sweep(
            storage, policy, SweepReport(dry_run=False, started_at=utcnow()), False, lambda _: None
        )
        tally = _retention.Tally()
        cuts = [cut for h in histories if (cut := await sweep.cut(h, tally)) is not None]
        await sweep.apply(storage, cuts, tally)
        assert {wf: await _steps(storage, wf) for wf in ids} == {
            "a": [3, 4],
            "b": [3, 4, 5],
            "c": [3, 4, 5],
        }
        assert (sweep.report.checkpoints_deleted, sweep.report.workflows_thinned) == (9, 3)
        if isinstance(storage, EffectStorage):
            assert len(await storage.load_effects("c", 6)) == 1


class WorkflowRetentionConformance:
    """Workflow TTLs on a storage with workflow records, leases and effects.

    ``racing_save_keeps_record`` False (PostgreSQL): a lease-less save that races a whole
    workflow's delete keeps its checkpoint, but may leave it without a record until the
    workflow's next write (``docs/retention.md``).
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]
    racing_save_keeps_record: ClassVar[bool] = True

    async def _statuses(self, manager: CheckpointManager) -> None:
        for workflow_id, status in (
            ("done", WorkflowStatus.FINISHED),
            ("failed", WorkflowStatus.FAILED),
            ("idle", WorkflowStatus.UNFINISHED),
            ("paused", WorkflowStatus.PAUSED),
        ):
            await manager.create_checkpoint(workflow_id, 0, "a", "completed", {"k": 1})
            await manager.mark_workflow(workflow_id, status)

    async def test_ttls_delete_whole_workflows_by_status(self, storage: WorkflowStorage) -> None:
        """Each TTL takes its status's workflows, with their records and effects."""
        policy = RetentionPolicy(finished_ttl=timedelta(days=1), failed_ttl=timedelta(days=1))
        manager = CheckpointManager(storage, retention=policy)
        await self._statuses(manager)
        await storage.put_effect("done", 0, "send", b"x", in_doubt=False)  # type: ignore[attr-defined]
        assert (await manager.sweep()).deleted == 0  # not old enough yet
        await manager.create_checkpoint("done", 1, "a", "completed", {"k": "x" * 500})
        await manager.mark_workflow("done", WorkflowStatus.FINISHED)
        size = 0
        for workflow_id in ("done", "failed"):
            size += sum(len(r.data) for r in await storage.scan(workflow_id))
        report = await manager.sweep(now=utcnow() + LATER)
        assert report.workflows_deleted == {"finished": 1, "failed": 1}
        assert report.workflow_bytes == size > 500
        assert await manager.list_workflows() == ["idle", "paused"]
        assert await storage.get_workflow("done") is None
        assert await storage.load_effects("done", 0) == []  # type: ignore[attr-defined]
        idle = RetentionPolicy(idle_ttl=timedelta(hours=1))
        report = await manager.sweep(now=utcnow() + LATER, policy=idle)
        assert report.workflows_deleted == {"idle": 1}
        assert await manager.list_workflows() == ["paused"]

    async def test_finished_ttls_count_from_when_the_workflow_ended(
        self, storage: WorkflowStorage
    ) -> None:
        """A finished or failed workflow touched after it ended still goes by its end time.

        Metadata and leases change ``updated_at``, not ``finished_at``; the idle TTL keeps
        counting from the last change, so a touched unfinished workflow stays.
        """
        policy = RetentionPolicy(
            finished_ttl=timedelta(days=1),
            failed_ttl=timedelta(days=1),
            idle_ttl=timedelta(days=1),
        )
        manager = CheckpointManager(storage, retention=policy)
        await self._statuses(manager)
        ended = {}
        for workflow_id in ("done", "failed"):
            record = await storage.get_workflow(workflow_id)
            assert record is not None and record.finished_at is not None
            ended[workflow_id] = record.finished_at
        await anyio.sleep(0.05)
        middle = utcnow()
        await anyio.sleep(0.05)
        for workflow_id in ("done", "failed", "idle"):  # touched after the middle
            await manager.register_workflow(workflow_id, metadata={"seen": True})
            lease = await storage.acquire_lease(workflow_id, "reader", 30)
            await storage.release_lease(lease)
        for workflow_id, moment in ended.items():
            record = await storage.get_workflow(workflow_id)
            assert record is not None and record.finished_at == moment
            assert record.updated_at > middle
        report = await manager.sweep(now=middle + timedelta(days=1))
        assert report.workflows_deleted == {"finished": 1, "failed": 1}
        assert await manager.list_workflows() == ["idle", "paused"]

    async def test_a_workflow_marked_finished_again_counts_from_the_new_end(
        self, storage: WorkflowStorage
    ) -> None:
        """Marking a finished workflow finished again moves its end: the TTL restarts."""
        manager = CheckpointManager(storage, retention=RetentionPolicy(finished_ttl=timedelta(1)))
        await manager.create_checkpoint("wf", 0, "a", "completed", {"k": 1})
        await manager.mark_workflow("wf", WorkflowStatus.FINISHED)
        await anyio.sleep(0.05)
        middle = utcnow()
        await anyio.sleep(0.05)
        await manager.mark_workflow("wf", WorkflowStatus.FINISHED)
        record = await storage.get_workflow("wf")
        assert record is not None and record.finished_at is not None
        assert record.finished_at > middle
        assert (await manager.sweep(now=middle + timedelta(1))).deleted == 0
        report = await manager.sweep(now=record.finished_at + timedelta(1, seconds=1))
        assert report.workflows_deleted == {"finished": 1}

    async def test_a_leased_workflow_is_never_swept(self, storage: WorkflowStorage) -> None:
        """A live lease keeps its workflow, however old; once released it goes."""
        manager = CheckpointManager(storage, retention=RetentionPolicy(idle_ttl=timedelta(1)))
        await manager.create_checkpoint("held", 0, "a", "running", {"k": 1})
        lease = await storage.acquire_lease("held", "runner", 30)
        report = await manager.sweep(now=utcnow() + LATER)
        assert report.skipped_leased == 1 and report.deleted == 0
        await manager.create_checkpoint("held", 1, "a", "running", {"k": 2}, lease=lease)
        await storage.release_lease(lease)
        assert (await manager.sweep(now=utcnow() + LATER)).workflows_deleted == {"idle": 1}
        assert await manager.list_workflows() == []

    async def test_sweep_leaves_paused_workflows_whole(self, storage: WorkflowStorage) -> None:
        """keep_paused keeps a paused workflow's whole history; thinning the others."""
        manager = CheckpointManager(storage, retention=_THIN)
        await _history(manager, "paused", 12)
        await _history(manager, "running", 12)
        await manager.mark_workflow("paused", WorkflowStatus.PAUSED)
        await manager.sweep()
        assert len(await _steps(storage, "paused")) == 12
        assert await _steps(storage, "running") == [0, 5, 7, 9, 10, 11]

    async def test_two_sweepers_delete_each_workflow_once(self, storage: WorkflowStorage) -> None:
        """Concurrent sweeps split the work: every expired workflow is deleted exactly once."""
        policy = RetentionPolicy(finished_ttl=timedelta(hours=1), batch_size=3)
        manager = CheckpointManager(storage, retention=policy)
        for n in range(12):
            await manager.create_checkpoint(f"wf{n:02}", 0, "a", "completed", {"n": n})
            await manager.mark_workflow(f"wf{n:02}", WorkflowStatus.FINISHED)
        await manager.create_checkpoint("live", 0, "a", "running", {"n": 0})
        reports: list[SweepReport] = []

        async def sweep() -> None:
            reports.append(await manager.sweep(now=utcnow() + LATER))

        async with anyio.create_task_group() as group:
            group.start_soon(sweep)
            group.start_soon(sweep)
        assert sum(r.workflows_deleted.get("finished", 0) for r in reports) == 12
        assert await manager.list_workflows() == ["live"]

    async def test_runners_and_a_ttl_sweep_racing_leave_no_half_workflow(
        self, storage: WorkflowStorage
    ) -> None:
        """Runners writing under leases never lose a write to a concurrent TTL sweep.

        Every workflow ends either whole (record and checkpoints) or gone (neither).
        """
        manager = CheckpointManager(storage, retention=RetentionPolicy(idle_ttl=timedelta(1)))
        ids = [f"wf{n:02}" for n in range(12)]
        for workflow_id in ids:
            await manager.create_checkpoint(workflow_id, 0, "a", "running", {"n": 0})

        async def runner() -> None:
            for workflow_id in ids:
                try:
                    lease = await storage.acquire_lease(workflow_id, "runner", 30)
                except LeaseHeldError:  # the sweeper holds it: it is being deleted
                    continue
                await manager.create_checkpoint(workflow_id, 1, "a", "running", {}, lease=lease)
                await storage.release_lease(lease)

        async def sweeper() -> None:
            for _ in range(3):
                await manager.sweep(now=utcnow() + LATER)

        async with anyio.create_task_group() as group:
            group.start_soon(runner)
            group.start_soon(sweeper)
        for workflow_id in ids:
            record = await storage.get_workflow(workflow_id)
            assert (record is None) == (await _steps(storage, workflow_id) == []), workflow_id

    async def _expired_record(self, storage: WorkflowStorage, workflow_id: str) -> Any:
        """The record as the sweep's page read sees it, two days later with a 1-day TTL."""
        query = _retention._expired(WorkflowStatus.UNFINISHED, utcnow() + LATER, 1000)
        found = [r for r in await storage.query_workflow_records(query)]
        return next(r for r in found if r.workflow_id == workflow_id)

    def _sweep(self, storage: WorkflowStorage) -> Any:
        report = SweepReport(dry_run=False, started_at=utcnow())
        policy = RetentionPolicy(idle_ttl=timedelta(1))
        return _retention._Sweep(storage, policy, report, False, lambda _id: None)

    async def test_a_workflow_written_during_the_sweep_is_kept(
        self, storage: WorkflowStorage
    ) -> None:
        """A write (even of the same latest step, without a lease) after the read survives.

        Between the sweep's read and its delete, the write moved the record's updated_at:
        the conditional delete refuses. A write after the delete makes a new workflow.
        """
        manager = CheckpointManager(storage, retention=RetentionPolicy(idle_ttl=timedelta(1)))
        await manager.create_checkpoint("wf", 0, "a", "running", {"k": 1})
        seen = await self._expired_record(storage, "wf")
        await manager.create_checkpoint("wf", 0, "a", "running", {"k": 2})  # same step
        sweep = self._sweep(storage)
        await sweep.expire_one(seen, "idle")
        assert sweep.report.workflows_deleted == {} and sweep.report.skipped_changed == 1
        got = await manager.get_checkpoint("wf", 0)
        assert got.state_snapshot.data == {"k": 2}
        seen = await self._expired_record(storage, "wf")
        await sweep.expire_one(seen, "idle")  # nothing wrote since this read: it goes
        assert sweep.report.workflows_deleted == {"idle": 1} and sweep.report.workflow_bytes > 0
        assert await storage.get_workflow("wf") is None and await _steps(storage, "wf") == []

    async def test_a_lease_taken_after_the_read_keeps_the_workflow(
        self, storage: WorkflowStorage
    ) -> None:
        """A runner that leases the workflow between the read and the delete keeps it."""
        manager = CheckpointManager(storage, retention=RetentionPolicy(idle_ttl=timedelta(1)))
        await manager.create_checkpoint("wf", 0, "a", "running", {"k": 1})
        seen = await self._expired_record(storage, "wf")
        lease = await storage.acquire_lease("wf", "runner", 30)
        sweep = self._sweep(storage)
        await sweep.expire_one(seen, "idle")
        assert await _steps(storage, "wf") == [0]
        await storage.release_lease(lease)
        assert await storage.delete_workflow("wf", updated_at=seen.updated_at) is None

    async def test_a_ttl_batch_keeps_the_workflows_written_or_leased_after_its_read(
        self, storage: WorkflowStorage
    ) -> None:
        """One batch of TTL deletes: the untouched workflows go whole, the others stay whole.

        Between the page's read and its delete, one workflow is written (without a lease)
        and one is leased: both keep their record, checkpoints and effects.
        """
        manager = CheckpointManager(storage, retention=RetentionPolicy(idle_ttl=timedelta(1)))
        ids = ["a", "b", "c", "d"]
        for workflow_id in ids:
            await manager.create_checkpoint(workflow_id, 0, "a", "running", {"k": 1})
            await storage.put_effect(workflow_id, 0, "send", b"x", in_doubt=False)  # type: ignore[attr-defined]
        seen = [await self._expired_record(storage, workflow_id) for workflow_id in ids]
        await manager.create_checkpoint("b", 1, "a", "running", {"k": 2})
        await storage.acquire_lease("c", "runner", 30)
        sweep = self._sweep(storage)
        await sweep.expire_page(seen, "idle")
        assert sweep.report.workflows_deleted == {"idle": 2}
        assert sweep.report.skipped_changed == 2 and sweep.report.workflow_bytes > 0
        for workflow_id, steps in (("a", []), ("b", [0, 1]), ("c", [0]), ("d", [])):
            assert await _steps(storage, workflow_id) == steps
            assert (await storage.get_workflow(workflow_id) is None) == (not steps)
            journal = await storage.load_effects(workflow_id, 0)  # type: ignore[attr-defined]
            assert len(journal) == (1 if steps else 0)
        assert await manager.list_workflows() == ["b", "c"]

    async def test_lease_less_writers_racing_ttl_sweeps_lose_nothing(
        self, storage: WorkflowStorage
    ) -> None:
        """A lease-less rewrite of the latest step racing its workflow's delete loses nothing.

        Many rounds, the write started at varying points of the sweep's delete: whatever
        the order, the acknowledged write is there afterwards, with its record.
        """
        manager = CheckpointManager(storage, retention=RetentionPolicy(idle_ttl=timedelta(1)))
        for n in range(40):
            workflow_id = f"wf{n:02}"
            await manager.create_checkpoint(workflow_id, 3, "a", "running", {"v": "old"})
            seen = await self._expired_record(storage, workflow_id)
            sweep = self._sweep(storage)

            async def write(pause: int = n % 8, workflow_id: str = workflow_id) -> None:
                for _ in range(pause):
                    await anyio.lowlevel.checkpoint()
                await manager.create_checkpoint(workflow_id, 3, "a", "running", {"v": "new"})

            async with anyio.create_task_group() as group:
                group.start_soon(write)
                group.start_soon(sweep.expire_one, seen, "idle")
            got = await manager.get_checkpoint(workflow_id, 3)
            assert got.state_snapshot.data == {"v": "new"}, (n, sweep.report)
            assert workflow_id in await manager.list_workflows()
            if self.racing_save_keeps_record:
                assert await storage.get_workflow(workflow_id) is not None


class BlobRetentionConformance:
    """Sweeps on a storage with content-addressed blobs: forks share, GC reclaims."""

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_sweep_frees_the_blobs_of_thinned_checkpoints(
        self, storage: CheckpointStorage
    ) -> None:
        """A thinned checkpoint's own blobs are gone after the sweep; kept ones still load."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage, retention=RetentionPolicy(keep_last=2))
        written = [
            await manager.create_checkpoint("wf", i, "a", "running", big_state(i, f"v{i}"))
            for i in range(4)
        ]
        splits = [encode_checkpoint_v2(c, storage.blob_params)[1] for c in written]
        await manager.sweep()
        kept = set(splits[2].blobs) | set(splits[3].blobs)
        gone = (set(splits[0].blobs) | set(splits[1].blobs)) - kept
        assert gone and await storage.fetch_blobs(list(gone)) == {}
        got = await manager.list_checkpoints("wf")
        assert [c.state_snapshot.data for c in got] == [big_state(i, f"v{i}") for i in (2, 3)]

    async def test_forks_keep_shared_blobs_when_the_source_is_swept(
        self, storage: CheckpointStorage
    ) -> None:
        """Deleting a fork's source (by TTL or thinning) keeps every blob the fork reads."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage, retention=RetentionPolicy(keep_last=1))
        for i in range(3):
            await manager.create_checkpoint("src", i, "a", "running", big_state(i, "s"))
        await manager.fork_workflow("src", 1, "fork")
        await manager.sweep()  # thins src to [2] and the fork to [1]: src's step 1 goes
        assert await _steps(storage, "src") == [2]
        got = await manager.list_checkpoints("fork")
        assert [c.step for c in got] == [1]
        assert got[0].state_snapshot.data == big_state(1, "s")
