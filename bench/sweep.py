"""How long a sweep holds writers up: write latency with and without a sweep running.

    python bench/sweep.py [--rounds 3] [--writers 20] [--finished 1000] [--histories 50]
                          [--postgres DSN] [--tiny]

Each round, on a fresh SQLite database (or PostgreSQL schema), it fills the store with
``finished`` FINISHED workflows past their TTL (3 checkpoints each) and ``histories``
workflows of 60 checkpoints to thin (the policy keeps the newest 5 and every 10th), then
runs two rows side by side:

* ``sweep-same-store``: ``writers`` tasks write 1 KB checkpoints to their own workflows
  while their manager runs one sweep (as its background sweeper would); the writers'
  latencies are taken while the sweep runs.
* ``sweep-other-store``: the same, the sweep running on a second store object on the same
  database (as another process would), refilled first.
* ``alone``: the same writers for as long as the last sweep took, with no sweep.

Prints one JSON line per row and round, then the medians: the writers' p50/p99/max write
latency in each row, their ratios, the sweep's duration, what it deleted, and its longest
single storage call (the longest it held the database for one batch). Timings are ratios
within one run: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg

from aiocheckpoint import CheckpointManager, RetentionPolicy, WorkflowStatus
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

POLICY = RetentionPolicy(keep_last=5, keep_every=10, finished_ttl=timedelta(days=1))
STATE = {"notes": "x" * 1000}
Opener = Callable[[], CheckpointStorage]


async def fill(manager: CheckpointManager, finished: int, histories: int) -> None:
    """The workflows to expire and the histories to thin, written 50 at a time."""

    async def expired(n: int) -> None:
        for step in range(3):
            await manager.create_checkpoint(f"done-{n}", step, "a", "completed", STATE)
        await manager.mark_workflow(f"done-{n}", WorkflowStatus.FINISHED)

    async def history(n: int) -> None:
        for step in range(60):
            await manager.create_checkpoint(f"long-{n}", step, "a", "running", STATE)

    jobs: list[Awaitable[None]] = [expired(n) for n in range(finished)]
    jobs += [history(n) for n in range(histories)]
    for at in range(0, len(jobs), 50):
        await asyncio.gather(*jobs[at : at + 50])


async def writers(manager: CheckpointManager, count: int, stop: asyncio.Event) -> list[float]:
    """Latencies (s) of ``count`` writers' checkpoints until ``stop``, each with its start."""
    latencies: list[float] = []

    async def writer(n: int) -> None:
        step = 0
        while not stop.is_set():
            began = time.perf_counter()
            await manager.create_checkpoint(f"live-{n}", step, "w", "running", STATE)
            latencies.append(time.perf_counter() - began)
            step += 1

    await asyncio.gather(*(writer(n) for n in range(count)))
    return latencies


def timed_calls(storage: CheckpointStorage, longest: list[float]) -> None:
    """Record the longest storage call the sweep makes (a bench-only wrapper)."""
    for name in (
        "delete",
        "delete_workflow",
        "drop_orphan_effects",
        "scan",
        "query_workflow_records",
    ):
        call = getattr(storage, name)

        async def wrapped(*args: Any, _call: Any = call, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await _call(*args, **kwargs)
            finally:
                longest[0] = max(longest[0], time.perf_counter() - began)

        setattr(storage, name, wrapped)


async def sweep_row(open_store: Opener, count: int, shared: bool) -> tuple[dict[str, Any], float]:
    """Writers while one sweep runs: through the writers' store, or another store object."""
    store = open_store()
    sweeper_store = store if shared else open_store()
    longest = [0.0]
    timed_calls(sweeper_store, longest)
    # The writers keep their own workflows short at each write, as a live service would.
    async with CheckpointManager(store, max_checkpoints=5) as manager:
        sweeper = manager if shared else CheckpointManager(sweeper_store)
        stop = asyncio.Event()
        load = asyncio.create_task(writers(manager, count, stop))
        await asyncio.sleep(0.3)  # the writers are under way
        began = time.perf_counter()
        later = datetime.now(timezone.utc) + timedelta(days=2)
        report = await sweeper.sweep(now=later, policy=POLICY)
        took = time.perf_counter() - began
        stop.set()
        latencies = await load
        await sweeper.close()
    row = stats("sweep-same-store" if shared else "sweep-other-store", latencies)
    row |= {
        "sweep_s": round(took, 3),
        "workflows_deleted": sum(report.workflows_deleted.values()),
        "checkpoints_deleted": report.checkpoints_deleted,
        "longest_sweep_call_ms": round(longest[0] * 1000, 2),
    }
    return row, took


async def alone_row(open_store: Opener, count: int, seconds: float) -> dict[str, Any]:
    async with CheckpointManager(open_store(), max_checkpoints=5) as manager:
        stop = asyncio.Event()
        load = asyncio.create_task(writers(manager, count, stop))
        await asyncio.sleep(0.3 + seconds)
        stop.set()
        return stats("alone", await load)


def stats(row: str, latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    pick = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "row": row,
        "writes": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(pick * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def openers(args: argparse.Namespace, where: Path) -> tuple[Opener, str | None]:
    """How to open the round's store, and its PostgreSQL schema (dropped after the round)."""
    if args.postgres:
        schema = f"bench_sweep_{uuid.uuid4().hex[:10]}"
        dsn = args.postgres
        return lambda: PostgresCheckpointStorage(dsn, schema=schema, max_size=4), schema
    path = where / f"{uuid.uuid4().hex}.db"
    return lambda: SQLiteCheckpointStorage(path), None


async def one_round(args: argparse.Namespace, where: Path) -> list[dict[str, Any]]:
    """The two sweep rows, each on a fresh store, then the writers alone."""
    rows, schemas = [], []
    try:
        for shared in (True, False):
            open_store, schema = openers(args, where)
            schemas.append(schema)
            async with CheckpointManager(open_store()) as manager:
                await fill(manager, args.finished, args.histories)
            swept, seconds = await sweep_row(open_store, args.writers, shared)
            rows.append(swept)
        rows.append(await alone_row(open_store, args.writers, seconds))
    finally:
        await drop_schemas(args.postgres, [s for s in schemas if s is not None])
    return rows


async def drop_schemas(dsn: str | None, schemas: list[str]) -> None:
    if dsn is None or not schemas:
        return
    con = await asyncpg.connect(dsn)
    try:
        for schema in schemas:
            await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()


def summary(rows: list[dict[str, Any]], backend: str) -> dict[str, Any]:
    def median(row: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["row"] == row)

    out: dict[str, Any] = {"summary": backend}
    for key in ("p50_ms", "p99_ms", "max_ms"):
        out[f"alone_{key}"] = median("alone", key)
        for row in ("sweep-same-store", "sweep-other-store"):
            out[f"{row}_{key}"] = median(row, key)
            out[f"{row}_{key}_ratio"] = round(median(row, key) / max(median("alone", key), 1e-9), 2)
    for row in ("sweep-same-store", "sweep-other-store"):
        for key in ("sweep_s", "workflows_deleted", "checkpoints_deleted", "longest_sweep_call_ms"):
            out[f"{row}_{key}"] = median(row, key)
    return out


async def run(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            for row in await one_round(args, Path(tmp)):
                print(json.dumps({"round": n, **row}), flush=True)
                rows.append(row)
    print(json.dumps(summary(rows, "postgres" if args.postgres else "sqlite")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=20)
    parser.add_argument("--finished", type=int, default=1000)
    parser.add_argument("--histories", type=int, default=50)
    parser.add_argument("--postgres", metavar="DSN", help="run on PostgreSQL instead of SQLite")
    parser.add_argument("--tiny", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.writers, args.finished, args.histories = 1, 4, 20, 3
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
