"""A full disk, said plainly: every backend raises StorageFullError, "disk full: ...".

The file store and SQLite fill a real 256 KiB tmpfs (the ``root`` tier). PostgreSQL's
``53100 disk_full`` cannot be produced on a real server here without filling its data
disk, so its mapping is checked on the exception class asyncpg raises for it
(``asyncpg.exceptions.DiskFullError``), constructed directly.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from aiocheckpoint import StorageBackendError, StorageFullError
from aiocheckpoint.storage.base import BaseStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres.connection import failure
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests._tmpfs import tiny_tmpfs


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted at tmp_path/mnt (needs root)."""
    with tiny_tmpfs(tmp_path) as mnt:
        yield mnt


async def fill(storage: BaseStorage) -> tuple[list[int], StorageBackendError]:
    """Save 16 KiB records until the disk is full: the steps saved and the error."""
    saved: list[int] = []
    for step in range(100):
        try:
            await storage.save("wf", step, os.urandom(16 * 1024))
        except StorageBackendError as exc:
            return saved, exc
        saved.append(step)
    raise AssertionError("the disk never filled up")


@pytest.mark.root  # mounts a tmpfs
async def test_file_store_says_disk_full(tiny_disk: Path) -> None:
    """ENOSPC from the OS: StorageFullError "disk full: ...", the OSError as the cause."""
    storage = FileCheckpointStorage(tiny_disk / "s")
    saved, error = await fill(storage)
    assert isinstance(error, StorageFullError)
    assert str(error).startswith("disk full: ")
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
    latest = await storage.load("wf")
    assert latest is not None and latest.step == saved[-1]
    await storage.close()


@pytest.mark.root  # mounts a tmpfs
async def test_sqlite_store_says_disk_full(tiny_disk: Path) -> None:
    """SQLITE_FULL: StorageFullError "disk full: ...", sqlite3's error as the cause."""
    storage = SQLiteCheckpointStorage(tiny_disk / "c.db")
    saved, error = await fill(storage)
    assert isinstance(error, StorageFullError), error
    assert str(error).startswith("disk full: ")
    assert isinstance(error.__cause__, sqlite3.OperationalError)
    latest = await storage.load("wf")
    assert latest is not None and latest.step == saved[-1]
    await storage.close()


def test_postgres_disk_full_maps_to_storage_full_error() -> None:
    """SQLSTATE 53100 (asyncpg's DiskFullError, built directly): StorageFullError."""
    exc = asyncpg.exceptions.DiskFullError("could not extend file: No space left on device")
    assert exc.sqlstate == "53100"
    error = failure("save", exc)
    assert isinstance(error, StorageFullError)
    assert str(error).startswith("disk full: PostgreSQL save failed: DiskFullError: ")
    assert error.__cause__ is exc
    other = failure("save", asyncpg.exceptions.UniqueViolationError("duplicate key"))
    assert type(other) is StorageBackendError


def fill_with_a_file(directory: Path) -> Path:
    """Write a file in ``directory`` until the filesystem is full; its path."""
    filler = directory / "filler"
    with (
        filler.open("wb", buffering=0) as out,
        pytest.raises(OSError, match="No space left") as full,
    ):
        while True:
            out.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


@pytest.mark.root  # mounts a tmpfs
async def test_sqlite_store_opened_on_a_full_disk_reads(tmp_path: Path) -> None:
    """A store closed cleanly, then the disk filled: a new store reads every checkpoint,
    a save says "disk full", and writes work again once space is freed.
    """
    with tiny_tmpfs(tmp_path, size="1m") as mnt:
        writer = SQLiteCheckpointStorage(mnt / "c.db")
        for step in range(3):
            await writer.save("wf", step, b"%d" % step)
        await writer.close()
        filler = fill_with_a_file(mnt)
        reader = SQLiteCheckpointStorage(mnt / "c.db")
        assert [r.data for r in await reader.scan("wf")] == [b"0", b"1", b"2"]
        latest = await reader.load("wf")
        assert latest is not None and latest.step == 2
        assert await reader.list_workflows() == ["wf"]
        with pytest.raises(StorageFullError) as info:
            await reader.save("wf", 3, b"3")
        assert str(info.value).startswith("disk full: ")
        filler.unlink()
        await reader.save("wf", 3, b"3")
        assert [r.step for r in await reader.scan("wf")] == [0, 1, 2, 3]
        await reader.close()
