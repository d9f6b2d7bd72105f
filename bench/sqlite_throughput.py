"""Durable write throughput of SQLiteCheckpointStorage at 1, 10 and 100 concurrent writers.

Not a test: it prints figures. Every system writes the same ~1 KB checkpoint records to a
fresh database file in a temporary directory (on the same disk as --dir), with WAL and
synchronous=FULL, and the ratios are computed within this one run:

* ``memory (ceiling)``   CheckpointManager + InMemoryCheckpointStorage: the manager's own
                         cost (validation, encoding), no durability; no backend can beat it
* ``aiocheckpoint``      CheckpointManager + SQLiteCheckpointStorage (group commit)
* ``aiosqlite-gc``       the same group commit written on aiosqlite: one thread hop per
                         statement (the design this backend rejects; see docs)
* ``aiosqlite-gc-many``  the same with the batch's inserts in one ``executemany`` hop
                         (3 hops per batch: BEGIN, executemany, COMMIT)
* ``lg-async-sqlite``    LangGraph's AsyncSqliteSaver, if installed
* ``sqlite3 1/commit``   plain sqlite3, one row per transaction (one fsync per row)
* ``sqlite3 100/txn``    plain sqlite3, 100 rows per transaction

Usage: ``python bench/sqlite_throughput.py [--total N] [--repeats R] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiocheckpoint import (
    AgentStatus,
    Checkpoint,
    CheckpointManager,
    InMemoryCheckpointStorage,
    StateSnapshot,
)
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.storage.base import BaseStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

CONCURRENCY = (1, 10, 100)


def state_for(step: int) -> dict[str, Any]:
    """A ~1 KB state (encoded record ~1.2 KB with the checkpoint envelope)."""
    return {"step": step, "notes": "lorem ipsum dolor sit amet " * 32, "scores": [1.5, 2.5]}


def sample_record() -> bytes:
    cp = Checkpoint(
        workflow_id="wf-0",
        step=0,
        agent_id="agent",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data=state_for(0)),
    )
    return encode_checkpoint(cp)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(
    save: Callable[[str, int], Awaitable[Any]], concurrency: int, total: int
) -> tuple[float, list[float]]:
    """Run ``concurrency`` workflows writing about ``total`` checkpoints (fewer at low C, where
    each costs an fsync); return the rate and the latencies."""
    total = {1: total // 5, 10: total * 2 // 3}.get(concurrency, total)
    per = max(1, total // concurrency)
    latencies: list[float] = []

    async def workflow(n: int) -> None:
        for step in range(per):
            t0 = time.perf_counter()
            await save(f"wf-{n}", step)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(workflow(n) for n in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return per * concurrency / elapsed, latencies


class MemoryStore(InMemoryCheckpointStorage):
    """The in-memory backend: what CheckpointManager itself costs, with no storage at all."""

    async def open(self) -> None:
        pass


class AiosqliteGroupCommit(BaseStorage):
    """Group commit on aiosqlite's public API: each statement is its own hop to the thread
    (``many=True``: the batch's inserts go through one ``executemany`` hop)."""

    def __init__(self, path: Path, many: bool = False) -> None:
        self.path = path
        self.many = many
        self.conn: Any = None
        self.queue: list[tuple[str, int, bytes, asyncio.Future[None]]] = []
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        import aiosqlite

        self.conn = await aiosqlite.connect(str(self.path), isolation_level=None)
        await self.conn.execute("PRAGMA journal_mode=WAL")
        await self.conn.execute("PRAGMA synchronous=FULL")
        await self.conn.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints (id INTEGER PRIMARY KEY, workflow_id TEXT,"
            " step INTEGER, data BLOB, UNIQUE (workflow_id, step))"
        )

    async def save(self, workflow_id: str, step: int, data: bytes, **_: Any) -> None:
        future = asyncio.get_running_loop().create_future()
        self.queue.append((workflow_id, step, data, future))
        if self.task is None:
            self.task = asyncio.create_task(self.drain())
        await future

    async def drain(self) -> None:
        while self.queue:
            batch, self.queue = self.queue, []
            sql = (
                "INSERT INTO checkpoints (workflow_id, step, data) VALUES (?, ?, ?) ON "
                "CONFLICT (workflow_id, step) DO UPDATE SET data = excluded.data"
            )
            await self.conn.execute("BEGIN IMMEDIATE")
            if self.many:
                await self.conn.executemany(sql, [item[:3] for item in batch])
            else:
                for wf, step, data, _ in batch:
                    await self.conn.execute(sql, (wf, step, data))
            await self.conn.execute("COMMIT")
            for *_, future in batch:
                future.set_result(None)
        self.task = None

    async def close(self) -> None:
        await self.conn.close()


async def bench_manager(make: Callable[[Path], Any], workdir: Path, c: int, total: int) -> Any:
    storage = make(workdir / f"db-{time.monotonic_ns()}.db")
    await storage.open()
    manager = CheckpointManager(storage)

    async def save(wf: str, step: int) -> None:
        await manager.create_checkpoint(wf, step, "agent", "completed", state_for(step))

    try:
        return await drive(save, c, total)
    finally:
        await manager.close()


async def bench_langgraph(workdir: Path, c: int, total: int) -> Any:
    import aiosqlite
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(str(workdir / f"lg-{time.monotonic_ns()}.db"))
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    await conn.execute("PRAGMA synchronous=FULL")
    configs: dict[str, Any] = {}

    async def save(wf: str, step: int) -> None:
        config = configs.get(wf) or {"configurable": {"thread_id": wf, "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=step))
        state = state_for(step)
        checkpoint["channel_values"] = state
        versions = {key: saver.get_next_version(None, None) for key in state}
        checkpoint["channel_versions"] = versions
        configs[wf] = await saver.aput(config, checkpoint, {"step": step}, versions)

    try:
        return await drive(save, c, total)
    finally:
        await conn.close()


def plain_sqlite(workdir: Path, record: bytes, rows: int, per_txn: int) -> float:
    conn = sqlite3.connect(str(workdir / f"plain-{time.monotonic_ns()}.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, workflow_id TEXT, step INTEGER, data BLOB,"
        " UNIQUE (workflow_id, step))"
    )
    t0 = time.perf_counter()
    for start in range(0, rows, per_txn):
        conn.execute("BEGIN IMMEDIATE")
        for n in range(start, start + per_txn):
            conn.execute(
                "INSERT INTO t (workflow_id, step, data) VALUES (?, ?, ?)",
                (f"wf-{n % 100}", n, record),
            )
        conn.execute("COMMIT")
    rate = rows / (time.perf_counter() - t0)
    conn.close()
    return rate


def emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--total",
        type=int,
        default=3000,
        help="checkpoints per measurement at C=100 (C=10: 2/3, C=1: 1/5)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats; medians are reported")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    args = parser.parse_args()

    systems: dict[str, Callable[[Path, int], Awaitable[Any]]] = {
        "memory (ceiling)": lambda d, c: bench_manager(lambda _: MemoryStore(), d, c, args.total),
        "aiocheckpoint": lambda d, c: bench_manager(SQLiteCheckpointStorage, d, c, args.total),
        "aiosqlite-gc": lambda d, c: bench_manager(AiosqliteGroupCommit, d, c, args.total),
        "aiosqlite-gc-many": lambda d, c: bench_manager(
            lambda path: AiosqliteGroupCommit(path, many=True), d, c, args.total
        ),
    }
    try:
        import langgraph.checkpoint.sqlite.aio  # noqa: F401

        systems["lg-async-sqlite"] = lambda d, c: bench_langgraph(d, c, args.total)
    except ImportError:
        print(
            "# langgraph-checkpoint-sqlite not installed: skipping AsyncSqliteSaver",
            file=sys.stderr,
        )

    rates: dict[tuple[str, int], list[float]] = {}
    lats: dict[tuple[str, int], list[float]] = {}
    plain_rates: dict[int, list[float]] = {1: [], 100: []}
    record = sample_record()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="aiock-bench-") as tmp:
        workdir = Path(tmp)
        # Each repeat runs every system once, in a rotated order, so a burst of load on this
        # shared machine hits them all alike; medians are reported.
        for per_txn, rows in ((1, 1000), (100, 20000)):
            for _ in range(args.repeats):
                plain_rates[per_txn].append(plain_sqlite(workdir, record, rows, per_txn))
        names = list(systems)
        for c in CONCURRENCY:
            for rep in range(args.repeats):
                for name in names[rep % len(names) :] + names[: rep % len(names)]:
                    rate, latencies = await systems[name](workdir, c)
                    rates.setdefault((name, c), []).append(rate)
                    lats.setdefault((name, c), []).extend(latencies)
    plain = {k: statistics.median(v) for k, v in plain_rates.items()}
    for per_txn, rate in plain.items():
        emit(
            {
                "system": f"sqlite3 {per_txn}/txn",
                "record_bytes": len(record),
                "rows_per_s": round(rate),
            }
        )
    results: dict[tuple[str, int], dict[str, float]] = {}
    for key, values in rates.items():
        results[key] = {
            "ckpt_per_s": statistics.median(values),
            "p50_ms": pct(lats[key], 0.50) * 1e3,
            "p99_ms": pct(lats[key], 0.99) * 1e3,
        }
        emit({"system": key[0], "C": key[1], **{k: round(v, 2) for k, v in results[key].items()}})

    print()
    print(
        f"record: {len(record)} bytes; plain sqlite3: {plain[1]:,.0f} rows/s at 1/commit, "
        f"{plain[100]:,.0f} rows/s at 100/txn"
    )
    head = "| system | C | ckpt/s | p50 ms | p99 ms | x sqlite3 1/commit | x sqlite3 100/txn |"
    extra = " x lg-async-sqlite |" if any(k[0] == "lg-async-sqlite" for k in results) else ""
    print(head + extra)
    print("|" + "---|" * (head.count("|") - 1 + (1 if extra else 0)))
    for (name, c), row in results.items():
        line = (
            f"| {name} | {c} | {row['ckpt_per_s']:,.0f} | {row['p50_ms']:.2f} | "
            f"{row['p99_ms']:.2f} | {row['ckpt_per_s'] / plain[1]:.2f} | "
            f"{row['ckpt_per_s'] / plain[100]:.2f} |"
        )
        if extra:
            lg = results.get(("lg-async-sqlite", c))
            line += f" {row['ckpt_per_s'] / lg['ckpt_per_s']:.1f} |" if lg else " |"
        print(line)


if __name__ == "__main__":
    asyncio.run(main())
