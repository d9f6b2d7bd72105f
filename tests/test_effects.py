"""Durable effects through ResumableWorkflow, on every backend (docs/effects.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointSerializationError,
    CheckpointStorage,
    EffectInDoubtError,
    EffectOrderError,
    EffectRecord,
    EffectState,
    FileCheckpointStorage,
    InMemoryCheckpointStorage,
    InvalidArgumentError,
    LeaseLostError,
    Reconciled,
    ResumableWorkflow,
    RetryPolicy,
)
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

Open = Callable[[], CheckpointStorage]


@pytest.fixture(params=["memory", "file", "sqlite", "postgres"])
async def open_store(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[Open]:
    """Opens storage objects on one store (the in-memory one: the same object each time)."""
    opened: list[CheckpointStorage] = []
    memory = InMemoryCheckpointStorage()

    def make() -> CheckpointStorage:
        store: CheckpointStorage
        if request.param == "memory":
            return memory
        if request.param == "file":
            store = FileCheckpointStorage(tmp_path / "store")
        elif request.param == "sqlite":
            store = SQLiteCheckpointStorage(tmp_path / "fx.db")
        else:
            store = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=4)
        opened.append(store)
        return store

    yield make
    for store in [*opened, memory]:
        await store.close()


class Calls:
    """A counting side effect."""

    def __init__(self) -> None:
        self.made: list[tuple[Any, ...]] = []

    async def send(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.made.append((*args, *sorted(kwargs.items())))
        return {"n": len(self.made)}


class Interrupted(BaseException):
    """Stands for a crash in the middle of a call: nothing after it runs."""


async def leave_in_doubt(manager: CheckpointManager, key: str | None, step: int = 0) -> None:
    """Run a step whose effect's call is interrupted after its intent was recorded."""

    async def crash(*_: Any, **__: Any) -> None:
        raise Interrupted

    wf = ResumableWorkflow("wf", manager)
    await wf.try_resume()
    with pytest.raises(Interrupted):
        async with wf.step(step, agent_id="a"):
            await wf.effect(key, crash)


async def test_resumed_step_returns_recorded_results(open_store: Open) -> None:
    """After a crash before the step's checkpoint, a new run returns the results, uncalled."""
    calls = Calls()
    first = CheckpointManager(open_store())
    wf = ResumableWorkflow("wf", first)
    with pytest.raises(Interrupted):
        async with wf.step(0, agent_id="a"):
            await wf.effect("search", calls.send, "q")
            await wf.effect(None, calls.send, "mail")
            raise Interrupted
    async with ResumableWorkflow("wf", CheckpointManager(open_store())) as again:
        async with again.step(0, agent_id="a"):
            found = await again.effect("search", calls.send, "q")
            mailed = await again.effect(None, calls.send, "mail")
    assert (found, mailed) == ({"n": 1}, {"n": 2}) and len(calls.made) == 2


async def test_in_doubt_raises_naming_key_step_and_time(open_store: Open) -> None:
    """An intent without an outcome raises EffectInDoubtError instead of calling again."""
    manager = CheckpointManager(open_store())
    await leave_in_doubt(manager, "pay")
    assert await manager.list_in_doubt_workflows() == ["wf"]
    calls = Calls()
    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(EffectInDoubtError) as caught:
        async with wf.step(0, agent_id="a"):
            await wf.effect("pay", calls.send)
    error = caught.value
    assert (error.workflow_id, error.step, error.key) == ("wf", 0, "pay")
    [record] = await manager.get_effects("wf", 0)
    assert record.in_doubt and error.intent_at == record.intent_at and calls.made == []


async def test_idempotent_effect_runs_again_with_a_stable_key(open_store: Open) -> None:
    """idempotent=True calls an in-doubt effect again, with the first attempt's key."""
    manager = CheckpointManager(open_store())
    await leave_in_doubt(manager, "pay")
    [intent] = await manager.get_effects("wf", 0)
    calls = Calls()
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="a"):
            await wf.effect("pay", calls.send, 5, idempotent=True)
    assert calls.made == [(5, ("idempotency_key", intent.idempotency_key))]
    [done] = await manager.get_effects("wf", 0)
    assert (done.state, done.attempt, done.idempotency_key) == (
        EffectState.DONE,
        2,
        intent.idempotency_key,
    )
    assert await manager.list_in_doubt_workflows() == []


async def test_reconcile_decides_an_in_doubt_effect(open_store: Open) -> None:
    """reconcile's answer is recorded (happened) or the function is called (did not)."""
    manager = CheckpointManager(open_store())
    await leave_in_doubt(manager, "a")
    await leave_in_doubt(manager, "b")
    asked: list[str] = []

    async def check(record: EffectRecord) -> Reconciled:
        asked.append(record.key)
        return Reconciled(happened=record.key == "a", result={"found": record.key})

    calls = Calls()
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="a"):
            a = await wf.effect("a", calls.send, reconcile=check)
            b = await wf.effect("b", calls.send, reconcile=check)
    assert (a, b, asked, len(calls.made)) == ({"found": "a"}, {"n": 1}, ["a", "b"], 1)


async def test_failure_is_recorded_and_retried(open_store: Open) -> None:
    """A raising function records FAILED with its error; the retried step calls it again."""
    manager = CheckpointManager(open_store())
    attempts: list[int] = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("provider down")
        return "ok"

    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(ConnectionError):
        async with wf.step(0, agent_id="a"):
            await wf.effect("call", flaky)
    [failed] = await manager.get_effects("wf", 0)
    assert failed.state is EffectState.FAILED
    assert failed.error == {"type": "ConnectionError", "message": "provider down"}
    async with wf.step(0, agent_id="a"):
        assert await wf.effect("call", flaky) == "ok"
    [done] = await manager.get_effects("wf", 0)
    assert (done.state, done.attempt, len(attempts)) == (EffectState.DONE, 2, 2)


async def test_changed_call_order_is_detected(open_store: Open) -> None:
    """A re-run that calls other functions in the derived keys' places raises."""
    manager = CheckpointManager(open_store())
    calls, other = Calls(), Calls()
    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(Interrupted):
        async with wf.step(0, agent_id="a"):
            await wf.effect(None, calls.send)
            raise Interrupted
    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(EffectOrderError):
        async with wf.step(0, agent_id="a"):
            await wf.effect(None, lambda: other.send())
    assert other.made == []


async def test_concurrent_effects_in_one_step(open_store: Open) -> None:
    """gather() and a TaskGroup of effects with distinct keys record and replay each."""
    manager = CheckpointManager(open_store())
    calls = Calls()

    async def step(wf: ResumableWorkflow) -> list[Any]:
        async with wf.step(0, agent_id="a"):
            derived = await asyncio.gather(*(wf.effect(None, calls.send, n) for n in range(5)))
            async with asyncio.TaskGroup() as tg:
                named = [tg.create_task(wf.effect(f"k{n}", calls.send, n)) for n in range(5)]
            raise Interrupted(list(derived) + [t.result() for t in named])

    with pytest.raises(Interrupted) as first:
        await step(ResumableWorkflow("wf", manager))
    with pytest.raises(Interrupted) as second:
        await step(ResumableWorkflow("wf", manager))
    assert first.value.args == second.value.args and len(calls.made) == 10
    keys = [r.key for r in await manager.get_effects("wf", 0)]
    assert keys == sorted([f"#{n}" for n in range(5)] + [f"k{n}" for n in range(5)])


async def test_cancellation_inside_the_call_leaves_it_in_doubt(open_store: Open) -> None:
    """A call cancelled midway may have happened: it is in doubt, not failed or re-run."""
    manager = CheckpointManager(open_store())
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.sleep(60)

    async def step() -> None:
        async with ResumableWorkflow("wf", manager) as wf, wf.step(0, agent_id="a"):
            await wf.effect("slow", slow)

    task = asyncio.create_task(step())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [record] = await manager.get_effects("wf", 0)
    assert record.in_doubt


async def test_results_are_the_stored_values(open_store: Open) -> None:
    """The first run returns what a replay returns: the result as the value stage keeps it."""
    manager = CheckpointManager(open_store())

    async def pair() -> tuple[int, dict[str, Any]]:
        return (1, {"big": 10**30, "f": 0.5})

    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(Interrupted):
        async with wf.step(0, agent_id="a"):
            first = await wf.effect("p", pair)
            raise Interrupted
    async with wf.step(0, agent_id="a"):
        again = await wf.effect("p", pair)
    assert first == again == (1, {"big": 10**30, "f": 0.5})
    assert type(first) is type(again) is tuple


async def test_unstorable_result_stays_in_doubt(open_store: Open) -> None:
    """A result the value stage refuses raises CheckpointSerializationError; the call ran."""
    manager = CheckpointManager(open_store())

    async def odd() -> object:
        return object()

    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(CheckpointSerializationError):
        async with wf.step(0, agent_id="a"):
            await wf.effect("odd", odd)
    [record] = await manager.get_effects("wf", 0)
    assert record.in_doubt


async def test_resolve_effect(open_store: Open) -> None:
    """resolve_effect records an in-doubt effect's result, or that it did not happen."""
    manager = CheckpointManager(open_store())
    await leave_in_doubt(manager, "a")
    await leave_in_doubt(manager, "b")
    await manager.resolve_effect("wf", 0, "a", happened=True, result="charged")
    await manager.resolve_effect("wf", 0, "b", happened=False)
    with pytest.raises(InvalidArgumentError):
        await manager.resolve_effect("wf", 0, "a", happened=True)
    calls = Calls()
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="a"):
            assert await wf.effect("a", calls.send) == "charged"
            assert await wf.effect("b", calls.send) == {"n": 1}
    assert await manager.list_in_doubt_workflows() == []


async def test_an_effect_record_under_another_name_is_corrupted(open_store: Open) -> None:
    """An effect record's bytes put under another workflow, step or key (a bad copy, a
    hand edit) are refused as corrupted, naming the workflow and step; the step never
    returns the other effect's result."""
    store = open_store()
    manager = CheckpointManager(store)
    calls = Calls()
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="a"):
            await wf.effect("pay", calls.send)
    [stored] = await store.load_effects("wf", 0)  # type: ignore[attr-defined]
    for workflow_id, step, key in (("other", 0, "pay"), ("wf", 1, "pay"), ("wf", 0, "refund")):
        await store.put_effect(workflow_id, step, key, stored.data, in_doubt=False)  # type: ignore[attr-defined]
        with pytest.raises(CheckpointCorruptedError) as caught:
            await manager.get_effects(workflow_id, step)
        assert (caught.value.workflow_id, caught.value.step) == (workflow_id, step)
    with pytest.raises(CheckpointCorruptedError):
        async with ResumableWorkflow("other", manager) as other:
            async with other.step(0, agent_id="a"):
                await other.effect("pay", calls.send)
    assert len(calls.made) == 1


async def test_misuse_is_refused(open_store: Open) -> None:
    """Outside a step, a '#' key, a key already running: InvalidArgumentError, no call."""
    manager = CheckpointManager(open_store())
    calls = Calls()
    wf = ResumableWorkflow("wf", manager)
    with pytest.raises(InvalidArgumentError):
        await wf.effect("k", calls.send)
    gate = asyncio.Event()

    async def held() -> None:
        await gate.wait()

    async with wf.step(0, agent_id="a"):
        with pytest.raises(InvalidArgumentError):
            await wf.effect("#1", calls.send)
        running = asyncio.create_task(wf.effect("same", held))
        await asyncio.sleep(0.05)
        with pytest.raises(InvalidArgumentError):
            await wf.effect("same", held)
        gate.set()
        await running
    assert calls.made == []


async def test_retention_keeps_effects_with_their_checkpoints(open_store: Open) -> None:
    """max_checkpoints removes a step's effects with its checkpoint, never a running step's."""
    manager = CheckpointManager(open_store(), max_checkpoints=1)
    calls = Calls()
    async with ResumableWorkflow("wf", manager) as wf:
        for step in range(3):
            async with wf.step(step, agent_id="a"):
                await wf.effect("k", calls.send)
    assert [len(await manager.get_effects("wf", s)) for s in range(3)] == [0, 0, 1]


def leased_store(kind: str, tmp_path: Path, pg_schema: str) -> CheckpointStorage:
    """A new store of ``kind`` among those with leases."""
    if kind == "memory":
        return InMemoryCheckpointStorage()
    if kind == "sqlite":
        return SQLiteCheckpointStorage(tmp_path / "fx.db")
    return PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=4)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_lost_lease_stops_before_the_call(kind: str, tmp_path: Path, pg_schema: str) -> None:
    """A runner whose lease was taken over gets LeaseLostError before its function runs."""
    async with CheckpointManager(leased_store(kind, tmp_path, pg_schema)) as manager:
        stale = await manager.acquire_lease("wf", "a", ttl=0.05)
        await asyncio.sleep(0.1)
        await manager.acquire_lease("wf", "b", ttl=30)
        calls = Calls()
        wf = ResumableWorkflow("wf", manager, lease=stale)
        with pytest.raises(LeaseLostError):
            async with wf.step(0, agent_id="a"):
                await wf.effect("mail", calls.send)
        assert calls.made == [] and await manager.get_effects("wf", 0) == []


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_stale_runner_settling_a_settled_effect_loses_its_lease(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """A runner taken over whose effect the new holder settled: LeaseLostError, not a misuse."""
    async with CheckpointManager(leased_store(kind, tmp_path, pg_schema)) as manager:
        await leave_in_doubt(manager, "mail")
        stale = await manager.acquire_lease("wf", "a", ttl=0.05)
        await asyncio.sleep(0.1)
        fresh = await manager.acquire_lease("wf", "b", ttl=30)
        await manager.resolve_effect("wf", 0, "mail", happened=True, result=1, lease=fresh)
        with pytest.raises(LeaseLostError):
            await manager.resolve_effect("wf", 0, "mail", happened=False, lease=stale)
        with pytest.raises(InvalidArgumentError):  # the holder itself: a plain misuse
            await manager.resolve_effect("wf", 0, "mail", happened=False, lease=fresh)
        [record] = await manager.get_effects("wf", 0)
        assert record.state is EffectState.DONE and record.result == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_stale_runner_resolving_an_effect_still_in_doubt_writes_nothing(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """A runner taken over while its effect is still in doubt: resolving it with the old
    lease raises LeaseLostError, and the effect stays in doubt for the new holder."""
    async with CheckpointManager(leased_store(kind, tmp_path, pg_schema)) as manager:
        await leave_in_doubt(manager, "mail")
        stale = await manager.acquire_lease("wf", "a", ttl=0.05)
        await asyncio.sleep(0.1)
        await manager.acquire_lease("wf", "b", ttl=30)
        with pytest.raises(LeaseLostError):
            await manager.resolve_effect("wf", 0, "mail", happened=True, result=1, lease=stale)
        [record] = await manager.get_effects("wf", 0)
        assert record.in_doubt and record.result is None
        assert await manager.list_in_doubt_workflows() == ["wf"]


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_call_returning_after_a_takeover_leaves_its_effect_in_doubt(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """A runner taken over while its effect's call runs: the outcome is not written
    (LeaseLostError), so the new holder finds the effect in doubt, not the stale result."""
    async with CheckpointManager(leased_store(kind, tmp_path, pg_schema)) as manager:
        stale = await manager.acquire_lease("wf", "a", ttl=0.05)

        async def call_across_a_takeover() -> str:
            await asyncio.sleep(0.1)
            await manager.acquire_lease("wf", "b", ttl=30)
            return "stale result"

        with pytest.raises(LeaseLostError):
            async with ResumableWorkflow("wf", manager, lease=stale, lease_ttl=600) as wf:
                async with wf.step(0, agent_id="a"):
                    await wf.effect("mail", call_across_a_takeover)
        [record] = await manager.get_effects("wf", 0)
        assert record.in_doubt and record.result is None


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite", "postgres"])
async def test_oversized_effect_records_are_refused(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """A record over max_record_bytes: InvalidArgumentError, and that record is not stored."""
    limit = 4096
    if kind == "memory":
        store: Any = InMemoryCheckpointStorage(max_record_bytes=limit)
    elif kind == "file":
        store = FileCheckpointStorage(tmp_path / "store", max_record_bytes=limit)
    elif kind == "sqlite":
        store = SQLiteCheckpointStorage(tmp_path / "fx.db", max_record_bytes=limit)
    else:
        store = PostgresCheckpointStorage(DSN, schema=pg_schema, max_record_bytes=limit)
    async with store:
        with pytest.raises(InvalidArgumentError):
            await store.put_effect("wf", 0, "k", b"x" * (limit + 1), in_doubt=True)
        assert await store.load_effects("wf", 0) == []
        async with ResumableWorkflow("wf", CheckpointManager(store)) as wf:
            with pytest.raises(InvalidArgumentError):
                async with wf.step(0, agent_id="a"):
                    await wf.effect("big", _big_result)
        # The intent was stored; its oversized result was not: the call is in doubt.
        assert [e.in_doubt for e in await store.load_effects("wf", 0)] == [True]


async def _big_result() -> str:
    return "x" * 8192


async def test_typed_results_come_back_as_themselves(open_store: Open) -> None:
    """A result of a standard type (typed state) is returned, and replayed, with its type."""
    when = datetime(2026, 12, 1, 9, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    made: list[int] = []

    async def fetch() -> dict[str, Any]:
        made.append(1)
        return {"at": when, "ids": (1, 2), "raw": b"\x00\xff"}

    first = CheckpointManager(open_store())
    wf = ResumableWorkflow("wf", first)
    with pytest.raises(Interrupted):
        async with wf.step(0, agent_id="a"):
            assert await wf.effect("fetch", fetch) == {
                "at": when,
                "ids": (1, 2),
                "raw": b"\x00\xff",
            }
            raise Interrupted
    async with ResumableWorkflow("wf", CheckpointManager(open_store())) as again:
        async with again.step(0, agent_id="a"):
            replayed = await again.effect("fetch", fetch)
    assert replayed == {"at": when, "ids": (1, 2), "raw": b"\x00\xff"} and len(made) == 1
    assert type(replayed["at"]) is datetime and type(replayed["ids"]) is tuple


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_pool_retrying_an_effect_in_doubt_gets_it_back_once_settled(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """A pool's retry policy spends its attempts on the doubt; settled, the workflow comes
    back with its retry budget whole, and a runner finishes it."""
    storage: CheckpointStorage = InMemoryCheckpointStorage()
    if kind == "sqlite":
        storage = SQLiteCheckpointStorage(tmp_path / "pool.db")
    elif kind == "postgres":
        storage = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=4)
    policy = RetryPolicy(max_attempts=2, backoff=0)
    calls = Calls()
    async with CheckpointManager(storage) as manager:
        await manager.register_workflow("wf")
        await leave_in_doubt(manager, "pay")
        for _ in range(policy.max_attempts):
            lease = await manager.claim_workflow("runner", retry=policy)
            assert lease is not None
            with pytest.raises(EffectInDoubtError):
                async with ResumableWorkflow("wf", manager, lease=lease) as wf:
                    async with wf.step(0, agent_id="a"):
                        await wf.effect("pay", calls.send)
        record = await manager.get_workflow("wf")
        assert record is not None and (record.status, record.attempts) == ("failed", 2)
        assert await manager.claim_workflow("runner", retry=policy) is None
        await manager.resolve_effect("wf", 0, "pay", happened=False)
        record = await manager.get_workflow("wf")
        assert record is not None and (record.status, record.attempts) == ("unfinished", 0)
        lease = await manager.claim_workflow("runner", retry=policy)
        assert lease is not None
        async with ResumableWorkflow("wf", manager, lease=lease) as wf:
            async with wf.step(0, agent_id="a"):
                assert await wf.effect("pay", calls.send) == {"n": 1}  # called: it did not happen
        assert calls.made == [()] and (await manager.get_workflow("wf")).status == "finished"  # type: ignore[union-attr]
