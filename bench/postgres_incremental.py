"""Incremental checkpoints on PostgreSQL, end to end: stored bytes, small writes, resume.

    PYTHONPATH=src python bench/postgres_incremental.py [--steps 1000] [--dsn DSN] [--only abc]

Each run creates fresh schemas and drops them. Stored size: the logical bytes
(``sum(octet_length(data))`` of records and blobs) and the tables' on-disk size
(``pg_total_relation_size`` of records, blobs and their counts: heap, TOAST and indexes,
after ``VACUUM``).

(a) ``--steps`` checkpoints of a ~1 MB state in which one small key changes per step;
(b) ``--steps`` steps of a chat state whose message list grows by one ~1 KB message;
(c) small-state (~1 KB) writes/s with 100 concurrent writers, incremental vs version-1
    records (``CheckpointManager(storage, incremental=False)``), alternating, medians; and
    the resume of a ~10 MB state (10k ~1 KB documents), both ways.
(w) only the version-1 small-write rate (C=100): run it with ``PYTHONPATH`` pointing at two
    checkouts, alternately, to compare the storage code of two versions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from typing import Any

import asyncpg

sys.path.insert(0, os.path.dirname(__file__))

from incremental_e2e import v1_size
from incremental_size import _docs_state, _message

from aiocheckpoint import CheckpointManager
from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage

DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


class Schemas:
    """Fresh schemas for one run, dropped at the end."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.names: list[str] = []

    def new(self) -> str:
        name = f"bench_inc_{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return name

    async def sizes(self, name: str) -> tuple[int, int, int]:
        """Logical bytes, on-disk bytes after VACUUM, on-disk bytes after VACUUM FULL."""
        con = await asyncpg.connect(self.dsn)
        try:
            logical = disk = full = 0
            for table in ("checkpoints", "blobs", "blob_refs"):
                rel = f'"{name}".{table}'
                await con.execute(f"VACUUM {rel}")
                if table != "blob_refs":  # counts only: no data
                    logical += await con.fetchval(
                        f"SELECT coalesce(sum(octet_length(data)), 0) FROM {rel}"
                    )
                disk += await con.fetchval("SELECT pg_total_relation_size($1::regclass)", rel)
                await con.execute(f"VACUUM FULL {rel}")
                full += await con.fetchval("SELECT pg_total_relation_size($1::regclass)", rel)
            return int(logical), int(disk), int(full)
        finally:
            await con.close()

    async def drop(self) -> None:
        con = await asyncpg.connect(self.dsn)
        try:
            for name in self.names:
                await con.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await con.close()


async def workload_a(schemas: Schemas, steps: int) -> None:
    name = schemas.new()
    state = _docs_state(random.Random(1), 1000)
    t0 = time.perf_counter()
    storage = PostgresCheckpointStorage(schemas.dsn, schema=name)
    async with CheckpointManager(storage) as manager:
        for step in range(steps):
            state["counter"] = step
            await manager.create_checkpoint("wf", step, "agent", "running", state)
        elapsed = time.perf_counter() - t0
        last = await manager.get_checkpoint("wf", steps - 1)
        assert last.state_snapshot.data == to_storable(state)
    logical, disk, full = await schemas.sizes(name)
    print(
        f"(a) {steps} checkpoints of a {v1_size(state) / 1e6:.2f} MB state, one key changing: "
        f"{logical / 1e6:.2f} MB logical, on disk {disk / 1e6:.2f} MB ({full / 1e6:.2f} MB "
        f"after VACUUM FULL) (v1 would be ~{steps * v1_size(state) / 1e6:.0f} MB); "
        f"{elapsed / steps * 1000:.1f} ms/save, "
        f"{storage.stats.blob_statements / steps:.1f} blob statements/save"
    )


async def workload_b(schemas: Schemas, steps: int) -> None:
    name = schemas.new()
    rng = random.Random(2)
    state: dict[str, Any] = {"system": "You are helpful.", "messages": []}
    t0 = time.perf_counter()
    storage = PostgresCheckpointStorage(schemas.dsn, schema=name)
    async with CheckpointManager(storage) as manager:
        for step in range(steps):
            state["messages"].append(_message(rng, step))
            await manager.create_checkpoint("chat", step, "agent", "running", state)
        elapsed = time.perf_counter() - t0
        last = await manager.get_checkpoint("chat", steps - 1)
        assert last.state_snapshot.data == state
    logical, disk, full = await schemas.sizes(name)
    final = v1_size(state)
    print(
        f"(b) {steps} steps of a chat growing by ~1 KB: final state {final / 1e6:.2f} MB, "
        f"{logical / 1e6:.2f} MB logical = {logical / final:.2f}x final; on disk "
        f"{disk / 1e6:.2f} MB = {disk / final:.2f}x ({full / 1e6:.2f} MB = {full / final:.2f}x "
        f"after VACUUM FULL); {elapsed:.1f} s, "
        f"{storage.stats.blob_statements / steps:.1f} blob statements/save"
    )


async def small_writes(schemas: Schemas, incremental: bool, writers: int, each: int) -> float:
    storage = PostgresCheckpointStorage(schemas.dsn, schema=schemas.new())
    async with CheckpointManager(storage, incremental=incremental, max_checkpoints=5) as manager:
        await storage.exists("warm-up")

        async def writer(w: int) -> None:
            state = {"counter": 0, "notes": "x" * 800, "plan": ["a", "b", "c"]}
            for step in range(each):
                state["counter"] = step
                await manager.create_checkpoint(f"wf{w}", step, "agent", "running", state)

        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(writers)))
        return writers * each / (time.perf_counter() - t0)


async def big_resume(schemas: Schemas, incremental: bool, repeats: int) -> tuple[float, float]:
    storage = PostgresCheckpointStorage(schemas.dsn, schema=schemas.new())
    state = _docs_state(random.Random(3), 10_000)
    async with CheckpointManager(storage, incremental=incremental) as manager:
        t0 = time.perf_counter()
        await manager.create_checkpoint("wf", 0, "agent", "running", state)
        write = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            point = await manager.get_resume_point("wf")
            times.append(time.perf_counter() - t0)
            assert point is not None and point[1].data["counter"] == 0
    return write, statistics.median(times)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--only", default="abc")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    schemas = Schemas(args.dsn)
    try:
        if "a" in args.only:
            await workload_a(schemas, args.steps)
        if "b" in args.only:
            await workload_b(schemas, args.steps)
        if "c" in args.only:
            rates: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.rounds):
                for inc in (False, True):
                    rates[inc].append(await small_writes(schemas, inc, 100, 20))
            v1, v2 = (statistics.median(rates[inc]) for inc in (False, True))
            print(
                f"(c) small-state writes/s, C=100, keep_last=5: v1 {v1:.0f}, incremental "
                f"{v2:.0f} (v1/incremental time ratio {v1 / v2:.2f}); "
                f"rounds v1 {[round(r) for r in rates[False]]}, "
                f"incremental {[round(r) for r in rates[True]]}"
            )
            for _ in range(args.rounds):
                w1, r1 = await big_resume(schemas, False, 5)
                w2, r2 = await big_resume(schemas, True, 5)
                print(
                    f"(c) 10 MB state: first write v1 {w1 * 1000:.0f} ms, incremental "
                    f"{w2 * 1000:.0f} ms; resume v1 {r1 * 1000:.0f} ms, incremental "
                    f"{r2 * 1000:.0f} ms (ratio {r2 / r1:.2f})"
                )
        if "w" in args.only:
            rate = statistics.median(
                [await small_writes(schemas, False, 100, 20) for _ in range(args.rounds)]
            )
            print(f"(w) small-state writes/s, C=100, keep_last=5, version 1: {rate:.0f}")
    finally:
        await schemas.drop()


if __name__ == "__main__":
    asyncio.run(main())
