"""8 writers in 2 processes append to one session: nothing is lost, nothing reordered.

Each writer has its own store object, so only the store's leases (the file store: its writer
lock, a ``flock``), not the in-process lock, keep them apart. Each batch is two items; the
check is that every batch is there, whole and contiguous, and that each writer's batches are
in the order it wrote them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from aiocheckpoint import CheckpointManager
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN

CHILD = Path(__file__).with_name("_writers_child.py")
ROOT = Path(__file__).resolve().parents[2]
BATCHES = 25


def run_children(backend: str, where: str) -> None:
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), backend, where, str(p), str(BATCHES), DSN], cwd=ROOT
        )
        for p in range(2)
    ]
    assert [child.wait(timeout=300) for child in children] == [0, 0]


def check(items: list[str]) -> None:
    names = [f"{p}.{w}" for p in range(2) for w in range(4)]
    assert len(items) == len(names) * BATCHES * 2
    for i in range(0, len(items), 2):
        first, second = items[i].rsplit(":", 1), items[i + 1].rsplit(":", 1)
        assert first[0] == second[0]
        assert (first[1], second[1]) == ("a", "b")
    for name in names:
        seen = [int(item.split(":")[1]) for item in items[::2] if item.startswith(f"{name}:")]
        assert seen == list(range(BATCHES))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_local_stores(kind: str, tmp_path: Path) -> None:
    where = tmp_path / ("store" if kind == "file" else "s.db")
    await anyio.to_thread.run_sync(run_children, kind, str(where))
    storage = FileCheckpointStorage(where) if kind == "file" else SQLiteCheckpointStorage(where)
    async with storage, CheckpointManager(storage) as manager:
        items = await AioCheckpointSession("s", manager).get_items()
    check([item["content"] for item in items])  # type: ignore[typeddict-item]


@pytest.mark.slow
async def test_postgres(pg_schema: str) -> None:
    async with PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=1) as storage:
        await anyio.to_thread.run_sync(run_children, "postgres", pg_schema)
        async with CheckpointManager(storage) as manager:
            items = await AioCheckpointSession("s", manager).get_items()
    check([item["content"] for item in items])  # type: ignore[typeddict-item]
