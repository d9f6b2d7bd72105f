"""Retention at scale: build N workflows x M checkpoints, sweep them, sweep again.

    python bench/scale.py [--workflows 100000] [--checkpoints 10] [--keep-last 3]
                          [--backends sqlite,postgres] [--dsn DSN] [--concurrency 200]
                          [--quick] [--fill] [--gc-freeze]

For each backend, on a fresh SQLite file (or PostgreSQL schema, dropped afterwards):

* **build**: ``workflows`` workflows of ``checkpoints`` RUNNING checkpoints each (a small
  state), written through a manager by ``concurrency`` tasks, each task one workflow at a
  time, step after step: the build rate in checkpoints/s;
* **sweep**: one ``manager.sweep()`` with ``RetentionPolicy(keep_last=...)``: its time,
  what it deleted and the deletes per second;
* **writers**: ``writers`` tasks each save a checkpoint of their own workflow every
  ``writer_pause`` seconds, first alone for ``writer_seconds`` and then while the sweep
  runs: their save latency p50/p99 in both, and the ratio of the p99s (same run);
* **again**: a second sweep, with nothing left to delete: its time, and that time per
  100,000 workflows;
* the store's bytes before and after (SQLite: the database file and its WAL; PostgreSQL:
  ``pg_total_relation_size`` of the schema's tables). A sweep frees pages for reuse; it
  does not shrink the file or the tables.

``--fill`` builds the same histories straight in SQL (bench/scale_fill.py), many times
faster: for sweeps measured again and again (its build rate means little). Prints one
JSON line per backend. ``--quick`` is CI's smoke size (2,000 x 10). The machine is
shared: read the load average printed with each line.

``--queries 1000,100000,1000000`` instead builds a store per size in bulk SQL
(``scale_fill.py``) and probes them in turn, ``--rounds`` times (alternating the order):
``--calls`` one at a time of a page of 50 unfinished workflows of a common tenant (1 in 20
pass) and of a rare org (1 in 485), ``get_resume_point`` and ``claim_workflow`` plus its
release. Each line gives the medians over the rounds of p50 and p99 and the p99 over the
smallest size's: the sizes share the machine's load. A page is also compared with the
smallest store that fills it (``vs_size``, ``p50_vs_first_full``, ``p99_vs_first_full``):
at 1,000 workflows the rare org's page holds 2 matches, at 100,000 up it holds 50, so its
growth from 1,000 measures the page's length, not the plan.

``--gc-freeze`` calls ``gc.freeze()`` first, as a latency-minded runner does once it has
started (docs/performance.md): the imports' objects leave the collector's generations, and
a full collection walks only what the process made since (here ~40,000 objects fewer: a
full collection took 15-70 ms with them). The writers' p99 during a sweep with and without
it says what the collector costs them.

``--soak ROUNDS`` instead writes ``checkpoints`` more steps to every workflow and sweeps,
``ROUNDS`` times, and prints the store's bytes after each round (SQLite: with its WAL, also
apart): the same data after every round, so the size should stay flat once warm.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import asyncpg
from scale_fill import fill_histories_postgres, fill_histories_sqlite, fill_postgres, fill_sqlite

import aiocheckpoint
from aiocheckpoint import CheckpointManager, RetentionPolicy, SweepReport
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.queries import encode_cursor
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def build(manager: CheckpointManager, args: argparse.Namespace, first_step: int = 0) -> float:
    """Write every workflow's checkpoints; return the seconds it took."""
    queue = iter(range(args.workflows))

    async def task() -> None:
        for n in queue:
            for step in range(first_step, first_step + args.checkpoints):
                state = {"n": n, "step": step}
                await manager.create_checkpoint(f"wf-{n:07}", step, "agent", "running", state)

    began = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(args.concurrency)))
    return time.perf_counter() - began


async def write_steadily(
    manager: CheckpointManager, args: argparse.Namespace, stop: asyncio.Event
) -> list[float]:
    """``args.writers`` tasks saving until ``stop`` is set; every save's latency in ms."""
    latencies: list[float] = []

    async def writer(k: int) -> None:
        step = 0
        while not stop.is_set():
            began = time.perf_counter()
            # Steps 0-2 over and over: never more than the sweep keeps, so it deletes none.
            await manager.create_checkpoint(f"writer-{k:03}", step % 3, "w", "running", {"k": k})
            latencies.append((time.perf_counter() - began) * 1000)
            step += 1
            await asyncio.sleep(args.writer_pause)

    await asyncio.gather(*(writer(k) for k in range(args.writers)))
    return latencies


async def writers_alone(manager: CheckpointManager, args: argparse.Namespace) -> list[float]:
    """The writers' latencies over ``args.writer_seconds`` with nothing else running."""
    stop = asyncio.Event()
    writing = asyncio.ensure_future(write_steadily(manager, args, stop))
    await asyncio.sleep(args.writer_seconds)
    stop.set()
    return await writing


async def sweep_with_writers(
    manager: CheckpointManager, args: argparse.Namespace, full: list[int]
) -> tuple[SweepReport, float, list[float]]:
    """One sweep while the writers write: its report, its seconds, their latencies.

    ``full`` gets, for each full collection of the garbage collector meanwhile, what it
    collected.
    """

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(info["collected"])

    stop = asyncio.Event()
    writing = asyncio.ensure_future(write_steadily(manager, args, stop))
    began = time.perf_counter()
    gc.callbacks.append(counted)
    try:
        swept = await manager.sweep()
    finally:
        elapsed = time.perf_counter() - began
        gc.callbacks.remove(counted)
        stop.set()
        latencies = await writing
    return swept, elapsed, latencies


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, rounded to 0.01 ms."""
    if len(values) < 2:
        return round(values[0], 2) if values else 0.0
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 2)


def file_bytes(where: Path) -> int:
    """SQLite's files: the database, its WAL and shared-memory index."""
    return sum(p.stat().st_size for p in where.glob("store.db*"))


async def store_bytes(backend: str, where: Path, dsn: str, schema: str) -> int:
    """The store's size on disk: SQLite's files, or the schema's tables with their indexes."""
    if backend == "sqlite":
        return await asyncio.to_thread(file_bytes, where)
    con = await asyncpg.connect(dsn)
    try:
        size = await con.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relkind = 'r'",
            schema,
        )
    finally:
        await con.close()
    return int(size)


def open_store(backend: str, where: Path, dsn: str, schema: str) -> CheckpointStorage:
    if backend == "sqlite":
        return SQLiteCheckpointStorage(where / "store.db")
    return PostgresCheckpointStorage(dsn, schema=schema, max_size=8)


async def drop_schema(dsn: str, schema: str) -> None:
    con = await asyncpg.connect(dsn)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()


async def fill(backend: str, args: argparse.Namespace, where: Path, schema: str) -> float:
    """The store built in SQL (``--fill``): the same histories, no build rate; its seconds."""
    async with CheckpointManager(open_store(backend, where, args.dsn, schema)) as manager:
        record = await template_record(manager)
        await manager.storage.delete("template")
    began = time.perf_counter()
    if backend == "sqlite":
        await asyncio.to_thread(
            fill_histories_sqlite, where / "store.db", args.workflows, args.checkpoints, record
        )
    else:
        await fill_histories_postgres(args.dsn, schema, args.workflows, args.checkpoints, record)
    return time.perf_counter() - began


async def one_backend(backend: str, args: argparse.Namespace, where: Path) -> dict[str, Any]:
    """Build, sweep, sweep again on one backend; the figures of the run."""
    schema = f"bench_scale_{uuid.uuid4().hex[:10]}"
    policy = RetentionPolicy(keep_last=args.keep_last)
    try:
        if args.fill:
            built = await fill(backend, args, where, schema)
        async with CheckpointManager(
            open_store(backend, where, args.dsn, schema), retention=policy
        ) as manager:
            if not args.fill:
                built = await build(manager, args)
            before = await store_bytes(backend, where, args.dsn, schema)
            alone = await writers_alone(manager, args)
            full: list[int] = []
            swept, sweep_s, during = await sweep_with_writers(manager, args, full)
            began = time.perf_counter()
            again = await manager.sweep()
            again_s = time.perf_counter() - began
            after = await store_bytes(backend, where, args.dsn, schema)
    finally:
        if backend == "postgres":
            await drop_schema(args.dsn, schema)
    checkpoints = args.workflows * args.checkpoints
    return {
        "backend": backend,
        "workflows": args.workflows,
        "checkpoints": checkpoints,
        "build_s": round(built, 2),
        "build_per_s": round(checkpoints / built),
        "built_by": "sql" if args.fill else "manager",
        "sweep_s": round(sweep_s, 2),
        "deleted": swept.checkpoints_deleted,
        "deletes_per_s": round(swept.checkpoints_deleted / sweep_s),
        "writers": args.writers,
        "writer_saves_alone": len(alone),
        "writer_p50_ms_alone": percentile(alone, 50),
        "writer_p99_ms_alone": percentile(alone, 99),
        "writer_saves_during_sweep": len(during),
        "writer_p50_ms_during_sweep": percentile(during, 50),
        "writer_p99_ms_during_sweep": percentile(during, 99),
        "writer_p99_ratio": round(percentile(during, 99) / max(percentile(alone, 99), 0.01), 2),
        "full_collections_during_sweep": len(full),
        "nothing_to_delete_s": round(again_s, 2),
        "nothing_to_delete_s_per_100k": round(again_s * 100_000 / args.workflows, 2),
        "deleted_again": again.checkpoints_deleted,
        "bytes_before": before,
        "bytes_after": after,
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "code": str(Path(aiocheckpoint.__file__).parents[2]),
    }


async def soak(backend: str, args: argparse.Namespace, where: Path) -> None:
    """``args.soak`` rounds of steady writes then a sweep; a JSON line per round.

    Each round every workflow gets ``checkpoints`` more steps and the sweep thins it back
    to ``keep_last``: the store holds the same data after every round, so its size on disk
    should stay flat once warm.
    """
    schema = f"bench_soak_{uuid.uuid4().hex[:10]}"
    policy = RetentionPolicy(keep_last=args.keep_last)
    try:
        async with CheckpointManager(
            open_store(backend, where, args.dsn, schema), retention=policy
        ) as manager:
            for round_ in range(1, args.soak + 1):
                await build(manager, args, first_step=(round_ - 1) * args.checkpoints)
                began = time.perf_counter()
                swept = await manager.sweep()
                sweep_s = time.perf_counter() - began
                await asyncio.sleep(1)  # an idle store checkpoints its WAL (SQLite)
                line = {
                    "backend": backend,
                    "round": round_,
                    "sweep_s": round(sweep_s, 2),
                    "deleted": swept.checkpoints_deleted,
                    "bytes_reclaimed": swept.bytes_reclaimed,
                    "bytes": await store_bytes(backend, where, args.dsn, schema),
                    "load_average": [round(x, 1) for x in os.getloadavg()],
                }
                if backend == "sqlite":
                    line["db_bytes"] = (where / "store.db").stat().st_size
                print(json.dumps(line), flush=True)
    finally:
        if backend == "postgres":
            await drop_schema(args.dsn, schema)


async def template_record(manager: CheckpointManager) -> bytes:
    """The stored bytes of one small checkpoint: what the fillers' checkpoints copy."""
    await manager.create_checkpoint("template", 0, "a", "running", {"n": 0})
    stored = await manager.storage.load("template", 0)
    assert stored is not None
    return stored.data


async def timed(calls: int, call: Callable[[int], Awaitable[object]]) -> dict[str, float]:
    """p50 and p99 in ms of ``calls`` awaited calls of ``call(i)``, one at a time."""
    took = []
    for i in range(calls):
        began = time.perf_counter()
        await call(i)
        took.append((time.perf_counter() - began) * 1000)
    return {"p50_ms": percentile(took, 50), "p99_ms": percentile(took, 99)}


async def probe(manager: CheckpointManager, size: int, calls: int) -> dict[str, Any]:
    """The queries' latencies on a store of ``size`` fillers and the probes.

    Pages of 50 unfinished workflows from a random cursor: of tenant ``t1`` (1 in 20 of the
    fillers pass) and of org ``o1`` (1 in 485 pass: a page at 1,000 holds the 2 matches).
    """
    rng = random.Random(size)

    def page(metadata: dict[str, str], span: int) -> Callable[[int], Awaitable[None]]:
        async def call(_i: int) -> None:
            # A cursor the page's ``span`` of ids fits after: a full page where the store
            # holds 50 matches (the smallest store's page is then its first).
            start = f"q-{rng.randrange(max(1, size - span)):07}"
            got = await manager.list_workflow_records(
                "unfinished", metadata=metadata, limit=50, cursor=encode_cursor(start)
            )
            assert len(got) == 50 or got.next_cursor is None

        return call

    async def resume(i: int) -> None:
        assert await manager.get_resume_point(f"p-{i % _PROBES:03}") is not None

    async def claim(_i: int) -> None:
        lease = await manager.claim_workflow("bench")
        assert lease is not None
        await manager.release_lease(lease)

    return {
        "page_of_50": await timed(calls, page({"tenant": "t1"}, 50 * 20)),
        "page_rare": await timed(calls, page({"org": "o1"}, 50 * 485)),
        "get_resume_point": await timed(calls, resume),
        "claim_workflow": await timed(calls, claim),
    }


#: Workflows written through the manager, whose resume points the bench reads.
_PROBES: Final = 100


async def queries(backend: str, args: argparse.Namespace, where: Path) -> None:
    """A store per size of ``args.queries``, probed in turn ``args.rounds`` times; a JSON
    line per size: each query's median p50/p99 over the rounds, and its p99 over the
    smallest size's (the same rounds: the machine's load falls on every size alike)."""
    sizes = [int(x) for x in args.queries.split(",")]
    schemas = {size: f"bench_queries_{uuid.uuid4().hex[:10]}" for size in sizes}
    stores = {size: where / f"size-{size}" for size in sizes}
    fill_s: dict[int, float] = {}
    try:
        for size in sizes:
            stores[size].mkdir()
            store = open_store(backend, stores[size], args.dsn, schemas[size])
            async with CheckpointManager(store) as manager:
                record = await template_record(manager)
                for n in range(_PROBES):
                    await manager.create_checkpoint(f"p-{n:03}", 0, "a", "running", {"n": n})
            began = time.perf_counter()
            if backend == "sqlite":
                await asyncio.to_thread(fill_sqlite, stores[size] / "store.db", 0, size, record)
            else:
                await fill_postgres(args.dsn, schemas[size], 0, size, record)
            fill_s[size] = round(time.perf_counter() - began, 1)
        rounds: dict[int, list[dict[str, Any]]] = {size: [] for size in sizes}
        for r in range(args.rounds):
            for size in sizes if r % 2 == 0 else sizes[::-1]:
                store = open_store(backend, stores[size], args.dsn, schemas[size])
                async with CheckpointManager(store) as manager:
                    rounds[size].append(await probe(manager, size, args.calls))
        medians = {size: _medians(rounds[size]) for size in sizes}
        for size in sizes:
            figures = medians[size]
            for name, got in figures.items():
                got["p99_vs_smallest"] = round(got["p99_ms"] / medians[sizes[0]][name]["p99_ms"], 2)
                full = _first_full(name, sizes)
                if full is not None and full <= size:
                    got["vs_size"] = full
                    for key in ("p50", "p99"):
                        ref = medians[full][name][f"{key}_ms"]
                        got[f"{key}_vs_first_full"] = round(got[f"{key}_ms"] / ref, 2)
            line = {"backend": backend, "workflows": size, "fill_s": fill_s[size], **figures}
            line["rounds"] = args.rounds
            line["load_average"] = [round(x, 1) for x in os.getloadavg()]
            print(json.dumps(line), flush=True)
    finally:
        if backend == "postgres":
            for schema in schemas.values():
                await drop_schema(args.dsn, schema)


#: The ids a page of 50 spans (50 x one in how many pass): smaller stores return a shorter
#: page, which is no measure of a plan's growth with the store.
_SPANS: Final = {"page_of_50": 50 * 20, "page_rare": 50 * 485}


def _first_full(name: str, sizes: list[int]) -> int | None:
    """The smallest size whose ``name`` call returns what the larger ones do (a full page)."""
    return next((size for size in sizes if size >= _SPANS.get(name, 0)), None)


def _medians(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each query's p50 and p99: the median over the rounds."""
    return {
        name: {
            key: round(statistics.median(r[name][key] for r in rounds), 2)
            for key in ("p50_ms", "p99_ms")
        }
        for name in rounds[0]
    }


async def run(args: argparse.Namespace) -> None:
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if args.soak:
                await soak(backend, args, Path(tmp))
            elif args.queries:
                await queries(backend, args, Path(tmp))
            else:
                print(json.dumps(await one_backend(backend, args, Path(tmp))), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--writers", type=int, default=8, help="tasks writing during the sweep")
    parser.add_argument("--writer-pause", type=float, default=0.02, help="seconds between saves")
    parser.add_argument("--writer-seconds", type=float, default=5.0, help="writers alone, first")
    parser.add_argument(
        "--fill", action="store_true", help="build the store in SQL (fast; its rate means little)"
    )
    parser.add_argument("--quick", action="store_true", help="CI's smoke size: 2,000 x 10")
    parser.add_argument(
        "--queries", metavar="SIZES", help="query latencies at these sizes: 1000,100000,1000000"
    )
    parser.add_argument("--calls", type=int, default=300, help="calls per query and size")
    parser.add_argument("--rounds", type=int, default=3, help="probes of every size, in turn")
    parser.add_argument(
        "--soak", type=int, metavar="ROUNDS", help="rounds of writes then a sweep: size per round"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() what start-up made (imports): full collections then walk only the rest",
    )
    args = parser.parse_args()
    if args.quick:
        args.workflows, args.checkpoints, args.writer_seconds = 2_000, 10, 1.0
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
