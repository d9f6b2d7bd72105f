"""PostgreSQL write throughput: PostgresCheckpointStorage next to plain asyncpg, in one run.

    PYTHONPATH=src python bench/postgres_throughput.py [--dsn DSN] [--seconds 3] [--quick]

For C in (1, 10, 100) concurrent workflows, each writing ~1 KB states through
CheckpointManager one step after another, it prints checkpoints/s and p50/p99 latency, next
to LangGraph's AsyncPostgresSaver writing the same states (if installed; --no-langgraph to
skip) and to plain asyncpg writing the same bytes (one INSERT per commit from C tasks on a
pool of min(C, 20); and 100 INSERTs per transaction on one connection), and the ratios.
One JSON line per measurement, then a markdown table. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from aiocheckpoint import CheckpointManager
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage


def state(step: int) -> dict[str, object]:
    return {"step": step, "notes": ["n" * 90 for _ in range(10)], "counter": step * 7}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(
    concurrency: int, seconds: float, write: Callable[[int, int], Awaitable[None]]
) -> dict[str, float]:
    """Run `concurrency` writers, step after step; measure `seconds` after a short warm-up."""
    latencies: list[float] = []
    warm = time.perf_counter() + min(0.5, seconds / 4)  # prepared statements, pool, caches
    deadline = warm + seconds

    async def writer(w: int) -> None:
        step = 0
        while (t0 := time.perf_counter()) < deadline:
            await write(w, step)
            if t0 >= warm:
                latencies.append(time.perf_counter() - t0)
            step += 1

    await asyncio.gather(*(writer(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - warm
    return {
        "per_s": len(latencies) / elapsed,
        "p50_ms": quantile(latencies, 0.50) * 1000,
        "p99_ms": quantile(latencies, 0.99) * 1000,
        "n": len(latencies),
    }


async def ours(dsn: str, schema: str, concurrency: int, seconds: float) -> dict[str, float]:
    storage = PostgresCheckpointStorage(dsn, schema=schema)
    async with CheckpointManager(storage) as manager:
        await manager.list_workflows()  # open the pool and the schema outside the timing

        async def write(w: int, step: int) -> None:
            await manager.create_checkpoint(
                f"c{concurrency}-wf{w}", step, "a", "completed", state(step)
            )

        result = await drive(concurrency, seconds, write)
        result["rows_per_commit"] = storage.stats.rows / max(1, storage.stats.batches)
    return result


async def langgraph(dsn: str, schema: str, concurrency: int, seconds: float) -> dict[str, float]:
    """LangGraph's AsyncPostgresSaver (psycopg pool of 10) writing the same states."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {
        "autocommit": True,
        "prepare_threshold": 0,
        "row_factory": dict_row,
        "options": f"-c search_path={schema}",
    }
    pool = AsyncConnectionPool(dsn, min_size=10, max_size=10, kwargs=kwargs, open=False)
    await pool.open(wait=True)
    try:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        threads: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
        tag = uuid.uuid4().hex[:6]

        async def write(w: int, step: int) -> None:
            wf = f"lg{tag}-{w}"
            blank = ({"configurable": {"thread_id": wf, "checkpoint_ns": ""}}, {}, {})
            config, previous, versions = threads.get(wf, blank)
            values = state(step)
            # As in a real graph, only channels whose value changed get a new version (and a
            # new blob row): here "notes" is written once, "step" and "counter" every time.
            changed = {
                k: saver.get_next_version(versions.get(k), None)
                for k, v in values.items()
                if previous.get(k) != v
            }
            versions = {**versions, **changed}
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid6(clock_seq=step))
            checkpoint["channel_values"] = values
            checkpoint["channel_versions"] = versions
            metadata = {"source": "loop", "step": step, "parents": {}}
            config = await saver.aput(config, checkpoint, metadata, changed)  # type: ignore[arg-type]
            threads[wf] = (config, values, versions)

        return await drive(concurrency, seconds, write)
    finally:
        await pool.close()


async def record_bytes() -> bytes:
    manager = CheckpointManager()
    cp = await manager.create_checkpoint("wf", 0, "a", "completed", state(0))
    return encode_checkpoint(cp)


async def plain_one_per_commit(
    dsn: str, table: str, concurrency: int, seconds: float, data: bytes
) -> dict[str, float]:
    pool = await asyncpg.create_pool(
        dsn, min_size=min(concurrency, 20), max_size=min(concurrency, 20)
    )
    sql = f"INSERT INTO {table} (workflow_id, step, data) VALUES ($1, $2, $3)"
    try:
        tag = uuid.uuid4().hex[:6]

        async def write(w: int, step: int) -> None:
            await pool.execute(sql, f"p{tag}-{w}", step, data)

        return await drive(concurrency, seconds, write)
    finally:
        await pool.close()


async def plain_batched(dsn: str, table: str, seconds: float, data: bytes) -> dict[str, float]:
    con = await asyncpg.connect(dsn)
    sql = f"INSERT INTO {table} (workflow_id, step, data) VALUES ($1, $2, $3)"
    rows = 0
    latencies: list[float] = []
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            async with con.transaction():
                await con.executemany(sql, [("b", rows + i, data) for i in range(100)])
            latencies.append(time.perf_counter() - t0)
            rows += 100
    finally:
        await con.close()
    elapsed = time.perf_counter() - start
    return {
        "per_s": rows / elapsed,
        "p50_ms": quantile(latencies, 0.5) * 1000,
        "p99_ms": quantile(latencies, 0.99) * 1000,
        "n": rows,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="0.5 s per measurement")
    parser.add_argument("--no-langgraph", action="store_true", help="skip AsyncPostgresSaver")
    args = parser.parse_args()
    seconds = 0.5 if args.quick else args.seconds
    schema = f"aiocp_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.dsn)
    table = f'"{schema}_plain".plain'
    results: list[dict[str, object]] = []
    try:
        await admin.execute(f'CREATE SCHEMA "{schema}_plain"')
        await admin.execute(f'CREATE SCHEMA "{schema}_lg"')
        await admin.execute(
            f'CREATE TABLE {table} (workflow_id text COLLATE "C", step bigint, data bytea, '
            "created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (workflow_id, step))"
        )
        data = await record_bytes()
        for c in (1, 10, 100):
            runs = [
                ("aiocheckpoint", ours(args.dsn, schema, c, seconds)),
                ("asyncpg 1/commit", plain_one_per_commit(args.dsn, table, c, seconds, data)),
            ]
            if not args.no_langgraph:
                runs.append(
                    (
                        "LangGraph AsyncPostgresSaver",
                        langgraph(args.dsn, f"{schema}_lg", c, seconds),
                    )
                )
            for name, run in runs:
                r = await run
                row = {"system": name, "concurrency": c, "record_bytes": len(data), **r}
                results.append(row)
                print(json.dumps(row), flush=True)
        r = await plain_batched(args.dsn, table, seconds, data)
        row = {"system": "asyncpg 100/tx", "concurrency": 1, "record_bytes": len(data), **r}
        results.append(row)
        print(json.dumps(row), flush=True)
    finally:
        for name in (schema, f"{schema}_plain", f"{schema}_lg"):
            await admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await admin.close()
    print_table(results)


def print_table(results: list[dict[str, object]]) -> None:
    batched = next(float(r["per_s"]) for r in results if r["system"] == "asyncpg 100/tx")
    lg = {
        r["concurrency"]: float(r["per_s"])
        for r in results
        if str(r["system"]).startswith("LangGraph")
    }
    print(
        "\n| C | system | ckpt/s | p50 ms | p99 ms | vs asyncpg 1/commit "
        "| vs asyncpg 100/tx | vs LangGraph (this run) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        per_s = float(r["per_s"])
        plain = next(
            float(p["per_s"])
            for p in results
            if p["system"] in ("asyncpg 1/commit", "asyncpg 100/tx")
            and p["concurrency"] == r["concurrency"]
        )
        extra = (
            f" (rows/commit {float(r['rows_per_commit']):.1f})" if "rows_per_commit" in r else ""
        )
        print(
            f"| {r['concurrency']} | {r['system']}{extra} | {per_s:,.0f} "
            f"| {float(r['p50_ms']):.2f} "
            f"| {float(r['p99_ms']):.2f} | {per_s / plain:.2f}x | {per_s / batched:.2f}x "
            f"| {_ratio(per_s, lg.get(r['concurrency']))} |"
        )


def _ratio(value: float, reference: float | None) -> str:
    return "-" if reference is None else f"{value / reference:.2f}x"


if __name__ == "__main__":
    asyncio.run(main())
