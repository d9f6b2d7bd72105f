"""Conformance of the effect journal: records, doubt, deletes and listing."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, ClassVar

import anyio
import pytest

from ..codec import EffectRecord, EffectState
from ..errors import (
    CheckpointSerializationError,
    EffectInDoubtError,
    InvalidArgumentError,
    LeaseLostError,
    StorageClosedError,
    UnsupportedOperationError,
    WorkflowExistsError,
)
from ..leases import Lease, WorkflowStatus
from ..manager import CheckpointManager
from ..models import utcnow
from ..retention import RetentionPolicy
from ..storage.base import (
    CheckpointStorage,
    EffectListingStorage,
    EffectStorage,
    StoredEffect,
    WorkflowStorage,
)
from ..workflow import ResumableWorkflow
from ._support import TRICKY_IDS, Reopen, rec


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
            await storage.put_effect(wf, 1, TRICKY_IDS[-1 - n], rec(n), in_doubt=False)
        for n, wf in enumerate(TRICKY_IDS):
            got = await storage.load_effects(wf, 1)
            assert got == [StoredEffect(1, TRICKY_IDS[-1 - n], False, rec(n))]

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
            await storage.put_effect(wf, n, "k", rec(n), in_doubt=True)
        for n, wf in enumerate(TRICKY_IDS):
            assert await storage.in_doubt_effects(wf) == [StoredEffect(n, "k", True, rec(n))]

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
