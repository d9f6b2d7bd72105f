"""storage.turns: a batch's rows handled in stretches, with the loop or the GIL let go between."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint.storage import turns
from tests.backend_support import make_storage
from tests.pg_support import pg_schema

__all__ = ["pg_schema"]


async def test_in_turns_maps_every_item_in_order_and_lets_other_tasks_run() -> None:
    ran: list[int] = []
    items = list(range(3 * turns.ROWS + 5))

    async def other() -> None:
        while True:
            ran.append(len(ran))
            await asyncio.sleep(0)

    task = asyncio.ensure_future(other())
    await asyncio.sleep(0)  # started
    before = len(ran)
    try:
        assert await turns.in_turns(lambda n: n * 3, items) == [n * 3 for n in items]
        # One break between each stretch of ROWS: the other task ran at least 3 times.
        assert len(ran) - before >= 3
    finally:
        task.cancel()
    assert await turns.in_turns(str, []) == []


def test_gil_breaks_yields_every_row_and_sleeps_between_stretches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    rows = list(range(2 * turns.ROWS + 1))
    original = time.sleep

    def counting(seconds: float) -> None:
        if threading.current_thread() is worker:
            slept.append(seconds)
        original(seconds)

    got: list[int] = []
    worker = threading.Thread(target=lambda: got.extend(turns.gil_breaks(rows)))
    monkeypatch.setattr(turns.time, "sleep", counting)
    worker.start()
    worker.join()
    assert got == rows
    # A rest long enough for a thread waiting for the GIL to wake and take it.
    assert slept == [turns.REST_SECONDS] * 2
    assert turns.REST_SECONDS > 0
    # With no save being written (busy() false) the loop runs on without a rest.
    slept.clear()
    got.clear()
    worker = threading.Thread(target=lambda: got.extend(turns.gil_breaks(rows, lambda: False)))
    worker.start()
    worker.join()
    assert got == rows
    assert slept == []


def _fake_clock_and_sleep(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], list[float]]:
    """The sweep's clock (``clock[0]``, moved by hand) and its sleeps, recorded, not slept."""
    from aiocheckpoint import _sweep_batches

    clock = [100.0]
    slept: list[float] = []
    original = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await original(0)

    monkeypatch.setattr(_sweep_batches.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(_sweep_batches.asyncio, "sleep", sleep)
    return clock, slept


async def test_a_sweeps_turns_rest_after_each_stretch_of_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep's turns on the loop sleep ``REST_SECONDS`` (the loop idle, the GIL free)
    once ``WORK_SECONDS`` passed since the last rest, and only then; only for a store whose
    writes run in a thread (SQLite's ``writes_in_threads``)."""
    from aiocheckpoint import SQLiteCheckpointStorage
    from aiocheckpoint.storage.postgres import PostgresCheckpointStorage

    assert SQLiteCheckpointStorage.writes_in_threads
    assert not hasattr(PostgresCheckpointStorage, "writes_in_threads")
    from aiocheckpoint import _sweep_batches

    clock, slept = _fake_clock_and_sleep(monkeypatch)
    # The pacer's budget is not what is tested: 1 s.
    sweep_turns, unrested = _sweep_batches.Turns(1.0, lambda: True), _sweep_batches.Turns(1.0, None)
    idle = _sweep_batches.Turns(1.0, lambda: False)  # no save being written lately
    await sweep_turns.turn()
    clock[0] += _sweep_batches.WORK_SECONDS / 2
    await sweep_turns.turn()
    assert slept == []
    clock[0] += _sweep_batches.WORK_SECONDS
    await sweep_turns.turn()
    await sweep_turns.turn()
    await unrested.turn()  # a store whose writes run on the loop: no rests
    await idle.turn()
    clock[0] += _sweep_batches.WORK_SECONDS
    await idle.turn()
    assert slept == [_sweep_batches.REST_SECONDS]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_store_counts_as_saving_only_lately_after_a_save(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """The sweep's rests follow the store's saves: none before the first save, some right
    after one, none once the store has been quiet for a while."""
    async with make_storage(kind, tmp_path, pg_schema) as storage:
        assert not storage.saving_lately()
        await storage.save("wf", 0, b"{}")
        assert storage.saving_lately()
        await asyncio.sleep(turns.SAVING_LATELY * 1.5)
        assert not storage.saving_lately()


async def test_a_sweeps_write_first_rests_as_long_as_the_last_took_while_saves_are_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While ``saving()`` is true each write after the first waits the last write's time
    (times ``WRITE_REST_SHARE``, ``MAX_WRITE_REST`` at most) before it starts; with no
    saves, or no ``saving`` (a store that cannot tell), the writes follow each other at
    once."""
    from aiocheckpoint import _sweep_batches

    clock, slept = _fake_clock_and_sleep(monkeypatch)

    async def write(seconds: float) -> str:
        clock[0] += seconds
        return "done"

    saving = [True]
    sizer = _sweep_batches.BatchSizer(10, lambda: saving[0])
    assert await sizer.timed(write(0.04)) == "done"
    assert slept == []  # nothing written yet: nothing to rest for
    await sizer.timed(write(0.03))
    assert slept == [pytest.approx(0.04 * _sweep_batches.WRITE_REST_SHARE)]
    saving[0] = False
    await sizer.timed(write(0.05))
    saving[0] = True
    await sizer.timed(write(0.01))
    assert slept[1:] == [pytest.approx(0.05 * _sweep_batches.WRITE_REST_SHARE)]
    await sizer.timed(write(60.0))  # a write that waited on a lock, say
    await sizer.timed(write(0.01))
    assert slept[3:] == [_sweep_batches.MAX_WRITE_REST]
    unaware = _sweep_batches.BatchSizer(10)
    await unaware.timed(write(0.04))
    await unaware.timed(write(0.04))
    assert len(slept) == 4
    assert _sweep_batches.WRITE_REST_SHARE > 0


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_sweep_beside_saves_rests_between_its_writes_and_thins_all_the_same(
    kind: str, tmp_path: Path, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep of several batches while the store says it is saving starts each write at
    least the last one's time (times ``WRITE_REST_SHARE``) after that one ended, and
    deletes what the policy says."""
    from aiocheckpoint import CheckpointManager, RetentionPolicy, _sweep_batches

    async with make_storage(kind, tmp_path, pg_schema) as storage:
        manager = CheckpointManager(storage)
        for n in range(12):
            for step in range(3):
                await manager.create_checkpoint(f"wf-{n}", step, "a", "running", {"n": n})
        writes: list[tuple[float, float]] = []
        thin_many = storage.thin_many

        async def timed_thin_many(cuts: Any) -> Any:
            started = time.monotonic()
            try:
                return await thin_many(cuts)
            finally:
                writes.append((started, time.monotonic()))

        monkeypatch.setattr(storage, "thin_many", timed_thin_many)
        monkeypatch.setattr(storage, "saving_lately", lambda: True)
        report = await manager.sweep(policy=RetentionPolicy(keep_last=1, batch_size=2))
    assert report.checkpoints_deleted == 24
    assert len(writes) >= 3
    share, most = _sweep_batches.WRITE_REST_SHARE, _sweep_batches.MAX_WRITE_REST
    for (started, ended), (next_started, _) in itertools.pairwise(writes):
        assert next_started - ended >= min((ended - started) * share, most)


def test_gil_breaks_rest_on_while_saves_are_in_flight_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``held()`` true: the stretch's rest goes on in steps of REST_SECONDS until it turns
    false; a ``held()`` that never does keeps it resting no longer than HOLD_SECONDS."""
    clock = [50.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(turns.time, "sleep", sleep)
    monkeypatch.setattr(turns.time, "monotonic", lambda: clock[0])
    answers = iter([True, True, False])
    rows = list(range(turns.ROWS))
    assert list(turns.gil_breaks(rows, lambda: True, lambda: next(answers))) == rows
    assert slept == [turns.REST_SECONDS] * 3  # the stretch's rest, then two while held
    slept.clear()
    assert list(turns.gil_breaks(rows, lambda: True, lambda: True)) == rows
    assert turns.HOLD_SECONDS <= sum(slept) <= turns.HOLD_SECONDS + 2 * turns.REST_SECONDS
    slept.clear()
    assert list(turns.gil_breaks(rows, lambda: False, lambda: True)) == rows
    assert slept == []  # no save lately: no rest, held or not


async def test_a_sweeps_turn_waits_for_the_saves_in_flight_first() -> None:
    """With ``settled`` (a store's ``saves_written``), every turn awaits it first, with the
    bound HOLD_SECONDS."""
    from aiocheckpoint import _sweep_batches

    asked: list[float] = []

    async def settled(at_most: float) -> None:
        asked.append(at_most)

    sweep_turns = _sweep_batches.Turns(1.0, None, settled)
    await sweep_turns.turn()
    await sweep_turns.turn()
    assert asked == [_sweep_batches.HOLD_SECONDS] * 2


async def test_a_sqlite_store_says_when_saves_are_in_flight(tmp_path: Path) -> None:
    """``saves_in_flight`` from the save's queueing to its commit, and not for a sweep's
    slice; ``saves_written`` returns once they are written, or after its bound while one
    still is, and at once when none is."""
    from aiocheckpoint import SQLiteCheckpointStorage
    from aiocheckpoint.storage.sqlite.writer import RecordOp

    async with SQLiteCheckpointStorage(tmp_path / "s.db") as storage:
        await storage.save("wf", 0, b"{}")  # opened
        assert not storage.saves_in_flight()
        await storage.saves_written(60.0)  # none in flight: at once

        saving = asyncio.ensure_future(storage.save("wf", 1, b"{}"))
        await asyncio.sleep(0)
        assert storage.saves_in_flight()
        await storage.saves_written(60.0)
        assert saving.done() and not storage.saves_in_flight()

        release = threading.Event()
        slow = RecordOp("slow", lambda conn, now: release.wait(60))
        blocked = asyncio.ensure_future(storage._submit(slow, 0))
        await asyncio.sleep(0)
        assert storage.saves_in_flight()
        await storage.saves_written(0.01)  # the bound: the slow write still runs
        assert not blocked.done() and storage.saves_in_flight()
        release.set()
        await blocked
        assert not storage.saves_in_flight()

        background = RecordOp("slice", lambda conn, now: release.wait(60), background=True)
        await storage._submit(background, 0)
        assert not storage.saves_in_flight()


async def test_a_cancelled_wait_for_saves_leaves_the_store_working(tmp_path: Path) -> None:
    from aiocheckpoint import SQLiteCheckpointStorage
    from aiocheckpoint.storage.sqlite.writer import RecordOp

    async with SQLiteCheckpointStorage(tmp_path / "s.db") as storage:
        await storage.save("wf", 0, b"{}")
        release = threading.Event()
        blocked = asyncio.ensure_future(
            storage._submit(RecordOp("slow", lambda conn, now: release.wait(60)), 0)
        )
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(storage.saves_written(60.0))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        await blocked
        await storage.save("wf", 1, b"{}")
        assert not storage.saves_in_flight()
        assert [c.step for c in await storage.scan("wf")] == [0, 1]
