"""A sweep leaves writers room: its SQLite deletes commit in short slices that queued writes go
before, and its pages stop where their records no longer fit one read."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, RetentionPolicy, SQLiteCheckpointStorage
from aiocheckpoint import retention as retention_module
from aiocheckpoint.storage.base import Cut
from aiocheckpoint.storage.sqlite import groupcommit as groupcommit_module
from aiocheckpoint.storage.sqlite import writer as writer_module
from aiocheckpoint.storage.sqlite.walcheckpoint import (
    BACKGROUND_WAL_LIMIT_PAGES,
    WAL_LIMIT_PAGES,
    CheckpointResult,
)
from aiocheckpoint.storage.sqlite.writer import RecordOp


async def _fill(manager: CheckpointManager, workflows: int, steps: int) -> None:
    for n in range(workflows):
        for step in range(steps):
            await manager.create_checkpoint(f"wf-{n:03}", step, "a", "running", {"n": n})


async def test_a_background_write_always_commits_alone(tmp_path: Path) -> None:
    """Writes queued before a background slice commit without it, and so do writes queued
    after it: they stay queued while it runs, so the slice sees them waiting and ends
    early (in its batch they would wait for its whole time)."""
    storage = SQLiteCheckpointStorage(tmp_path / "s.db")
    await storage.save("warm", 0, b"x")  # opened: the three writes below queue together
    seen: dict[str, int] = {}

    def noting(name: str, *, background: bool = False) -> RecordOp:
        def fn(_conn: sqlite3.Connection, _now: float) -> None:
            seen[name] = storage._writer.commits

        return RecordOp(name, fn, background=background)

    try:
        await asyncio.gather(
            storage._submit(noting("before"), 0),
            storage._submit(noting("slice", background=True), 0),
            storage._submit(noting("after"), 0),
        )
    finally:
        await storage.close()
    assert seen["slice"] == seen["before"] + 1
    assert seen["after"] == seen["slice"] + 1


async def test_a_sweeps_thinning_commits_slice_by_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no time for more, each slice takes one workflow's cut and commits it: the result
    is the same as one transaction's, a step already gone is not reported."""
    storage = SQLiteCheckpointStorage(tmp_path / "s.db")
    try:
        for n in range(4):
            for step in range(3):
                await storage.save(f"wf-{n}", step, b"record")
        await storage.delete("wf-2", 0)
        monkeypatch.setattr(writer_module, "LONG_SLICE_SECONDS", 0.0)
        commits = storage._writer.commits
        cuts = [Cut(f"wf-{n}", (0, 1), 2) for n in range(4)]
        deleted, dropped = await storage.thin_many(cuts)
        assert storage._writer.commits - commits == 4
        assert sorted(deleted) == [
            (f"wf-{n}", s) for n in range(4) for s in (0, 1) if (n, s) != (2, 0)
        ]
        assert dropped == 0
        assert [c.step for c in await storage.scan("wf-1")] == [2]
    finally:
        await storage.close()


async def test_a_sweeps_page_stops_where_its_records_no_longer_fit_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page holding more histories to read than one read's record budget ends before the
    first that did not fit, which starts the next page: no workflow is thinned by itself."""
    monkeypatch.setattr(retention_module, "_MAX_RECORDS", 25)
    storage = SQLiteCheckpointStorage(tmp_path / "s.db")
    policy = RetentionPolicy(keep_last=3)
    async with CheckpointManager(storage, retention=policy) as manager:
        await _fill(manager, 12, 10)
        scans = 0
        scan = storage.scan

        async def counted(*args: object, **kwargs: object) -> object:
            nonlocal scans
            scans += 1
            return await scan(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(storage, "scan", counted)
        report = await manager.sweep()
        assert report.checkpoints_deleted == 12 * 7
        assert report.workflows_thinned == 12
        assert scans == 0
        assert [c.step for c in await storage.scan("wf-011")] == [7, 8, 9]


async def test_a_slice_alone_commits_unsynced_and_every_other_batch_synced(
    tmp_path: Path,
) -> None:
    """A background slice runs with synchronous=NORMAL (the next write's fsync covers it),
    also with a write queued behind it; the batches after it run FULL."""
    storage = SQLiteCheckpointStorage(tmp_path / "s.db")
    await storage.save("warm", 0, b"x")
    levels: dict[str, int] = {}

    def noting(name: str, *, background: bool = False) -> RecordOp:
        def fn(conn: sqlite3.Connection, _now: float) -> None:
            levels[name] = conn.execute("PRAGMA synchronous").fetchone()[0]

        return RecordOp(name, fn, background=background)

    try:
        await storage._submit(noting("slice", background=True), 0)
        await storage._submit(noting("after"), 0)
        # A slice taken with a write queued behind it: two batches, the second synced.
        await asyncio.gather(
            storage._submit(noting("slice-with-save", background=True), 0),
            storage._submit(noting("save"), 0),
        )
    finally:
        await storage.close()
    assert levels == {"slice": 1, "after": 2, "slice-with-save": 1, "save": 2}


def test_a_slice_yields_to_a_waiting_write_after_its_floor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a write waiting, a slice stops once it has spent ``MIN_SLICE_SECONDS`` (each item
    here takes 0.4 ms of a fake clock: 3 items); with none waiting, it takes all of them
    (well within its 50 ms)."""
    items = list(range(10))
    clock = [0.0]

    def fn(_conn: sqlite3.Connection, _now: float, item: int) -> int:
        clock[0] += 0.0004
        return item * 2

    monkeypatch.setattr(writer_module.time, "monotonic", lambda: clock[0])
    conn = sqlite3.connect(":memory:")
    try:
        assert writer_module.MIN_SLICE_SECONDS == 0.001
        assert writer_module.slice_of(items, 3, fn, lambda: True)(conn, 0.0) == [6, 8, 10]
        assert writer_module.slice_of(items, 3, fn, lambda: False)(conn, 0.0) == [
            n * 2 for n in range(3, 10)
        ]
        monkeypatch.setattr(writer_module, "MIN_SLICE_SECONDS", 0.0)
        assert writer_module.slice_of(items, 3, fn, lambda: True)(conn, 0.0) == [6]
    finally:
        conn.close()


async def test_the_wal_bound_is_looser_while_a_background_write_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background checkpoint that leaves a WAL over WAL_LIMIT_PAGES makes the writer catch
    up before its next batch; while a sweep's slices run, and for a grace period after
    (the sweep reads its next page), only one over BACKGROUND_WAL_LIMIT_PAGES does (each
    catch-up made the saves queued meanwhile wait)."""
    storage = SQLiteCheckpointStorage(tmp_path / "s.db")
    await storage.save("warm", 0, b"x")
    loop = asyncio.get_running_loop()

    def ended(log: int) -> bool:
        storage._writer.catch_up = False
        storage._busy = True  # no new checkpoint from here: only the flag is looked at
        done: asyncio.Future[CheckpointResult | None] = loop.create_future()
        done.set_result(CheckpointResult(False, log, log - 10))
        storage._checkpoint_done(done)
        storage._busy = False
        return storage._writer.catch_up

    try:
        assert ended(WAL_LIMIT_PAGES)
        with storage._background():
            assert not ended(WAL_LIMIT_PAGES)
            assert ended(BACKGROUND_WAL_LIMIT_PAGES)
        assert storage._background_writes == 0
        assert not ended(WAL_LIMIT_PAGES)  # within the grace
        monkeypatch.setattr(groupcommit_module, "_BACKGROUND_GRACE", 0.0)
        assert ended(WAL_LIMIT_PAGES)
        assert not ended(WAL_LIMIT_PAGES - 1)
    finally:
        storage._writer.catch_up = False
        await storage.close()


async def test_space_is_given_back_in_background_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The incremental vacuum after a sweep runs as background slices of the group commit
    (committed without an fsync, never taken behind a waiting save): with no time for more,
    each slice gives back one chunk of VACUUM_PAGES, and the free list ends empty."""
    path = tmp_path / "s.db"
    storage = SQLiteCheckpointStorage(path)
    levels: list[int] = []
    slice_of = storage._writer.reclaim_slice

    def noting(waiting: object) -> object:
        run = slice_of(waiting)  # type: ignore[arg-type]

        def fn(conn: sqlite3.Connection, now: float) -> tuple[int, int]:
            levels.append(conn.execute("PRAGMA synchronous").fetchone()[0])
            return run(conn, now)

        return fn

    try:
        for n in range(40):
            await storage.save(f"wf-{n}", 0, b"x" * 20_000)
        for n in range(40):
            await storage.delete(f"wf-{n}")
        monkeypatch.setattr(writer_module, "LONG_SLICE_SECONDS", 0.0)
        monkeypatch.setattr(storage._writer, "reclaim_slice", noting)
        freed = await storage.reclaim_space()
        assert freed >= 40 * 20_000
        assert len(levels) >= 40 * 20_000 // 4096 // writer_module.VACUUM_PAGES
        assert set(levels) == {1}  # NORMAL: a slice alone commits without an fsync
    finally:
        await storage.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
    finally:
        conn.close()
