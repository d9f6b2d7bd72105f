"""The SQLite group commit in two halves (storage/sqlite/overlap.py): when it splits, that a
half's callers wake during the other half's COMMIT, and only once their own is durable."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite import writer as sqlwriter
from aiocheckpoint.storage.sqlite.overlap import MIN_HALF, PROBE_ROUNDS, SAMPLES, Overlap


class _AlwaysSplit(Overlap):
    """Serves in halves whatever the rounds cost (the tests' rounds are too short to decide)."""

    def __init__(self) -> None:
        super().__init__()
        for _ in range(SAMPLES + 1):  # whole rounds only: the halves are tried next
            super().round(False, 1.0, 100)
        assert self.splitting

    def round(self, split: bool, seconds: float, writes: int) -> None:
        pass


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteCheckpointStorage]:
    storage = SQLiteCheckpointStorage(tmp_path / "store.db", busy_timeout=30.0)
    await storage.open()
    yield storage
    await storage.close()


def _rounds(overlap: Overlap, split: bool, seconds: float, writes: int, count: int) -> None:
    for _ in range(count):
        overlap.round(split, seconds, writes)


def test_it_tries_halves_after_whole_rounds_and_keeps_them_when_cheaper() -> None:
    overlap = Overlap()
    assert not overlap.splitting and not overlap.split(100) and not overlap.hold(50)
    _rounds(overlap, False, 0.004, 100, SAMPLES)  # 40 us a write; the first one is skipped
    assert not overlap.splitting
    overlap.round(False, 0.004, 100)
    assert overlap.splitting  # halves never measured: tried
    assert overlap.split(2 * MIN_HALF) and not overlap.split(2 * MIN_HALF - 1)
    assert overlap.hold(MIN_HALF) and not overlap.hold(MIN_HALF - 1)
    _rounds(overlap, True, 0.0015, 50, SAMPLES + 1)  # 30 us a write
    assert overlap.splitting


def test_it_goes_back_to_whole_rounds_when_halves_cost_more() -> None:
    overlap = Overlap()
    _rounds(overlap, False, 0.004, 100, SAMPLES + 1)
    _rounds(overlap, True, 0.0025, 50, SAMPLES + 1)  # 50 us a write against 40
    assert not overlap.splitting and not overlap.hold(50)


def test_the_other_way_is_measured_again_after_probe_rounds() -> None:
    overlap = Overlap()
    _rounds(overlap, False, 0.004, 100, SAMPLES + 1)
    _rounds(overlap, True, 0.0015, 50, SAMPLES + 1)
    rounds = 0
    while overlap.splitting:
        overlap.round(True, 0.0015, 50)
        rounds += 1
    assert PROBE_ROUNDS - SAMPLES <= rounds <= PROBE_ROUNDS + 1


def _rounds_until_switch(overlap: Overlap, seconds: float, writes: int) -> int:
    way, rounds = overlap.splitting, 0
    while overlap.splitting is way:
        overlap.round(way, seconds, writes)
        rounds += 1
    return rounds


def test_a_way_that_loses_its_try_again_waits_twice_as_long() -> None:
    """On a slow disk halves lose every try, the first one too: the next tries come after
    128, 256, 512... rounds in the better way (64 while halves keep winning)."""
    overlap = Overlap()
    _rounds(overlap, False, 0.004, 100, SAMPLES + 1)  # whole: 40 us a write
    waits = []
    for _ in range(3):
        assert _rounds_until_switch(overlap, 0.003, 50) == SAMPLES + 1  # halves: 60 us
        waits.append(_rounds_until_switch(overlap, 0.004, 100))
    assert waits == [2 * PROBE_ROUNDS + 1, 4 * PROBE_ROUNDS + 1, 8 * PROBE_ROUNDS + 1]


def test_small_batches_and_rounds_of_the_other_way_are_not_counted() -> None:
    overlap = Overlap()
    _rounds(overlap, False, 0.004, MIN_HALF - 1, 10 * SAMPLES)  # C=10: nothing to split
    _rounds(overlap, True, 0.004, 100, 10 * SAMPLES)  # not the way in use
    assert not overlap.splitting
    _rounds(overlap, False, 0.004, 100, SAMPLES + 1)
    assert overlap.splitting


async def test_a_half_wakes_during_the_other_halfs_commit_and_only_once_durable(
    store: SQLiteCheckpointStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 callers of 4 saves each, split in halves: each caller's save is readable from
    another connection as soon as its await returns, and the callers of one half are woken
    while the other half's COMMIT runs (without the overlap, no caller ever wakes during a
    COMMIT: the loop takes the next batch only after waking them)."""
    store._overlap = _AlwaysSplit()
    commits: list[tuple[float, float]] = []
    commit = sqlwriter.Writer._commit

    def slow_commit(self: sqlwriter.Writer, conn: sqlite3.Connection) -> None:
        start = time.perf_counter()
        time.sleep(0.03)  # an fsync long enough for the woken half to run in it
        commit(self, conn)
        commits.append((start, time.perf_counter()))

    monkeypatch.setattr(sqlwriter.Writer, "_commit", slow_commit)
    reader = sqlite3.connect(tmp_path / "store.db", check_same_thread=False)
    woken: list[float] = []
    missing: list[tuple[str, int]] = []

    async def work(n: int) -> None:
        for step in range(4):
            await store.save(f"wf-{n}", step, b"%d" % step)
            woken.append(time.perf_counter())
            found = reader.execute(
                "SELECT 1 FROM checkpoints WHERE workflow_id = ? AND step = ?", (f"wf-{n}", step)
            ).fetchall()
            if not found:
                missing.append((f"wf-{n}", step))
            await asyncio.sleep(0)

    try:
        await asyncio.gather(*(work(n) for n in range(100)))
    finally:
        reader.close()
    assert missing == []
    during = [t for t in woken if any(start < t < end for start, end in commits)]
    assert len(during) >= 100  # about half of the 400 wakes; none without the overlap
    assert len(commits) <= 10  # halves of ~50: 8 commits for 400 saves, not one each


async def test_held_callers_get_their_outcome_when_the_next_batch_fails(
    store: SQLiteCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose run fails before its COMMIT (a bug: run_batch raises) fails its own
    callers only; the held half before it, committed already, still returns normally."""
    store._overlap = _AlwaysSplit()
    run_batch = sqlwriter.Writer.run_batch
    calls = 0

    def failing_second(self: sqlwriter.Writer, ops: Sequence[Any], *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("boom")
        return run_batch(self, ops, *args)

    monkeypatch.setattr(sqlwriter.Writer, "run_batch", failing_second)
    results = await asyncio.gather(
        *(store.save(f"wf-{n}", 0, b"x") for n in range(100)), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, RuntimeError)]
    assert len(failed) == 50 and results.count(None) == 50
    assert all(r is None for r in results[:50])  # the first half, held while the second ran
    assert [c.step for c in await store.scan("wf-0")] == [0]
    assert await store.scan("wf-99") == []


async def test_a_whole_round_of_few_callers_is_never_split(
    store: SQLiteCheckpointStorage,
) -> None:
    """Fewer queued writes than two halves' minimum: one commit per round, as before."""
    store._overlap = _AlwaysSplit()
    before = store._writer.commits

    async def work(n: int) -> None:
        for step in range(3):
            await store.save(f"wf-{n}", step, b"x")
            await asyncio.sleep(0)

    await asyncio.gather(*(work(n) for n in range(2 * MIN_HALF - 1)))
    assert store._writer.commits - before == 3


def test_the_writer_thread_calls_before_commit_once_before_the_commit(
    tmp_path: Path,
) -> None:
    from aiocheckpoint.storage.sqlite.connections import BusyRetry

    writer = sqlwriter.Writer(tmp_path / "w.db", 5.0, BusyRetry(3))
    writer.open()
    seen: list[tuple[int, int]] = []
    try:
        op = sqlwriter.SaveOp("wf", 0, b"x", None)
        outcomes = writer.run_batch(
            [op], lambda: seen.append((threading.get_ident(), writer.commits))
        )
    finally:
        writer.close()
    assert outcomes == [None]
    assert seen == [(threading.get_ident(), 0)]  # called before the batch counted as committed
