"""Durable effects at C=100, per durable backend: what an effect costs, and how it batches.

    python bench/effects.py [--backends sqlite,file,postgres] [--rounds 3] [--steps 10]
                            [--concurrency 100] [--dsn DSN] [--tiny]

For each backend, each round runs, in this one process and alternating their order, three
rows on fresh stores (a new database, directory or PostgreSQL schema), each with
``concurrency`` workflows running at once:

* ``plain``: steps with no effect (each step: one checkpoint);
* ``effects``: steps with 3 effects each (each step: 3 x (intent + result) + a checkpoint);
* ``journal``: effects only, many in one long step per workflow (no checkpoint between).

Prints one JSON line per row and round, then per backend the medians: steps/s of
``plain`` and ``effects`` and their time ratio (a step with 3 effects over one without), and
effects/s with checkpoints (``effects``) and without (``journal``). ``commits`` is the
number of transactions the row took (SQLite commits, PostgreSQL batches; None for the file
store): far fewer than its writes when they batch. Timings are ratios within one run: the
machine is shared.
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
from pathlib import Path
from typing import Any

from aiocheckpoint import CheckpointManager, CheckpointStorage, ResumableWorkflow
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

BACKENDS = ("sqlite", "file", "postgres")
DSN = "postgresql://postgres@127.0.0.1:5432/test"

Row = Callable[[ResumableWorkflow, int], Awaitable[int]]


async def tool(n: int) -> dict[str, int]:
    """A tool call that returns at once (the bench measures the journal, not the tool)."""
    return {"n": n}


async def plain(wf: ResumableWorkflow, steps: int) -> int:
    for step in range(steps):
        async with wf.step(step, agent_id="agent"):
            wf.state.set("step", step)
    return 0


async def effects(wf: ResumableWorkflow, steps: int) -> int:
    for step in range(steps):
        async with wf.step(step, agent_id="agent"):
            for n in range(3):
                await wf.effect(f"tool-{n}", tool, n)
            wf.state.set("step", step)
    return 3 * steps


async def journal(wf: ResumableWorkflow, steps: int) -> int:
    async with wf.step(0, agent_id="agent"):
        for n in range(3 * steps):
            await wf.effect(f"tool-{n}", tool, n)
    return 3 * steps


ROWS: dict[str, Row] = {"plain": plain, "effects": effects, "journal": journal}


def open_store(backend: str, where: Path, dsn: str) -> CheckpointStorage:
    """A fresh store of ``backend`` (a PostgreSQL schema named after ``where``)."""
    if backend == "sqlite":
        return SQLiteCheckpointStorage(where.with_suffix(".db"))
    if backend == "file":
        return FileCheckpointStorage(where)
    return PostgresCheckpointStorage(dsn, schema=f"bench_fx_{where.name}", max_size=8)


def commits(store: CheckpointStorage) -> int | None:
    """How many transactions the store has committed (None: it does not count them)."""
    if isinstance(store, SQLiteCheckpointStorage):
        return int(store._writer.commits)
    if isinstance(store, PostgresCheckpointStorage):
        return store.stats.batches
    return None


async def drop(store: CheckpointStorage, dsn: str) -> None:
    if isinstance(store, PostgresCheckpointStorage):
        import asyncpg

        con = await asyncpg.connect(dsn)
        try:
            await con.execute(f'DROP SCHEMA IF EXISTS "{store.schema}" CASCADE')
        finally:
            await con.close()


async def measure(
    name: str, store: CheckpointStorage, concurrency: int, steps: int, dsn: str
) -> dict[str, Any]:
    async with CheckpointManager(store, max_checkpoints=5) as manager:
        await store.exists("warm-up")  # opened (and migrated) before the clock starts
        run = ROWS[name]

        async def one(w: int) -> int:
            async with ResumableWorkflow(f"wf-{w}", manager, {"notes": "x" * 500}) as wf:
                return await run(wf, steps)

        before = commits(store)
        started = time.perf_counter()
        made = sum(await asyncio.gather(*(one(w) for w in range(concurrency))))
        seconds = time.perf_counter() - started
        after = commits(store)
    await drop(store, dsn)
    return {
        "row": name,
        "seconds": seconds,
        "steps_per_s": concurrency * steps / seconds if name != "journal" else None,
        "effects_per_s": made / seconds if made else None,
        "commits": None if after is None or before is None else after - before,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--tiny", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.steps, args.concurrency = 1, 2, 5
    backends = [b for b in args.backends.split(",") if b]
    for backend in backends:
        if backend not in BACKENDS:
            parser.error(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        backend: {name: [] for name in ROWS} for backend in backends
    }
    with tempfile.TemporaryDirectory(prefix="ackp-fx-") as tmp:
        for r in range(args.rounds):
            for backend in backends:
                order = list(ROWS) if r % 2 == 0 else list(reversed(ROWS))
                for name in order:
                    where = Path(tmp) / f"{name}_{r}_{uuid.uuid4().hex[:8]}"
                    store = open_store(backend, where, args.dsn)
                    row = asyncio.run(measure(name, store, args.concurrency, args.steps, args.dsn))
                    results[backend][name].append(row)
                    print(json.dumps({"backend": backend, **row}), flush=True)
    for backend in backends:
        print(json.dumps(summary(backend, results[backend])))


def summary(backend: str, results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def median(name: str, field: str) -> float:
        return statistics.median(float(row[field]) for row in results[name])

    counted = all(row["commits"] is not None for rows in results.values() for row in rows)
    return {
        "summary": backend,
        "plain_steps_per_s": median("plain", "steps_per_s"),
        "effects_steps_per_s": median("effects", "steps_per_s"),
        "step_with_3_effects_over_plain": median("plain", "steps_per_s")
        / median("effects", "steps_per_s"),
        "effects_per_s_with_checkpoints": median("effects", "effects_per_s"),
        "effects_per_s_without_checkpoints": median("journal", "effects_per_s"),
        "commits": {name: median(name, "commits") for name in ROWS} if counted else None,
    }


if __name__ == "__main__":
    main()
