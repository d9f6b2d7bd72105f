"""A/B: small-state write throughput of SQLiteCheckpointStorage in two source trees.

    python bench/sqlite_ab.py SRC_A SRC_B [--rounds 5] [--n 600] [--yield]

Each round runs one child process per tree, alternating (A, B, B, A, ...), each writing
~1 KB states through ``CheckpointManager`` to a fresh database at C=1 (one workflow, back to
back) and C=100 (100 workflows concurrently); with ``--yield`` each writer yields to the loop
between its saves, as ``bench/run.py``'s write workload (and a real workflow) does. Prints
medians and the B/A ratio. Used to check
that a change (e.g. the blob schema) leaves the small-write path as fast as before.
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
import asyncio, json, os, sys, time
from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

async def run(path, c, n):
    state = {"counter": 0, "notes": "x" * 800, "plan": ["a", "b", "c"]}
    async with CheckpointManager(SQLiteCheckpointStorage(path), max_checkpoints=5) as m:
        async def writer(w):
            for step in range(n // c):
                state_now = {**state, "counter": step}
                await m.create_checkpoint(f"wf-{w}", step, "a", "running", state_now)
                if YIELD:
                    await asyncio.sleep(0)
        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(c)))
        return n / (time.perf_counter() - t0)

d, n, YIELD = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
out = {c: asyncio.run(run(os.path.join(d, f"c{c}.db"), c, n)) for c in (1, 100)}
print(json.dumps(out))
"""


def once(src: str, n: int, yields: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ackp-ab-") as d:
        env = {**os.environ, "PYTHONPATH": src}
        out = subprocess.run(
            [sys.executable, "-c", CHILD, d, str(n), str(int(yields))],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--yield", dest="yields", action="store_true")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    started = time.perf_counter()
    for r in range(args.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        for side in order:
            runs[side].append(once(getattr(args, side), args.n, args.yields))
    for c in ("1", "100"):
        a = statistics.median(run[c] for run in runs["a"])
        b = statistics.median(run[c] for run in runs["b"])
        print(f"C={c}: A {a:.0f} ckpt/s, B {b:.0f} ckpt/s, B/A {b / a:.2f}")
    print(f"({args.rounds} rounds, {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
