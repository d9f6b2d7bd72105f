"""A/B/...: small-state write throughput of the database stores in several source trees.

    python bench/write_ab.py SRC [SRC ...] [--backend sqlite|postgres] [--rounds 5]
        [--seconds 1.0] [--concurrency 1,10,100] [--dsn DSN]

Each round runs one child process per tree, in an order rotated every round (so that no tree
always runs first or last on a shared machine), each writing ~1 KB states through
``CheckpointManager`` (``create_checkpoint`` with its step info, as ``bench/run.py``'s write
workload does) to a fresh store for ``--seconds`` at each concurrency: C workflows writing
back to back, each yielding to the loop between its saves. A SQLite store is a fresh file,
a PostgreSQL one a fresh schema (dropped afterwards). Prints the median checkpoints/s of
each tree, its ratio to the first tree's, and every round's figures (their spread).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = """
import asyncio, json, os, sys, time, uuid
from aiocheckpoint import CheckpointManager

backend, where, seconds, concurrencies = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]

def storage(c):
    if backend == "sqlite":
        from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
        return SQLiteCheckpointStorage(os.path.join(where, f"c{c}.db")), None
    from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
    schema = f"ab_{uuid.uuid4().hex[:12]}"
    return PostgresCheckpointStorage(where, schema=schema), schema

async def drop(schema):
    import asyncpg
    con = await asyncpg.connect(where)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()

async def run(c):
    state = {"counter": 0, "notes": "x" * 800, "plan": ["a", "b", "c"]}
    store, schema = storage(c)
    try:
        async with CheckpointManager(store) as m:
            wfs = [f"wf-{w:04d}" for w in range(c)]
            await asyncio.gather(*(m.create_checkpoint(w, 0, "a", "completed", state) for w in wfs))
            done = 0
            deadline = time.perf_counter() + seconds

            async def writer(w):
                nonlocal done
                step = 1
                while time.perf_counter() < deadline:
                    await m.create_checkpoint(w, step, "a", "completed", {**state, "counter": step})
                    done += 1
                    step += 1
                    await asyncio.sleep(0)

            t0 = time.perf_counter()
            await asyncio.gather(*(writer(w) for w in wfs))
            return done / (time.perf_counter() - t0)
    finally:
        if schema is not None:
            await drop(schema)

print(json.dumps({c: asyncio.run(run(int(c))) for c in concurrencies.split(",")}))
"""


def once(src: str, args: argparse.Namespace) -> dict[str, float]:
    """One child process writing with the package of ``src``: checkpoints/s per C."""
    with tempfile.TemporaryDirectory(prefix="ackp-wab-") as d:
        where = d if args.backend == "sqlite" else args.dsn
        env = {**os.environ, "PYTHONPATH": src}
        command = [sys.executable, "-c", CHILD, args.backend, where, str(args.seconds)]
        done = subprocess.run(
            [*command, args.concurrency], env=env, check=False, capture_output=True, text=True
        )
        if done.returncode != 0:
            sys.exit(f"the child of {src} failed:\n{done.stderr[-2000:]}")
        out = done.stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    """Parse the arguments, run the trees in rotated order, print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="source directories (the first is the base)")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--concurrency", default="1,10,100")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    runs: list[list[dict[str, float]]] = [[] for _ in args.trees]
    started = time.perf_counter()
    for r in range(args.rounds):
        for i in range(len(args.trees)):
            n = (i + r) % len(args.trees)
            runs[n].append(once(args.trees[n], args))
    print(f"{args.backend}, {args.rounds} rounds of {args.seconds} s, load {os.getloadavg()}")
    for c in args.concurrency.split(","):
        base = statistics.median(run[c] for run in runs[0])
        for tree, tree_runs in zip(args.trees, runs, strict=True):
            median = statistics.median(run[c] for run in tree_runs)
            spread = ", ".join(f"{run[c]:.0f}" for run in tree_runs)
            print(f"C={c:>3} {tree:40} {median:8.0f}/s {median / base:5.2f}x  [{spread}]")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
