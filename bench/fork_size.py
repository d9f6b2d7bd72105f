"""What a fork costs: the bytes ``fork_workflow`` adds for a workflow with a ~10 MB state.

    PYTHONPATH=src python bench/fork_size.py [--mb 10] [--dsn postgresql://...]

For each store, one workflow gets two checkpoints of a ~10 MB state (a retrieved-documents
context); the store's size is measured, the workflow is forked at its last step, and the
size is measured again. Sizes are what the store holds, not disk blocks: the file store's
file lengths (records, packs, indexes); SQLite's and PostgreSQL's record and blob bytes
(``length(data)`` of the checkpoints and blobs tables). The time of the fork is shown next to
the time of writing one checkpoint of the same state, as a ratio of the two measured in the
same run (the machine is shared: absolute times are not comparable between runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
Size = Callable[[], Awaitable[int]]


def state_of(megabytes: float) -> dict[str, Any]:
    """~``megabytes`` MB of documents of ~1 KB each, with random text (compresses poorly)."""
    rng = random.Random(15)
    count = int(megabytes * 1000)
    return {
        "docs": [
            {"id": i, "text": "".join(rng.choices("abcdefghij klmnop", k=1000))}
            for i in range(count)
        ]
    }


def file_size(base: Path) -> Size:
    """The file store's size: the lengths of all its files."""

    def files() -> int:
        return sum(p.stat().st_size for p in base.rglob("*") if p.is_file())

    async def size() -> int:
        return await asyncio.to_thread(files)

    return size


def sqlite_size(path: Path) -> Size:
    """A SQLite store's record and blob bytes (read on a connection of its own)."""

    def query() -> int:
        with sqlite3.connect(path) as con:
            rows = con.execute(
                "SELECT (SELECT coalesce(sum(length(data)), 0) FROM checkpoints)"
                " + (SELECT coalesce(sum(length(data)), 0) FROM blobs)"
            ).fetchone()
        return int(rows[0])

    async def size() -> int:
        return await asyncio.to_thread(query)

    return size


def postgres_size(schema: str) -> Size:
    """A PostgreSQL store's record and blob bytes."""

    async def size() -> int:
        con = await asyncpg.connect(DSN)
        try:
            total = await con.fetchval(
                f'SELECT (SELECT coalesce(sum(octet_length(data)), 0) FROM "{schema}".checkpoints)'
                f' + (SELECT coalesce(sum(octet_length(data)), 0) FROM "{schema}".blobs)'
            )
        finally:
            await con.close()
        return int(total)

    return size


async def measure(
    name: str, manager: CheckpointManager, size: Size, state: dict[str, Any]
) -> list[str]:
    """One row: stored bytes before, bytes the fork added, fork time / checkpoint time."""
    async with manager:
        await manager.create_checkpoint("source", 0, "a", "completed", state)
        started = time.perf_counter()
        await manager.create_checkpoint("source", 1, "a", "completed", state)
        write = time.perf_counter() - started
        before = await size()
        started = time.perf_counter()
        await manager.fork_workflow("source", 1, "fork")
        fork = time.perf_counter() - started
        added = await size() - before
    return [name, f"{before:,}", f"{added:,}", f"{fork / write:.2f}"]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="state size in MB (10)")
    args = parser.parse_args()
    state = state_of(args.mb)
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        store = FileCheckpointStorage(base / "files")
        rows.append(
            await measure("file", CheckpointManager(store), file_size(base / "files"), state)
        )
        db = base / "store.db"
        sqlite = CheckpointManager(SQLiteCheckpointStorage(db))
        rows.append(await measure("sqlite", sqlite, sqlite_size(db), state))
    for incremental in (True, False):
        schema = f"bench_fork_{uuid.uuid4().hex[:8]}"
        pg = PostgresCheckpointStorage(DSN, schema=schema)
        name = "postgres" if incremental else "postgres, incremental=False"
        try:
            manager = CheckpointManager(pg, incremental=incremental)
            rows.append(await measure(name, manager, postgres_size(schema), state))
        finally:
            con = await asyncpg.connect(DSN)
            await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await con.close()
    print(f"fork of a workflow with two checkpoints of a {args.mb:g} MB state")
    print(
        "| store | stored before the fork (bytes) | the fork adds (bytes) | fork time / one write |"
    )
    print("|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    asyncio.run(main())
