"""Cancellation storms: cancelled writers leave each checkpoint wholly present or wholly absent."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from aiocheckpoint import (
    CheckpointManager,
    CheckpointStorage,
    ResumableWorkflow,
)

from ._support import TALLY, decode_stored, dump_store, scaled
from .conftest import Backend

TASKS = scaled(300, 3000)
WORKFLOWS = 40
MODES = ("none", "scope_cancel", "cancel_first", "fail_after", "move_on_after", "task_cancel")


@dataclass
class _Write:
    wf: str
    step: int
    new: dict[str, Any]
    old: dict[str, Any] | None
    mode: str
    acked: bool = False


def _plan(rng: random.Random) -> list[_Write]:
    writes = []
    for i in range(TASKS):
        size = rng.choice([16, 256, 4096, 65536])
        new = {"task": i, "blob": "n" * size, "list": list(range(i % 7))}
        old = {"task": i, "old": True} if i % 3 == 0 else None
        writes.append(_Write(f"storm/{i % WORKFLOWS}", i // WORKFLOWS, new, old, rng.choice(MODES)))
    return writes


async def _write(manager: CheckpointManager, w: _Write, rng: random.Random) -> None:
    async def call() -> None:
        for _ in range(rng.randrange(3)):
            await anyio.lowlevel.checkpoint()
        await manager.create_checkpoint(w.wf, w.step, "agent", "completed", w.new)
        w.acked = True

    delay = rng.uniform(0, 0.004)
    if w.mode in ("none", "task_cancel"):
        await call()
    elif w.mode == "scope_cancel":
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_later() -> None:
                    await anyio.sleep(delay)
                    scope.cancel()

                tg.start_soon(cancel_later)
                await call()
                tg.cancel_scope.cancel()
    elif w.mode == "cancel_first":
        with anyio.CancelScope() as scope:
            scope.cancel()
            await call()
    elif w.mode == "fail_after":
        try:
            with anyio.fail_after(delay):
                await call()
        except TimeoutError:
            pass
    else:
        with anyio.move_on_after(delay):
            await call()


async def _storm(manager: CheckpointManager, writes: list[_Write], seed: int) -> None:
    rng = random.Random(seed)
    tasks = [asyncio.ensure_future(_write(manager, w, random.Random(rng.random()))) for w in writes]
    await asyncio.sleep(0)
    for task, w in zip(tasks, writes, strict=True):
        if w.mode == "task_cancel" and rng.random() < 0.8:
            task.get_loop().call_later(rng.uniform(0, 0.004), task.cancel)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if not isinstance(result, asyncio.CancelledError):
            assert result is None, result


async def _verify(storage: CheckpointStorage, writes: list[_Write]) -> dict[str, int]:
    outcome = {"acked": 0, "landed_unacked": 0, "absent": 0, "old_kept": 0}
    for w in writes:
        stored = await storage.load(w.wf, w.step)
        data = None
        if stored is not None:
            data = (await decode_stored(storage, stored.data, w.wf, w.step)).state_snapshot.data
        if w.acked:
            assert data == w.new, (w.wf, w.step)
            outcome["acked"] += 1
        elif data == w.new:
            outcome["landed_unacked"] += 1
        else:
            assert data == w.old, (w.wf, w.step, "neither the old nor the new record")
            outcome["old_kept" if w.old else "absent"] += 1
    for (wf, step), data in (await dump_store(storage)).items():
        await decode_stored(storage, data, wf, step)
    return outcome


@pytest.mark.parametrize("seed", [1, 2])
async def test_cancellation_storm_leaves_checkpoints_whole_or_absent(
    backend: Backend, tmp_path: Path, seed: int
) -> None:
    """Hundreds of writers, many cancelled at random points, leave every checkpoint whole (new or
    old) or absent, and every acknowledged one present.
    """
    rng = random.Random(seed)
    writes = _plan(rng)
    storage = backend.open(tmp_path)
    manager = CheckpointManager(storage)
    for w in writes:
        if w.old is not None:
            await manager.create_checkpoint(w.wf, w.step, "agent", "completed", w.old)
    await _storm(manager, writes, seed)
    outcome = await _verify(storage, writes)
    TALLY["storm writers"] += len(writes)
    TALLY["storm writers cancelled"] += len(writes) - outcome["acked"]
    assert outcome["acked"] > 0
    assert outcome["acked"] < len(writes)  # the storm really cancelled something
    # The manager stays usable after the storm.
    await manager.create_checkpoint("after", 0, "agent", "completed", {"ok": True})
    assert (await manager.get_checkpoint("after", 0)).state_snapshot.data == {"ok": True}
    if backend.durable:
        before = await dump_store(storage)
        await storage.close()
        async with backend.open(tmp_path) as again:
            assert await dump_store(again) == before
            await _verify(again, writes)
        assert backend.temp_files(tmp_path) == []
    await storage.close()


class _Boom(Exception):
    pass


async def _cancel_inside_step(kind: str, wf: ResumableWorkflow) -> None:
    """Run step 1 of ``wf`` and cancel it in the middle of its block, the way ``kind`` says."""
    entered = anyio.Event()

    async def body() -> None:
        async with wf.step(1, agent_id="agent"):
            wf.state.set("n", 2)
            entered.set()
            await anyio.sleep(60)

    if kind == "move_on_after":
        with anyio.move_on_after(0.01):
            await body()
    elif kind == "fail_after":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.01):
                await body()
    elif kind == "scope_cancel":
        async with anyio.create_task_group() as tg:
            tg.start_soon(body)
            await entered.wait()
            tg.cancel_scope.cancel()
    else:
        task = asyncio.ensure_future(body())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("kind", ["move_on_after", "fail_after", "scope_cancel", "task_cancel"])
async def test_a_cancelled_step_records_nothing_and_keeps_the_resume_point(
    manager: CheckpointManager, kind: str
) -> None:
    """A step cancelled mid-block writes no checkpoint; the previous one stays the resume point."""
    wf = ResumableWorkflow("steps", manager, initial_state={"n": 0})
    async with wf.step(0, agent_id="agent"):
        wf.state.set("n", 1)
    await _cancel_inside_step(kind, wf)
    assert not await manager.has_checkpoint("steps", 1)
    assert [c.step for c in await manager.list_checkpoints("steps")] == [0]
    again = ResumableWorkflow("steps", manager)
    assert await again.try_resume() == 1
    assert again.state.to_dict() == {"n": 1}


async def test_a_failing_step_still_records_failed_after_a_cancelled_one(
    manager: CheckpointManager,
) -> None:
    """After a cancelled step, a step that raises still records FAILED and the error propagates."""
    wf = ResumableWorkflow("steps", manager)
    await _cancel_inside_step("move_on_after", wf)
    with pytest.raises(_Boom):
        async with wf.step(1, agent_id="agent"):
            raise _Boom("no")
    failed = await manager.get_checkpoint("steps", 1)
    assert failed.status == "failed"
    assert failed.metadata["error"] == {"type": "_Boom", "message": "no"}


async def test_step_storm_leaves_a_prefix_of_completed_steps(
    backend: Backend, tmp_path: Path
) -> None:
    """Workflows running steps under random tiny timeouts leave exactly steps 0..m, each holding
    the state it completed with, and resume at m+1.
    """
    rng = random.Random(7)
    storage = backend.open(tmp_path)
    manager = CheckpointManager(storage)
    count = scaled(100, 1000)

    async def run(i: int) -> None:
        wf = ResumableWorkflow(f"run/{i}", manager, initial_state={"n": 0})
        with anyio.move_on_after(rng.uniform(0, 0.02)):
            for step in range(5):
                async with wf.step(step, agent_id="agent"):
                    wf.state.set("n", step + 1)
                    await anyio.sleep(rng.uniform(0, 0.002))

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(run, i)
    for i in range(count):
        checkpoints = await manager.list_checkpoints(f"run/{i}")
        steps = [c.step for c in checkpoints]
        assert steps == list(range(len(steps)))
        assert [c.state_snapshot.data for c in checkpoints] == [{"n": s + 1} for s in steps]
        resumed = ResumableWorkflow(f"run/{i}", manager)
        assert await resumed.try_resume() == len(steps)
    await storage.close()
