"""Opening a SQLite store this process already opened skips the directory fsync, safely."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, open_storage
from aiocheckpoint.storage.sqlite import connections


@pytest.fixture
def dir_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every directory the SQLite backend fsyncs (the fsync still happens)."""
    calls: list[Path] = []
    real = connections.fsync_dir

    def spy(path: Path) -> None:
        calls.append(path)
        real(path)

    monkeypatch.setattr(connections, "fsync_dir", spy)
    return calls


async def _request(url: str) -> None:
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.get_latest_checkpoint("wf")


async def test_reopening_skips_the_directory_fsync(tmp_path: Path, dir_fsyncs: list[Path]) -> None:
    """A manager per request fsyncs the database's directory once, not at every open (again
    after the file changed: a deleted and re-created file must not pass for the old one)."""
    url = f"sqlite://{tmp_path}/app.db"
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"x": 1})
    assert dir_fsyncs == [tmp_path]
    await _request(url)  # the close above checkpointed the WAL: the file changed, fsync again
    fsyncs = len(dir_fsyncs)
    for _ in range(5):
        await _request(url)
    assert len(dir_fsyncs) == fsyncs


async def test_a_replaced_database_is_fsynced_again(tmp_path: Path, dir_fsyncs: list[Path]) -> None:
    """A database file deleted and created again gets its directory entry fsynced again."""
    url = f"sqlite://{tmp_path}/app.db"
    await _request(url)
    for name in os.listdir(tmp_path):
        os.unlink(tmp_path / name)
    await _request(url)
    assert dir_fsyncs == [tmp_path, tmp_path]
