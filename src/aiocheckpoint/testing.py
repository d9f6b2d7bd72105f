"""The storage conformance suite, for the bundled backends and third-party ones alike.

Subclass :class:`StorageConformance` in a pytest module and provide an async fixture named
``storage`` that yields a fresh, empty, open storage; every test then runs against it::

    import pytest
    from aiocheckpoint.testing import StorageConformance

    class TestMyBackend(StorageConformance):
        @pytest.fixture
        async def storage(self, tmp_path):
            store = MyStorage(tmp_path)
            yield store
            await store.close()

Durable backends also subclass :class:`PersistentStorageConformance` and provide
``reopen``, an async fixture returning a coroutine function that opens a *new* storage
object on the same location. Backends with workflow records and leases also subclass
:class:`WorkflowStorageConformance`; backends that keep content-addressed blobs
(:class:`~aiocheckpoint.storage.base.BlobCheckpointStorage`) subclass
:class:`BlobStorageConformance`, whose ``storage`` fixture should make
``collect_garbage()`` free unreferenced blobs at once (e.g. a near-zero grace period), and
those that read trees in their own thread (``BlobReads``) :class:`BlobReadsConformance`.
Backends with an effect journal (:class:`~aiocheckpoint.storage.base.EffectStorage`)
subclass :class:`EffectStorageConformance` and :class:`EffectJournalConformance` (and, if
durable, :class:`PersistentEffectConformance`); those whose journal lists itself
(:class:`~aiocheckpoint.storage.base.EffectListingStorage`, what ``copy`` and ``export``
need) :class:`EffectListingConformance`. Sweeps (``docs/retention.md``) are checked by
:class:`RetentionConformance` (every backend), :class:`WorkflowRetentionConformance`
(workflow TTLs, with records and effects) and :class:`BlobRetentionConformance` (blobs).
The suite needs pytest and pytest-asyncio. The
suites share this one module, so that a backend's tests import everything from one place.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest

from . import retention as _retention
from .codec import EffectRecord, EffectState, Keyring, decode_checkpoint, encode_checkpoint_v2
from .errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    CheckpointSerializationError,
    EffectInDoubtError,
    InvalidArgumentError,
    InvalidStepError,
    InvalidWorkflowIdError,
    LeaseHeldError,
    LeaseLostError,
    StorageClosedError,
    UnsupportedOperationError,
    WorkflowCancelledError,
    WorkflowExistsError,
)
from .format.header import record_format_version
from .leases import Lease, RetryPolicy, WorkflowStatus
from .manager import CheckpointManager
from .models import AgentStatus, utcnow
from .retention import RetentionPolicy, SweepReport
from .storage.base import (
    BlobCheckpointStorage,
    BlobReads,
    CheckpointStorage,
    EffectListingStorage,
    EffectStorage,
    StepInfo,
    StoredEffect,
    SweepStorage,
    WorkflowStorage,
)
from .storage.queries import WorkflowQuery
from .workflow import ResumableWorkflow

__all__ = [
    "BatchRetentionConformance",
    "BlobReadsConformance",
    "BlobRetentionConformance",
    "BlobStorageConformance",
    "EffectJournalConformance",
    "EffectListingConformance",
    "EffectStorageConformance",
    "PersistentEffectConformance",
    "PersistentStorageConformance",
    "RetentionConformance",
    "StorageConformance",
    "WorkflowControlConformance",
    "WorkflowEffectJournalConformance",
    "WorkflowLifecycleConformance",
    "WorkflowRetentionConformance",
    "WorkflowStorageConformance",
]

#: Workflow ids that naive backends confuse: separators, traversal, quoting, unicode.
TRICKY_IDS = (
    "a/b",
    "a_b",
    "a%2Fb",
    "..",
    "../x",
    "/etc/passwd",
    "C:\\Windows",
    " spaced ",
    "wf:1",
    "日本語",
    "'; DROP TABLE checkpoints; --",
    "CON",
    "a.b",
    "A/B",
    "é" * 127,
)

Reopen = Callable[[], Awaitable[CheckpointStorage]]


def _rec(n: int, size: int = 16) -> bytes:
    return (f"record-{n}-".encode() * (size // 8 + 1))[:size]


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
            await storage.save("wf", step, _rec(step))
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
        data = _rec(7, 2 * 1024 * 1024)
        await storage.save("wf", 0, data)
        got = await storage.load("wf")
        assert got is not None and got.data == data

    async def test_scan_orders_by_step(self, storage: CheckpointStorage) -> None:
        """Scan returns records in ascending step order, or descending when asked."""
        for step in (3, 1, 2, 10):
            await storage.save("wf", step, _rec(step))
        assert [r.step for r in await storage.scan("wf")] == [1, 2, 3, 10]
        assert [r.step for r in await storage.scan("wf", descending=True)] == [10, 3, 2, 1]
        assert (await storage.scan("wf"))[0].data == _rec(1)

    async def test_scan_pages_with_bounds_and_limit(self, storage: CheckpointStorage) -> None:
        """after/before are exclusive bounds and limit takes from the scan's start."""
        for step in range(10):
            await storage.save("wf", step, _rec(step))
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
            await storage.save("wf", step, _rec(step))
        assert await storage.delete("wf", 1) is True
        assert await storage.delete("wf", 1) is False
        assert [r.step for r in await storage.scan("wf")] == [0, 2]

    async def test_delete_latest_step_moves_latest_back(self, storage: CheckpointStorage) -> None:
        """After deleting the highest step, the latest is the next highest."""
        for step in range(3):
            await storage.save("wf", step, _rec(step))
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
            await storage.save("wf", step, _rec(step), keep_last=3)
        assert [r.step for r in await storage.scan("wf")] == [3, 4, 5]
        assert await storage.exists("other", 0)

    async def test_workflows_are_isolated(self, storage: CheckpointStorage) -> None:
        """Ids that differ only in separators or escaping are different workflows."""
        for n, wf in enumerate(TRICKY_IDS):
            await storage.save(wf, 0, _rec(n))
        assert await storage.list_workflows() == sorted(TRICKY_IDS)
        for n, wf in enumerate(TRICKY_IDS):
            got = await storage.load(wf, 0)
            assert got is not None and got.data == _rec(n), wf
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
                tg.start_soon(storage.save, f"wf-{n % 20}", n, _rec(n))
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
            await storage.save(wf, n, _rec(n, 100))
        await storage.save("kept", 1, b"a", keep_last=1)
        await storage.save("kept", 2, b"b", keep_last=1)
        await storage.close()
        again = await reopen()
        try:
            assert await again.list_workflows() == sorted([*TRICKY_IDS, "kept"])
            for n, wf in enumerate(TRICKY_IDS):
                got = await again.load(wf)
                assert got is not None and (got.step, got.data) == (n, _rec(n, 100))
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


class _Boom(RuntimeError):
    pass


def _manager(storage: WorkflowStorage) -> CheckpointManager:
    return CheckpointManager(storage)


class WorkflowLifecycleConformance:
    """Pausing, retries, metadata and filtered pages of workflow records.

    Part of :class:`WorkflowStorageConformance`; it runs through the public API.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_pause_ends_the_block_paused_and_resume_delivers_input(
        self, storage: WorkflowStorage
    ) -> None:
        """pause() ends the block PAUSED; runners skip it until resume_workflow(input)."""
        manager = _manager(storage)
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
        manager = _manager(storage)
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
        manager = _manager(storage)
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
        manager = _manager(storage)
        stepped = anyio.Event()
        with anyio.move_on_after(30) as deadline:
            async with ResumableWorkflow("deadline", manager) as wf:
                async with wf.step(0, agent_id="a"):
                    pass
                deadline.deadline = anyio.current_time()  # the deadline passes here
                await anyio.sleep(30)

        async def sibling() -> None:
            await stepped.wait()
            raise _Boom("sibling failed")

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
        except Exception as exc:  # the task group's ExceptionGroup, holding _Boom
            caught = exc
        assert any(isinstance(e, _Boom) for e in getattr(caught, "exceptions", ()))
        for workflow_id in ("deadline", "group"):
            record = await manager.get_workflow(workflow_id)
            assert record is not None and record.status is WorkflowStatus.UNFINISHED

    async def test_resume_refuses_what_is_not_paused(self, storage: WorkflowStorage) -> None:
        """resume_workflow: unknown workflow, or one that is not paused, is a typed error."""
        manager = _manager(storage)
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
        manager = _manager(storage)
        policy = RetryPolicy(max_attempts=2, backoff=0.3)
        await manager.register_workflow("wf")
        lease = await manager.claim_workflow("runner", retry=policy)
        assert lease is not None and lease.retry == policy
        with pytest.raises(_Boom):
            async with ResumableWorkflow("wf", manager, lease=lease):
                raise _Boom("first")
        record = await manager.get_workflow("wf")
        assert record is not None
        assert (record.status, record.attempts) == (WorkflowStatus.UNFINISHED, 1)
        assert record.retry_at is not None and record.retry_at > record.updated_at
        assert await manager.claim_workflow("runner", retry=policy) is None  # backoff
        await anyio.sleep(0.45)
        lease = await manager.claim_workflow("runner", retry=policy)
        assert lease is not None
        with pytest.raises(_Boom):
            async with ResumableWorkflow("wf", manager, lease=lease):
                raise _Boom("second")
        record = await manager.get_workflow("wf")
        assert record is not None
        assert (record.status, record.attempts) == (WorkflowStatus.FAILED, 2)
        assert record.last_error == {"type": "_Boom", "message": "second"}
        assert await manager.claim_workflow("runner", retry=policy) is None

    async def test_non_retryable_error_fails_at_once(self, storage: WorkflowStorage) -> None:
        """An error the policy does not name fails the workflow on the first attempt."""
        manager = _manager(storage)
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
        manager = _manager(storage)
        policy = RetryPolicy(max_attempts=2, backoff=0)
        for _ in range(2):
            with pytest.raises(_Boom):
                async with ResumableWorkflow("wf", manager, retry=policy):
                    raise _Boom("again")
        record = await manager.mark_workflow("wf", "paused")
        assert (record.status, record.attempts) == (WorkflowStatus.PAUSED, 2)
        await manager.mark_workflow("wf", "failed")
        record = await manager.mark_workflow("wf", "unfinished")
        assert (record.status, record.attempts) == (WorkflowStatus.UNFINISHED, 0)
        assert record.last_error == {"type": "_Boom", "message": "again"}
        with pytest.raises(_Boom):
            async with ResumableWorkflow("wf", manager, retry=policy):
                raise _Boom("once more")
        after = await manager.get_workflow("wf")
        assert after is not None
        assert (after.status, after.attempts) == (WorkflowStatus.UNFINISHED, 1)

    async def test_record_names_latest_step_agent_and_status(
        self, storage: WorkflowStorage
    ) -> None:
        """Each save updates the latest step, its agent and agent status; it never goes back."""
        manager = _manager(storage)
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
        manager = _manager(storage)
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
        manager = _manager(storage)
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
        await saver.create_checkpoint("lg:t", 2, "langgraph", "completed", _big_state(1))
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
        assert got.state_snapshot.data == _big_state(1)  # also when saved as a tree
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


def _keyring() -> Keyring:
    """A keyring of one fresh key (skips the test without the ``crypto`` extra)."""
    pytest.importorskip("cryptography", reason="encryption needs the 'crypto' extra")
    return Keyring(keys={"k1": os.urandom(32)}, primary="k1")


def _big_state(seed: int, tag: str = "", docs: int = 60) -> dict[str, Any]:
    """A state well over the inline limit: ~1 KB documents (same for one ``tag``), a counter."""
    return {
        "counter": seed,
        "docs": [{"id": i, "body": f"{tag} doc {i} " + "lorem ipsum " * 80} for i in range(docs)],
        "plan": ["step one", "step two"],
    }


class BlobStorageConformance:
    """What a :class:`~aiocheckpoint.storage.base.BlobCheckpointStorage` must show.

    Every test goes through :class:`~aiocheckpoint.CheckpointManager`, which writes states
    over ``blob_params.root_inline_limit`` as version-2 records plus blobs.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_is_a_blob_storage(self, storage: CheckpointStorage) -> None:
        """The storage implements the blob protocol, so the manager goes incremental."""
        assert isinstance(storage, BlobCheckpointStorage)
        assert CheckpointManager(storage).incremental

    async def test_large_state_round_trips_as_version_2(self, storage: CheckpointStorage) -> None:
        """A large state is stored as a version-2 record and reads back equal."""
        manager = CheckpointManager(storage)
        state = _big_state(1)
        written = await manager.create_checkpoint("wf", 0, "a", "running", state)
        stored = await storage.load("wf", 0)
        assert stored is not None and record_format_version(stored.data) == 2
        got = await manager.get_checkpoint("wf", 0)
        assert got == written and got.state_snapshot.data == state

    async def test_small_state_stays_version_1(self, storage: CheckpointStorage) -> None:
        """A small state is written as a plain version-1 record."""
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("wf", 0, "a", "running", {"k": 1})
        stored = await storage.load("wf", 0)
        assert stored is not None and record_format_version(stored.data) == 1
        assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == {"k": 1}

    async def test_fetch_returns_only_stored_blobs(self, storage: CheckpointStorage) -> None:
        """fetch_blobs returns stored blobs and leaves unknown hashes out."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        checkpoint = await manager.create_checkpoint("wf", 0, "a", "running", _big_state(2))
        _record, split = encode_checkpoint_v2(checkpoint, storage.blob_params)
        wanted = list(split.blobs)[:5]
        unknown = b"\x00" * storage.blob_params.digest_size
        got = await storage.fetch_blobs([*wanted, unknown])
        assert set(got) == set(wanted)
        assert all(got[h] == split.blobs[h] for h in wanted)

    async def test_mixed_versions_list_in_order(self, storage: CheckpointStorage) -> None:
        """list/iter/latest read a history that mixes version-1 and version-2 records."""
        manager = CheckpointManager(storage)
        states = [{"small": i} if i % 2 else _big_state(i) for i in range(6)]
        for i, state in enumerate(states):
            await manager.create_checkpoint("wf", i, "a", "running", state)
        listed = await manager.list_checkpoints("wf")
        assert [c.state_snapshot.data for c in listed] == states
        iterated = [
            c.state_snapshot.data async for c in manager.iter_checkpoints("wf", page_size=4)
        ]
        assert iterated == states
        latest = await manager.get_latest_checkpoint("wf")
        assert latest is not None and latest.state_snapshot.data == states[-1]

    async def test_replacing_a_step_reads_the_new_state(self, storage: CheckpointStorage) -> None:
        """Writing a step again with another large state replaces it."""
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("wf", 0, "a", "running", _big_state(1))
        await manager.create_checkpoint("wf", 0, "a", "running", _big_state(2))
        got = await manager.get_checkpoint("wf", 0)
        assert got.state_snapshot.data == _big_state(2)

    async def test_retention_keeps_newest_loadable(self, storage: CheckpointStorage) -> None:
        """max_checkpoints prunes old incremental checkpoints; the kept ones still load."""
        manager = CheckpointManager(storage, max_checkpoints=2)
        for i in range(5):
            await manager.create_checkpoint("wf", i, "a", "running", _big_state(i))
        await storage.collect_garbage()  # type: ignore[attr-defined]
        listed = await manager.list_checkpoints("wf")
        assert [c.step for c in listed] == [3, 4]
        assert [c.state_snapshot.data for c in listed] == [_big_state(3), _big_state(4)]

    async def test_gc_keeps_blobs_shared_with_remaining(self, storage: CheckpointStorage) -> None:
        """Deleting one of two checkpoints that share blobs, then collecting, keeps the other."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("a", 0, "x", "running", _big_state(1))
        await manager.create_checkpoint("b", 0, "x", "running", _big_state(2))
        await manager.delete_checkpoints("a")
        assert await storage.collect_garbage() >= 0
        got = await manager.get_checkpoint("b", 0)
        assert got.state_snapshot.data == _big_state(2)

    async def test_gc_frees_blobs_of_deleted_checkpoints(self, storage: CheckpointStorage) -> None:
        """After every checkpoint is deleted, the blobs they alone used are gone."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        checkpoint = await manager.create_checkpoint("wf", 0, "a", "running", _big_state(7))
        _record, split = encode_checkpoint_v2(checkpoint, storage.blob_params)
        await manager.delete_checkpoints("wf")
        await storage.collect_garbage()
        assert await storage.fetch_blobs(list(split.blobs)) == {}

    @pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
    async def test_a_fork_reads_whole_after_its_source_is_collected(
        self, storage: CheckpointStorage, encrypted: bool
    ) -> None:
        """Fork, delete the source, collect garbage: every step of the fork still reads.

        Encrypted, the fork's records are sealed again for the new workflow with the root's
        references in the clear: those must name every blob the tree relies on, or the
        store frees one with the source.
        """
        assert isinstance(storage, BlobCheckpointStorage)
        keyring = _keyring() if encrypted else None
        manager = CheckpointManager(storage, encryption=keyring)
        states = [_big_state(i, f"v{i % 2}") for i in range(3)]
        for i, state in enumerate(states):
            await manager.create_checkpoint("src", i, "a", "completed", state)
        assert await manager.fork_workflow("src", 2, "fork") == 3
        await manager.delete_checkpoints("src")
        await storage.collect_garbage()
        for i, state in enumerate(states):
            got = await manager.get_checkpoint("fork", i)
            assert got.state_snapshot.data == state, i
        point = await manager.get_resume_point("fork")
        assert point is not None and (point[0], point[1].data) == (3, states[2])

    async def test_record_with_missing_blobs_is_corrupted(self, storage: CheckpointStorage) -> None:
        """A version-2 record whose blobs are missing is corrupted; resume falls back.

        The error names the workflow and step, and the resume point is the previous step.
        """
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("wf", 0, "a", "completed", _big_state(1))
        orphan = await manager.create_checkpoint(
            "other", 1, "a", "running", _big_state(99, "orphan")
        )
        record, _split = encode_checkpoint_v2(
            orphan.model_copy(update={"workflow_id": "wf"}),
            storage.blob_params,  # type: ignore[attr-defined]
        )
        await manager.delete_checkpoints("other")
        await storage.collect_garbage()  # type: ignore[attr-defined]
        await storage.save("wf", 1, record)
        with pytest.raises(CheckpointCorruptedError) as info:
            await manager.get_checkpoint("wf", 1)
        assert (info.value.workflow_id, info.value.step) == ("wf", 1)
        resume = await manager.get_resume_point("wf")
        assert resume is not None and resume[0] == 1
        assert resume[1].data == _big_state(1)


class BlobReadsConformance:
    """What a blob store that also offers :class:`~aiocheckpoint.storage.base.BlobReads` must show.

    Optional: the manager reads a tree through ``read_blobs_in_thread`` when a store has it,
    else through ``fetch_blobs``. Subclass it beside :class:`BlobStorageConformance`.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_thread_reads_answer_like_fetch_blobs(self, storage: CheckpointStorage) -> None:
        """read_blobs_in_thread runs off the loop and fetches like fetch_blobs.

        What its function raises is passed on.
        """
        assert isinstance(storage, BlobReads)
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        checkpoint = await manager.create_checkpoint("wf", 0, "a", "running", _big_state(2))
        _record, split = encode_checkpoint_v2(checkpoint, storage.blob_params)
        wanted = list(split.blobs)
        unknown = b"\x00" * storage.blob_params.digest_size
        loop_thread = threading.get_ident()

        def read(fetch: Callable[[list[bytes]], Any]) -> tuple[int, Any, Any]:
            return threading.get_ident(), fetch(wanted[:3]), fetch([*wanted[3:], unknown])

        thread, first, rest = await storage.read_blobs_in_thread(read)
        assert thread != loop_thread
        assert {**first, **rest} == split.blobs

        def fail(_fetch: Any) -> None:
            raise KeyError("from fn")

        with pytest.raises(KeyError, match="from fn"):
            await storage.read_blobs_in_thread(fail)


class EffectStorageConformance:
    """What a storage with an effect journal must do (``EffectStorage``).

    Keep effect records by ``(step, key)``, list those in doubt, and let them go with their
    step's checkpoint. Its ``storage`` fixture yields a fresh store, as above.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_is_an_effect_storage(self, storage: CheckpointStorage) -> None:
        """The storage implements the EffectStorage protocol."""
        assert isinstance(storage, EffectStorage)

    async def test_put_then_load_ordered_by_key(self, storage: EffectStorage) -> None:
        """Records come back byte for byte, with their flag, ordered by key, per step."""
        await storage.put_effect("wf", 3, "b", b"\x00bee", in_doubt=True)
        await storage.put_effect("wf", 3, "a", b"ay", in_doubt=False)
        await storage.put_effect("wf", 4, "a", b"other step", in_doubt=False)
        got = await storage.load_effects("wf", 3)
        assert got == [StoredEffect(3, "a", False, b"ay"), StoredEffect(3, "b", True, b"\x00bee")]
        assert await storage.load_effects("wf", 5) == []
        assert await storage.load_effects("nope", 3) == []

    async def test_put_replaces_the_keys_record(self, storage: EffectStorage) -> None:
        """The outcome replaces the intent under the same key."""
        await storage.put_effect("wf", 0, "k", b"intent", in_doubt=True)
        await storage.put_effect("wf", 0, "k", b"done", in_doubt=False)
        assert await storage.load_effects("wf", 0) == [StoredEffect(0, "k", False, b"done")]

    async def test_tricky_ids_and_keys_are_isolated(self, storage: EffectStorage) -> None:
        """Ids and keys that naive backends confuse each keep their own records."""
        for n, wf in enumerate(TRICKY_IDS):
            await storage.put_effect(wf, 1, TRICKY_IDS[-1 - n], _rec(n), in_doubt=False)
        for n, wf in enumerate(TRICKY_IDS):
            got = await storage.load_effects(wf, 1)
            assert got == [StoredEffect(1, TRICKY_IDS[-1 - n], False, _rec(n))]

    async def test_in_doubt_workflows(self, storage: EffectStorage) -> None:
        """A workflow is listed while one of its records is in doubt, and not after."""
        assert await storage.in_doubt_workflows() == []
        await storage.put_effect("b", 0, "k", b"i", in_doubt=True)
        await storage.put_effect("a", 2, "k", b"i", in_doubt=True)
        await storage.put_effect("c", 0, "k", b"d", in_doubt=False)
        assert await storage.in_doubt_workflows() == ["a", "b"]
        await storage.put_effect("b", 0, "k", b"d", in_doubt=False)
        assert await storage.in_doubt_workflows() == ["a"]

    async def test_in_doubt_effects(self, storage: EffectStorage) -> None:
        """A workflow's records in doubt, every step's, by step then key; no other record."""
        await storage.put_effect("wf", 7, "b", b"intent b", in_doubt=True)
        await storage.put_effect("wf", 7, "a", b"intent a", in_doubt=True)
        await storage.put_effect("wf", 2, "z", b"intent z", in_doubt=True)
        await storage.put_effect("wf", 2, "done", b"d", in_doubt=False)
        await storage.put_effect("other", 0, "k", b"other", in_doubt=True)
        assert await storage.in_doubt_effects("wf") == [
            StoredEffect(2, "z", True, b"intent z"),
            StoredEffect(7, "a", True, b"intent a"),
            StoredEffect(7, "b", True, b"intent b"),
        ]
        await storage.put_effect("wf", 7, "a", b"settled", in_doubt=False)
        assert [(e.step, e.key) for e in await storage.in_doubt_effects("wf")] == [
            (2, "z"),
            (7, "b"),
        ]
        assert await storage.in_doubt_effects("nope") == []
        for n, wf in enumerate(TRICKY_IDS):
            await storage.put_effect(wf, n, "k", _rec(n), in_doubt=True)
        for n, wf in enumerate(TRICKY_IDS):
            assert await storage.in_doubt_effects(wf) == [StoredEffect(n, "k", True, _rec(n))]

    async def test_settling_the_last_doubt_returns_the_workflow_to_the_runners(
        self, storage: EffectStorage
    ) -> None:
        """FAILED on an effect in doubt, claimed by no runner; settled, a runner finishes it."""
        manager = CheckpointManager(storage)  # type: ignore[arg-type]
        calls: list[int] = []
        records = isinstance(storage, WorkflowStorage)
        if records:
            await manager.register_workflow("order")
        await _run_order(manager, calls, crash=True)  # killed inside the call
        with pytest.raises(EffectInDoubtError):
            await _run_order(manager, calls)
        if records:
            assert (await _status(manager, "order")) is WorkflowStatus.FAILED
            assert await manager.claim_workflow("runner") is None
        [doubt] = await manager.list_in_doubt_effects("order")
        assert (doubt.step, doubt.key, doubt.name) == (1, "charge", _charge_name())
        await manager.resolve_effect("order", doubt.step, doubt.key, happened=True, result="ch-1")
        assert await _run_order(manager, calls) == "ch-1" and calls == []  # never called
        if records:
            assert (await _status(manager, "order")) is WorkflowStatus.FINISHED

    async def test_settling_revives_only_a_workflow_failed_on_its_last_doubt(
        self, storage: EffectStorage
    ) -> None:
        """Another doubt left, or a last run failed by another error: it stays FAILED."""
        if not isinstance(storage, WorkflowStorage):
            return  # no workflow records, no status
        manager = CheckpointManager(storage)
        for wf in ("two", "other"):
            await manager.register_workflow(wf)
            for step, key in ((0, "a"), (3, "b")):
                await manager.record_effect(_intent(wf, step, key))
        await manager.record_failure("two", EffectInDoubtError("two", 0, "a", utcnow()))
        await manager.record_failure("other", ValueError("not a doubt"))
        for wf in ("two", "other"):
            await manager.resolve_effect(wf, 0, "a", happened=False)
        assert {await _status(manager, wf) for wf in ("two", "other")} == {WorkflowStatus.FAILED}
        assert await manager.claim_workflow("runner") is None
        await manager.resolve_effect("other", 3, "b", happened=False)
        with pytest.raises(CheckpointSerializationError):  # refused before any write
            await manager.resolve_effect("two", 3, "b", happened=True, result=object())
        assert await _status(manager, "two") is WorkflowStatus.FAILED
        await manager.resolve_effect("two", 3, "b", happened=True, result=[1])
        assert await _status(manager, "other") is WorkflowStatus.FAILED
        assert await _status(manager, "two") is WorkflowStatus.UNFINISHED
        lease = await manager.claim_workflow("runner")
        assert lease is not None and lease.workflow_id == "two"

    async def test_list_workflows_in_doubt(self, storage: EffectStorage) -> None:
        """list_workflows(in_doubt=...) splits the workflows by whether an effect is in doubt."""
        manager = CheckpointManager(storage)  # type: ignore[arg-type]
        for wf in ("a", "b", "c"):
            await manager.create_checkpoint(wf, 0, "agent", "completed", {"n": 1})
        await storage.put_effect("b", 0, "k", b"intent", in_doubt=True)
        await storage.put_effect("c", 0, "k", b"done", in_doubt=False)
        assert await manager.list_workflows(in_doubt=True) == ["b"]
        assert await manager.list_workflows(in_doubt=False) == ["a", "c"]
        await storage.put_effect("b", 0, "k", b"done", in_doubt=False)
        assert await manager.list_workflows(in_doubt=True) == []
        with pytest.raises(InvalidArgumentError):
            await manager.list_workflows(in_doubt="yes")  # type: ignore[arg-type]

    async def test_query_records_in_doubt(self, storage: EffectStorage) -> None:
        """The in_doubt filter of list_workflow_records combines with the others, paged."""
        if not isinstance(storage, WorkflowStorage):
            with pytest.raises(UnsupportedOperationError):
                await CheckpointManager(storage).list_workflow_records(in_doubt=True)  # type: ignore[arg-type]
            return
        manager = CheckpointManager(storage)
        for n, wf in enumerate(("a", "b", "c", "d")):
            await manager.register_workflow(wf, metadata={"team": n % 2})
            if wf != "a":
                await storage.put_effect(wf, 1, "k", b"intent", in_doubt=True)
        await storage.put_effect("d", 1, "k", b"done", in_doubt=False)
        await storage.put_effect("d", 2, "j", b"done", in_doubt=False)
        first = await manager.list_workflow_records(in_doubt=True, limit=1)
        rest = await manager.list_workflow_records(in_doubt=True, cursor=first.next_cursor)
        assert [r.workflow_id for r in [*first, *rest]] == ["b", "c"]
        assert await manager.list_workflows(in_doubt=False) == []  # no checkpoints
        assert await manager.list_workflows("unfinished", in_doubt=False) == ["a", "d"]
        assert await manager.list_workflows(metadata={"team": 1}, in_doubt=True) == ["b"]
        assert await manager.list_workflows(metadata={"team": 0}, in_doubt=True) == ["c"]

    async def test_effects_go_with_deleted_steps(self, storage: EffectStorage) -> None:
        """delete(wf, step) takes the step's effects, with or without a checkpoint."""
        store: Any = storage
        await store.save("wf", 1, b"one")
        for step in (1, 2, 3):
            await storage.put_effect("wf", step, "k", b"x", in_doubt=True)
        await store.delete("wf", 1)
        await store.delete("wf", 2)
        assert await storage.load_effects("wf", 1) == []
        assert await storage.load_effects("wf", 2) == []
        assert [e.step for e in await storage.load_effects("wf", 3)] == [3]
        await store.delete("wf")
        assert await storage.load_effects("wf", 3) == []
        assert await storage.in_doubt_workflows() == []

    async def test_retention_takes_the_effects_of_pruned_steps(
        self, storage: EffectStorage
    ) -> None:
        """keep_last deletes the pruned steps' effects, and keeps the rest."""
        store: Any = storage
        for step in (1, 2):
            await storage.put_effect("wf", step, "k", b"x", in_doubt=False)
            await store.save("wf", step, b"r", keep_last=1)
        await storage.put_effect("wf", 3, "k", b"running", in_doubt=True)
        assert await storage.load_effects("wf", 1) == []
        assert [e.step for e in await storage.load_effects("wf", 2)] == [2]
        assert [e.data for e in await storage.load_effects("wf", 3)] == [b"running"]

    async def test_replacing_a_checkpoint_keeps_its_effects(self, storage: EffectStorage) -> None:
        """A step checkpointed again (a retry) keeps the effects it recorded."""
        store: Any = storage
        await store.save("wf", 1, b"failed")
        await storage.put_effect("wf", 1, "k", b"x", in_doubt=False)
        await store.save("wf", 1, b"completed")
        assert len(await storage.load_effects("wf", 1)) == 1

    async def test_effects_alone_list_no_workflow(self, storage: EffectStorage) -> None:
        """A workflow with effects but no checkpoint is not in list_workflows."""
        await storage.put_effect("wf", 0, "k", b"x", in_doubt=True)
        assert await storage.list_workflows() == []  # type: ignore[attr-defined]

    async def test_bad_keys_are_refused(self, storage: EffectStorage) -> None:
        """Empty, NUL-holding, too long or non-str keys raise InvalidArgumentError."""
        for key in ("", "a\x00b", "k" * 256, 7):
            with pytest.raises(InvalidArgumentError):
                await storage.put_effect("wf", 0, key, b"x", in_doubt=True)  # type: ignore[arg-type]
        assert await storage.load_effects("wf", 0) == []

    async def test_fence(self, storage: EffectStorage) -> None:
        """With leases, a stale lease's put is refused; without, a fence is unsupported."""
        if not isinstance(storage, WorkflowStorage):
            fake = Lease(workflow_id="wf", owner="o", token=1, expires_at=utcnow(), ttl=1.0)
            with pytest.raises(UnsupportedOperationError):
                await storage.put_effect("wf", 0, "k", b"x", in_doubt=True, fence=fake)
            return
        old = await storage.acquire_lease("wf", "a", 0.05)
        await anyio.sleep(0.1)
        new = await storage.acquire_lease("wf", "b", 30)
        with pytest.raises(LeaseLostError):
            await storage.put_effect("wf", 0, "k", b"stale", in_doubt=True, fence=old)
        await storage.put_effect("wf", 0, "k", b"fresh", in_doubt=True, fence=new)
        assert [e.data for e in await storage.load_effects("wf", 0)] == [b"fresh"]

    async def test_concurrent_puts(self, storage: EffectStorage) -> None:
        """Many concurrent puts (distinct keys, some repeated) all land, the last one wins."""
        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(
                    functools.partial(storage.put_effect, in_doubt=True), "wf", 0, f"k{n}", b"1"
                )
        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(
                    functools.partial(storage.put_effect, in_doubt=False), "wf", 0, f"k{n}", b"2"
                )
        got = await storage.load_effects("wf", 0)
        assert len(got) == 40 and {(e.in_doubt, e.data) for e in got} == {(False, b"2")}

    async def test_closed_storage_refuses_effects(self, storage: EffectStorage) -> None:
        """After close, the effect methods raise StorageClosedError."""
        await storage.close()  # type: ignore[attr-defined]
        with pytest.raises(StorageClosedError):
            await storage.put_effect("wf", 0, "k", b"x", in_doubt=True)
        with pytest.raises(StorageClosedError):
            await storage.load_effects("wf", 0)
        with pytest.raises(StorageClosedError):
            await storage.in_doubt_workflows()
        with pytest.raises(StorageClosedError):
            await storage.in_doubt_effects("wf")

    async def test_workflow_effect_runs_once(self, storage: CheckpointStorage) -> None:
        """Through ResumableWorkflow: a retried step returns the recorded result, uncalled."""
        manager = CheckpointManager(storage)
        calls: list[str] = []

        async def send(to: str) -> dict[str, Any]:
            calls.append(to)
            return {"sent": to, "n": len(calls)}

        async def failing_step(wf: ResumableWorkflow) -> None:
            async with wf.step(0, agent_id="a"):
                await wf.effect("mail", send, "bob")
                raise RuntimeError("the step fails after the mail went out")

        async with ResumableWorkflow("wf", manager) as wf:
            with pytest.raises(RuntimeError):
                await failing_step(wf)
            async with wf.step(0, agent_id="a"):
                again = await wf.effect("mail", send, "bob")
        assert calls == ["bob"] and again == {"sent": "bob", "n": 1}
        [record] = await manager.get_effects("wf", 0)
        assert record.state is EffectState.DONE and record.result == again


class _Killed(BaseException):
    """A crash inside an effect's call: its intent stays, without an outcome."""


async def _charge(amount: int, calls: list[int], crash: bool) -> str:
    if crash:
        raise _Killed
    calls.append(amount)
    return f"ch-{amount}"


def _charge_name() -> str:
    return _charge.__qualname__


async def _run_order(manager: CheckpointManager, calls: list[int], crash: bool = False) -> Any:
    """Workflow "order" (a claimed lease where there are leases): step 0, then a charge."""
    lease = None
    if manager.supports_workflow_records():
        lease = await manager.claim_workflow("runner")
        assert lease is not None, "no runner can claim the workflow"
    try:
        async with ResumableWorkflow("order", manager, lease=lease) as wf:
            if not wf.is_completed(0):
                async with wf.step(0, agent_id="a"):
                    wf.state.set("cart", 3)
            async with wf.step(1, agent_id="a"):
                receipt = await wf.effect("charge", _charge, 30, calls, crash)
    except _Killed:
        return None
    return receipt


async def _status(manager: CheckpointManager, workflow_id: str) -> WorkflowStatus:
    record = await manager.get_workflow(workflow_id)
    assert record is not None
    return record.status


def _intent(workflow_id: str, step: int, key: str) -> EffectRecord:
    return EffectRecord(
        workflow_id=workflow_id,
        step=step,
        key=key,
        name="f",
        state=EffectState.IN_DOUBT,
        attempt=1,
        intent_at=utcnow(),
        idempotency_key=f"ack-{workflow_id}-{step}-{key}",
    )


class PersistentEffectConformance:
    """What durable effect journals add: records outlive the storage object that wrote them."""

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_effects_survive_reopen(self, storage: EffectStorage, reopen: Reopen) -> None:
        """Effect records and the in-doubt list are there after close and reopen."""
        await storage.put_effect("wf", 1, "a", b"done", in_doubt=False)
        await storage.put_effect("wf", 1, "b", b"intent", in_doubt=True)
        await storage.close()  # type: ignore[attr-defined]
        again: Any = await reopen()
        try:
            got = await again.load_effects("wf", 1)
            assert got == [
                StoredEffect(1, "a", False, b"done"),
                StoredEffect(1, "b", True, b"intent"),
            ]
            assert await again.in_doubt_workflows() == ["wf"]
        finally:
            await again.close()


# --- the journal lives and dies with its workflow (docs/effects.md) --------------------


class _Crash(BaseException):
    """Stands for the process dying in the middle of an effect's call."""


#: When the journal tests' TTL sweeps look: past a one-day TTL.
_JOURNAL_LATER = timedelta(days=2)


class EffectJournalConformance:
    """A workflow's effect journal goes with the workflow, and only with it.

    For a storage with an effect journal (next to :class:`EffectStorageConformance`): a
    fork refuses a target that has only effect records; deleting a workflow (``delete``,
    ``delete_checkpoints``, a TTL sweep where the store keeps workflow records) takes its
    whole journal, so a new run of the same id starts with an empty one; an effect in doubt
    survives everything that keeps its workflow.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_has_effects_sees_any_record_of_any_step(self, storage: EffectStorage) -> None:
        """has_effects is True from a workflow's first effect record until its last goes."""
        store: Any = storage
        assert not await storage.has_effects("wf")
        await storage.put_effect("wf", 7, "k", b"x", in_doubt=False)
        await storage.put_effect(TRICKY_IDS[0], 0, "k", b"x", in_doubt=True)
        assert await storage.has_effects("wf") and await storage.has_effects(TRICKY_IDS[0])
        assert not any([await storage.has_effects(wf) for wf in TRICKY_IDS[1:]])
        await store.delete("wf", 7)
        assert not await storage.has_effects("wf")

    async def test_fork_refuses_a_target_with_only_effect_records(
        self, storage: EffectStorage
    ) -> None:
        """A fork refuses a target whose only trace is an effect journal.

        A journal left by a run killed in its first step makes the id taken: the fork
        raises WorkflowExistsError and writes nothing; once the target is deleted, the fork
        goes ahead with an empty journal.
        """
        manager = CheckpointManager(storage)  # type: ignore[arg-type]
        store: Any = storage
        await manager.create_checkpoint("src", 0, "a", "running", {"n": 1})
        stale = StoredEffect(0, "charge", False, b"an earlier run's result")
        await storage.put_effect("dst", 0, stale.key, stale.data, in_doubt=False)
        if isinstance(storage, WorkflowStorage):
            assert await storage.get_workflow("dst") is None  # only the journal
        with pytest.raises(WorkflowExistsError, match="effect records") as refused:
            await manager.fork_workflow("src", 0, "dst")
        assert (refused.value.workflow_id, refused.value.holds) == ("dst", "effect records")
        assert not await store.exists("dst")
        assert await storage.load_effects("dst", 0) == [stale]
        await manager.delete_checkpoints("dst")
        assert await manager.fork_workflow("src", 0, "dst") == 1
        assert await storage.load_effects("dst", 0) == []

    async def _charge_once(self, manager: CheckpointManager, workflow_id: str) -> list[int]:
        """Charge once at step 0; leave effects in doubt at step 1 and at checkpointless 9.

        Returns the charges made (a replay of step 0 adds none).
        """
        charges: list[int] = []

        async def charge() -> int:
            charges.append(len(charges) + 1)
            return charges[-1]

        async with ResumableWorkflow(workflow_id, manager) as wf:
            async with wf.step(0, agent_id="a"):
                await wf.effect("charge", charge)
            async with wf.step(1, agent_id="a"):
                pass
        storage: Any = manager.storage
        await storage.put_effect(workflow_id, 1, "refund", b"intent", in_doubt=True)
        await storage.put_effect(workflow_id, 9, "probe", b"intent", in_doubt=True)
        async with ResumableWorkflow(workflow_id, manager) as wf, wf.step(0, agent_id="a"):
            assert await wf.effect("charge", charge) == 1  # recorded: not called again
        return charges

    async def _journal_is_gone(self, manager: CheckpointManager, workflow_id: str) -> None:
        storage: Any = manager.storage
        assert not await storage.has_effects(workflow_id)
        for step in (0, 1, 9):
            assert await storage.load_effects(workflow_id, step) == []
        assert workflow_id not in await storage.in_doubt_workflows()
        charges: list[str] = []

        async def charge() -> str:
            charges.append("new run")
            return "new run"

        async with ResumableWorkflow(workflow_id, manager) as wf, wf.step(0, agent_id="a"):
            assert await wf.effect("charge", charge) == "new run"
        assert charges == ["new run"]  # the new run starts with an empty journal

    @pytest.mark.parametrize("how", ["storage.delete", "delete_checkpoints"])
    async def test_deleting_a_workflow_takes_its_journal(
        self, storage: EffectStorage, how: str
    ) -> None:
        """delete(wf) and delete_checkpoints(wf) take the workflow's whole journal.

        Done records, those in doubt and those of steps without a checkpoint all go; a new
        run of the same id starts with an empty journal and calls its effects.
        """
        manager = CheckpointManager(storage)  # type: ignore[arg-type]
        assert await self._charge_once(manager, "wf") == [1]
        await storage.put_effect("kept", 0, "k", b"intent", in_doubt=True)
        if how == "storage.delete":
            assert await storage.delete("wf")  # type: ignore[attr-defined]
        else:
            assert await manager.delete_checkpoints("wf")
        await self._journal_is_gone(manager, "wf")
        assert await storage.in_doubt_workflows() == ["kept"]

    async def test_an_effect_in_doubt_survives_what_keeps_its_workflow(
        self, storage: EffectStorage
    ) -> None:
        """An effect in doubt stays in doubt for as long as its workflow is kept.

        Later and replaced checkpoints, deleted steps and workflows around it, a fork of
        it, thinning, sweeps, leases: its step's re-run still raises EffectInDoubtError
        without calling it.
        """
        manager = CheckpointManager(storage)  # type: ignore[arg-type]
        calls: list[str] = []

        async def charge() -> str:
            calls.append("charge")
            raise _Crash

        for step in range(3):
            await manager.create_checkpoint("wf", step, "a", "completed", {"n": step})
        with pytest.raises(_Crash):
            async with ResumableWorkflow("wf", manager) as wf, wf.step(3, agent_id="a"):
                await wf.effect("charge", charge)
        await self._keep_the_workflow(manager)
        assert "wf" in await storage.in_doubt_workflows()
        [record] = await manager.get_effects("wf", 3)
        assert record.state is EffectState.IN_DOUBT
        with pytest.raises(EffectInDoubtError):
            async with ResumableWorkflow("wf", manager) as wf, wf.step(3, agent_id="a"):
                await wf.effect("charge", charge)
        assert calls == ["charge"]

    async def _keep_the_workflow(self, manager: CheckpointManager) -> None:
        """Everything that keeps workflow ``wf`` (whose step 3 has an effect in doubt)."""
        storage: Any = manager.storage
        for _ in range(2):  # its step checkpointed, then replaced
            await manager.create_checkpoint("wf", 3, "a", "failed", {"n": 3})
        await manager.delete_checkpoints("wf", 0)
        await manager.create_checkpoint("other", 3, "a", "completed", {"n": 3})
        await storage.put_effect("other", 3, "charge", b"intent", in_doubt=True)
        await manager.delete_checkpoints("other")
        await manager.fork_workflow("wf", 3, "copy")
        await manager.delete_checkpoints("copy")
        await manager.thin_workflow("wf", policy=RetentionPolicy(keep_last=1))
        await manager.sweep(policy=RetentionPolicy(keep_last=1, keep_terminal=False))
        if isinstance(storage, WorkflowStorage):
            lease = await storage.acquire_lease("wf", "operator", 30)
            await storage.release_lease(await storage.renew_lease(lease, 30))
            await manager.mark_workflow("wf", WorkflowStatus.UNFINISHED)
            ttls = RetentionPolicy(finished_ttl=timedelta(days=1), failed_ttl=timedelta(days=1))
            await manager.sweep(now=utcnow() + _JOURNAL_LATER, policy=ttls)


class WorkflowEffectJournalConformance(EffectJournalConformance):
    """The journal cases of a store that also keeps workflow records.

    :class:`EffectJournalConformance`, plus: a TTL sweep takes a workflow's whole journal.
    """

    async def test_a_ttl_sweep_takes_the_journal(self, storage: WorkflowStorage) -> None:
        """A workflow swept by its TTL goes with its whole journal (stores with records)."""
        manager = CheckpointManager(storage)
        await self._charge_once(manager, "wf")
        await manager.mark_workflow("wf", WorkflowStatus.FINISHED)
        policy = RetentionPolicy(finished_ttl=timedelta(days=1))
        report = await manager.sweep(now=utcnow() + _JOURNAL_LATER, policy=policy)
        assert report.workflows_deleted == {"finished": 1}
        assert await storage.get_workflow("wf") is None
        await self._journal_is_gone(manager, "wf")


class EffectListingConformance:
    """What an effect journal that lists itself must do (``EffectListingStorage``).

    ``copy`` and ``export`` find every effect record through it, including those of steps
    (and workflows) with no checkpoint. Its ``storage`` fixture yields a fresh store.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_is_an_effect_listing_storage(self, storage: CheckpointStorage) -> None:
        """The storage implements the EffectListingStorage protocol."""
        assert isinstance(storage, EffectListingStorage)

    async def test_lists_workflows_and_steps_without_checkpoints(
        self, storage: EffectListingStorage
    ) -> None:
        """Workflows and steps are listed by their effects alone, sorted, each once."""
        store: Any = storage
        assert await storage.effect_workflows() == []
        await store.save("b", 1, b"one")
        await storage.put_effect("b", 7, "k", b"running", in_doubt=True)
        await storage.put_effect("b", 1, "k", b"done", in_doubt=False)
        await storage.put_effect("b", 1, "j", b"done", in_doubt=False)
        await storage.put_effect("a", 0, "k", b"done", in_doubt=False)
        await store.save("c", 0, b"no effects")
        assert await storage.effect_workflows() == ["a", "b"]
        assert await storage.effect_steps("b") == [1, 7]
        assert await storage.effect_steps("a") == [0]
        assert await storage.effect_steps("c") == []
        assert await storage.effect_steps("nope") == []

    async def test_listing_follows_deletes(self, storage: EffectListingStorage) -> None:
        """A deleted step or workflow is no longer listed."""
        store: Any = storage
        for step in (2, 10):
            await storage.put_effect("wf", step, "k", b"x", in_doubt=False)
        await store.delete("wf", 2)
        assert await storage.effect_steps("wf") == [10]
        await store.delete("wf")
        assert await storage.effect_steps("wf") == []
        assert await storage.effect_workflows() == []

    async def test_tricky_ids_and_large_steps(self, storage: EffectListingStorage) -> None:
        """Ids that naive backends confuse and steps up to 2**63 - 1 list as written."""
        last = 2**63 - 1
        for wf in TRICKY_IDS:
            await storage.put_effect(wf, last, "k", b"x", in_doubt=False)
        assert await storage.effect_workflows() == sorted(TRICKY_IDS)
        for wf in TRICKY_IDS:
            assert await storage.effect_steps(wf) == [last]

    async def test_closed_storage_refuses_listing(self, storage: EffectListingStorage) -> None:
        """After close, both listings raise StorageClosedError."""
        await storage.close()  # type: ignore[attr-defined]
        with pytest.raises(StorageClosedError):
            await storage.effect_workflows()
        with pytest.raises(StorageClosedError):
            await storage.effect_steps("wf")


# --- retention and TTL (docs/retention.md) ---------------------------------------------

#: A policy that thins histories: the newest 3, every 5th step, the terminal checkpoints.
_THIN = RetentionPolicy(keep_last=3, keep_every=5, batch_size=4)
_LATER = timedelta(days=2)


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
        sizes: dict[tuple[str, int], int] = {}
        cuts = [cut for h in histories if (cut := await sweep.cut(h, sizes)) is not None]
        await sweep.apply(storage, cuts, sizes)
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
        report = await manager.sweep(now=utcnow() + _LATER)
        assert report.workflows_deleted == {"finished": 1, "failed": 1}
        assert report.workflow_bytes == size > 500
        assert await manager.list_workflows() == ["idle", "paused"]
        assert await storage.get_workflow("done") is None
        assert await storage.load_effects("done", 0) == []  # type: ignore[attr-defined]
        idle = RetentionPolicy(idle_ttl=timedelta(hours=1))
        report = await manager.sweep(now=utcnow() + _LATER, policy=idle)
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
        report = await manager.sweep(now=utcnow() + _LATER)
        assert report.skipped_leased == 1 and report.deleted == 0
        await manager.create_checkpoint("held", 1, "a", "running", {"k": 2}, lease=lease)
        await storage.release_lease(lease)
        assert (await manager.sweep(now=utcnow() + _LATER)).workflows_deleted == {"idle": 1}
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
            reports.append(await manager.sweep(now=utcnow() + _LATER))

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
                await manager.sweep(now=utcnow() + _LATER)

        async with anyio.create_task_group() as group:
            group.start_soon(runner)
            group.start_soon(sweeper)
        for workflow_id in ids:
            record = await storage.get_workflow(workflow_id)
            assert (record is None) == (await _steps(storage, workflow_id) == []), workflow_id

    async def _expired_record(self, storage: WorkflowStorage, workflow_id: str) -> Any:
        """The record as the sweep's page read sees it, two days later with a 1-day TTL."""
        query = _retention._expired(WorkflowStatus.UNFINISHED, utcnow() + _LATER, 1000)
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
            await manager.create_checkpoint("wf", i, "a", "running", _big_state(i, f"v{i}"))
            for i in range(4)
        ]
        splits = [encode_checkpoint_v2(c, storage.blob_params)[1] for c in written]
        await manager.sweep()
        kept = set(splits[2].blobs) | set(splits[3].blobs)
        gone = (set(splits[0].blobs) | set(splits[1].blobs)) - kept
        assert gone and await storage.fetch_blobs(list(gone)) == {}
        got = await manager.list_checkpoints("wf")
        assert [c.state_snapshot.data for c in got] == [_big_state(i, f"v{i}") for i in (2, 3)]

    async def test_forks_keep_shared_blobs_when_the_source_is_swept(
        self, storage: CheckpointStorage
    ) -> None:
        """Deleting a fork's source (by TTL or thinning) keeps every blob the fork reads."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage, retention=RetentionPolicy(keep_last=1))
        for i in range(3):
            await manager.create_checkpoint("src", i, "a", "running", _big_state(i, "s"))
        await manager.fork_workflow("src", 1, "fork")
        await manager.sweep()  # thins src to [2] and the fork to [1]: src's step 1 goes
        assert await _steps(storage, "src") == [2]
        got = await manager.list_checkpoints("fork")
        assert [c.step for c in got] == [1]
        assert got[0].state_snapshot.data == _big_state(1, "s")


class WorkflowControlConformance:
    """Cancel and retry (``WorkflowControlStorage``), through the public API.

    Its ``storage`` fixture yields a fresh store that keeps workflow records.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_cancel_revokes_the_lease_and_is_never_claimed(
        self, storage: WorkflowStorage
    ) -> None:
        """A cancel stores CANCELLED and its reason, and fences the runner's lease out."""
        manager = _manager(storage)
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
        manager = _manager(storage)
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
        manager = _manager(storage)
        await manager.register_workflow("failed")
        await manager.record_failure("failed", _Boom("down"))
        await manager.record_failure("failed", _Boom("down"))
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
        manager = _manager(storage)
        await manager.register_workflow("wf")
        with pytest.raises(InvalidArgumentError, match="unfinished"):
            await manager.retry_workflow("wf")
        with pytest.raises(CheckpointNotFoundError):
            await manager.retry_workflow("missing")
        assert await manager.get_workflow("missing") is None
        await manager.record_failure("wf", _Boom("down"))
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
        manager = _manager(storage)
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
        manager = _manager(storage)
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
        manager = _manager(storage)

        async def run() -> None:
            async with (
                ResumableWorkflow("wf", manager, lease_owner="runner") as wf,
                wf.step(0, agent_id="a"),
            ):
                await manager.cancel_workflow("wf", reason="stop")
                raise _Boom("the body's own error")

        with pytest.raises(_Boom):
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
        manager = _manager(storage)
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
        manager = _manager(storage)
        await manager.create_checkpoint("wf", 0, "a", "completed", {"k": 1})
        await manager.cancel_workflow("wf")
        await manager.register_workflow("idle")
        policy = RetentionPolicy(failed_ttl=timedelta(days=1))
        report = await manager.sweep(now=utcnow() + _LATER, policy=policy)
        assert report.workflows_deleted == {"cancelled": 1}
        assert await manager.get_workflow("wf") is None
        assert [r.workflow_id for r in await manager.list_workflow_records()] == ["idle"]

    async def test_a_driver_without_a_lease_cannot_overwrite_the_cancel(
        self, storage: WorkflowStorage
    ) -> None:
        """No lease to revoke: its closing status write is refused and it raises the cancel."""
        manager = _manager(storage)
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
        manager = _manager(storage)
        await manager.register_workflow("wf")

        async def run() -> None:
            async with ResumableWorkflow("wf", manager) as wf, wf.step(0, agent_id="a"):
                await manager.cancel_workflow("wf", reason="stop")
                raise _Boom("the body's own error")

        with pytest.raises(_Boom):
            await run()
        record = await manager.get_workflow("wf")
        assert record is not None and record.status is WorkflowStatus.CANCELLED
        assert (record.attempts, record.finished_at is not None) == (0, True)

    async def test_only_a_retry_moves_a_cancelled_workflow(self, storage: WorkflowStorage) -> None:
        """Marking or failing a CANCELLED workflow is refused (naming retry_workflow), unchanged."""
        manager = _manager(storage)
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
            await manager.record_failure("wf", _Boom("late"), retry=RetryPolicy(max_attempts=3))
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
        manager = _manager(storage)

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
