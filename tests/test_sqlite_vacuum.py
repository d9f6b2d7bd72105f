"""SQLite gives back what sweeps free: incremental vacuum on new stores, ``compact`` for old ones.

And the ``compact`` command on each backend."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from aiocheckpoint import (
    CheckpointManager,
    RetentionPolicy,
    SQLiteCheckpointStorage,
    StorageFullError,
)
from aiocheckpoint.storage.base import SpaceReclaimingStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite.schema import migrate
from tests.backend_support import pg_schema
from tests.pg_support import DSN
from tests.test_cli import cli

__all__ = ["pg_schema"]  # the fixture

_STATE = {"text": "x" * 3000}


def _pragma(path: Path, name: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"PRAGMA {name}").fetchone()[0])
    finally:
        conn.close()


async def _fill(manager: CheckpointManager, workflows: int, steps: int) -> None:
    for n in range(workflows):
        for step in range(steps):
            await manager.create_checkpoint(f"wf-{n:03}", step, "a", "running", _STATE)


def _old_store(path: Path) -> None:
    """A store as versions before incremental vacuum made it (auto_vacuum=NONE)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn)
    conn.close()


async def test_a_new_store_gives_a_sweeps_pages_back(tmp_path: Path) -> None:
    """A sweep that deletes most of the store gives the freed pages back: the report says how
    many bytes, no page stays on the free list, and the file shrinks by at least that much."""
    path = tmp_path / "s.db"
    storage = SQLiteCheckpointStorage(path)
    assert isinstance(storage, SpaceReclaimingStorage)
    async with CheckpointManager(storage, retention=RetentionPolicy(keep_last=1)) as manager:
        await _fill(manager, 20, 10)
        pages_before = _pragma(path, "page_count")
        report = await manager.sweep()
        assert report.checkpoints_deleted == 20 * 9
        assert report.bytes_reclaimed >= 20 * 9 * 3000
        assert _pragma(path, "freelist_count") == 0
        assert _pragma(path, "auto_vacuum") == 2
        size = _pragma(path, "page_size")
        # The WAL holds the shrunk database until a checkpoint; page_count reads through it.
        assert (pages_before - _pragma(path, "page_count")) * size >= report.bytes_reclaimed
        again = await manager.sweep()
        assert (again.deleted, again.bytes_reclaimed) == (0, 0)
        latest = await manager.get_latest_checkpoint("wf-007")
        assert latest is not None and latest.step == 9


async def test_an_old_store_keeps_its_pages_until_compacted(tmp_path: Path) -> None:
    """A store made without incremental vacuum reuses its free pages but gives none back;
    ``compact`` rewrites it smaller and incremental, and what it holds reads the same."""
    path = tmp_path / "old.db"
    _old_store(path)
    assert _pragma(path, "auto_vacuum") == 0
    storage = SQLiteCheckpointStorage(path)
    async with CheckpointManager(storage, retention=RetentionPolicy(keep_last=1)) as manager:
        await _fill(manager, 20, 10)
        report = await manager.sweep()
        assert report.checkpoints_deleted == 180 and report.bytes_reclaimed == 0
        assert _pragma(path, "freelist_count") > 0
        before, after = await storage.compact()
        assert after < before and before - after >= 180 * 3000
        assert _pragma(path, "auto_vacuum") == 2 and _pragma(path, "freelist_count") == 0
        assert sorted(await manager.list_workflows())[:2] == ["wf-000", "wf-001"]
        loaded = await manager.get_latest_checkpoint("wf-019")
        assert loaded is not None and loaded.step == 9 and loaded.state_snapshot.data == _STATE
        await _fill(manager, 20, 12)  # later sweeps give pages back
        assert (await manager.sweep()).bytes_reclaimed > 0


async def test_compact_command(tmp_path: Path, pg_schema: str) -> None:
    """``aiocheckpoint compact`` VACUUMs a SQLite store (an old one becomes incremental) and
    a PostgreSQL store's tables, prints the bytes before and after, and says a file store
    has nothing to compact; each exits 0."""
    path = tmp_path / "old.db"
    _old_store(path)
    async with CheckpointManager(SQLiteCheckpointStorage(path)) as manager:
        await _fill(manager, 5, 4)
        await manager.delete_checkpoints("wf-001")
    done = cli("--json", "compact", f"sqlite:{path}")
    assert done.code == 0, done.err
    sizes = done.json()
    assert isinstance(sizes, dict) and sizes["compacted"] is True
    assert sizes["bytes_after"] < sizes["bytes_before"]
    assert _pragma(path, "auto_vacuum") == 2
    async with CheckpointManager(PostgresCheckpointStorage(DSN, schema=pg_schema)) as manager:
        await _fill(manager, 2, 2)
    done = cli("compact", f"{DSN}?schema={pg_schema}")
    assert done.code == 0 and done.out.startswith("compacted: "), done.err
    (tmp_path / "files").mkdir()
    done = cli("compact", f"file:{tmp_path / 'files'}")
    assert done.code == 0 and "nothing to compact" in done.out, done.err


async def test_a_sweep_whose_space_cannot_be_given_back_still_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When giving the space back fails (a full disk, injected here), the sweep's deletes
    stand and its report says 0 bytes given back: the pages are reused by later writes."""
    storage = SQLiteCheckpointStorage(tmp_path / "s.db")

    async def full() -> int:
        raise StorageFullError("disk full: injected")

    monkeypatch.setattr(storage, "reclaim_space", full)
    async with CheckpointManager(storage, retention=RetentionPolicy(keep_last=1)) as manager:
        await _fill(manager, 3, 4)
        report = await manager.sweep()
        assert (report.checkpoints_deleted, report.bytes_reclaimed) == (9, 0)
        assert [c.step for c in await manager.list_checkpoints("wf-002")] == [3]
