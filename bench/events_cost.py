"""What the event history costs: saves, status changes and whole runs, this tree vs another.

    python bench/events_cost.py --base-src /path/to/other/checkout/src [--rounds N] [--n N]

Runs the same timed operations in a subprocess of each tree, alternately (base, head,
base, head, ...), ``--rounds`` times, so both see the same machine and the same noise, then
prints each figure's median per side and the ratio head / base (below 1: head is faster).
Each subprocess imports aiocheckpoint from its tree (``PYTHONPATH``) and measures, on the
in-memory, SQLite and PostgreSQL stores:

* ``save``: ``create_checkpoint`` of a ~1 KB state (a plain save: no event on either side);
* ``status``: ``mark_workflow`` paused and back (head: each appends its event);
* ``run``: a whole ``ResumableWorkflow`` run of one workflow: lease, two steps, finish
  (head: the finish appends ``completed``).

Figures are microseconds of this process's CPU time (every thread: the loop and the
SQLite writer; not the PostgreSQL server's) per operation, one at a time: on a loaded
machine they hold up far better than wall-clock time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

DSN = os.environ.get("AIOCHECKPOINT_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")
STATE = {"notes": "x" * 600, "items": list(range(60)), "plan": {"a": 1, "b": [1, 2, 3]}}


async def _measure(kind: str, n: int, where: Path) -> dict[str, float]:
    from aiocheckpoint import CheckpointManager, ResumableWorkflow, WorkflowStatus, open_storage

    schema = f"bench_ev_{uuid.uuid4().hex[:12]}"
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite://{where}/ev-{uuid.uuid4().hex[:8]}.db",
        "postgres": f"{DSN}?schema={schema}",
    }[kind]
    figures: dict[str, float] = {}
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.create_checkpoint("warm", 0, "a", "completed", STATE)
        started = time.process_time()
        for step in range(n):
            await manager.create_checkpoint("saves", step, "a", "completed", STATE)
        figures["save"] = (time.process_time() - started) / n * 1e6
        await manager.register_workflow("toggle")
        started = time.process_time()
        for _ in range(n // 2):
            await manager.mark_workflow("toggle", WorkflowStatus.PAUSED)
            await manager.mark_workflow("toggle", WorkflowStatus.UNFINISHED)
        figures["status"] = (time.process_time() - started) / (2 * (n // 2)) * 1e6
        runs = max(n // 4, 1)
        started = time.process_time()
        for i in range(runs):
            async with ResumableWorkflow(f"run-{i}", manager, STATE, lease_owner="r") as wf:
                async with wf.step(0, agent_id="a"):
                    pass
                async with wf.step(1, agent_id="b"):
                    pass
        figures["run"] = (time.process_time() - started) / runs * 1e6
    if kind == "postgres":
        import asyncpg

        con = await asyncpg.connect(DSN)
        try:
            await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await con.close()
    return figures


def child(n: int) -> None:
    """Measure in this process (the tree on ``PYTHONPATH``); one JSON line per backend."""
    with tempfile.TemporaryDirectory() as where:
        for kind in ("memory", "sqlite", "postgres"):
            figures = asyncio.run(_measure(kind, n, Path(where)))
            print(json.dumps({"backend": kind, **figures}))


def side(src: Path, n: int, script: str = __file__) -> dict[tuple[str, str], float]:
    """One subprocess run of ``script --child`` with the tree whose package is under ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, script, "--child", "--n", str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"the run of {src} failed:\n{done.stderr[-2000:]}")
    found: dict[tuple[str, str], float] = {}
    for line in done.stdout.splitlines():
        record: dict[str, Any] = json.loads(line)
        backend = record.pop("backend")
        for name, value in record.items():
            found[(backend, name)] = value
    return found


def main() -> None:
    """Parse the arguments; alternate the two trees; print medians and ratios."""
    command(child, __file__, rounds=5, n=400)


def command(measure: Callable[[int], None], script: str, *, rounds: int, n: int) -> None:
    """A side-by-side bench's command line: ``--child`` runs ``measure``, else :func:`compare`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-src", type=Path, help="the other tree's src directory")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--n", type=int, default=n, help="operations per figure")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args.n)
        return
    if args.base_src is None:
        parser.error("--base-src is required")
    compare(args.base_src, args.rounds, args.n, script)


def compare(base_src: Path, rounds: int, n: int, script: str) -> None:
    """Run ``script``'s child with each tree, alternately; print medians and ratios."""
    head_src = Path(__file__).resolve().parent.parent / "src"
    runs: dict[str, list[dict[tuple[str, str], float]]] = {"base": [], "head": []}
    for _ in range(rounds):
        runs["base"].append(side(base_src, n, script))
        runs["head"].append(side(head_src, n, script))
    print(f"load average {os.getloadavg()[0]:.1f}; {rounds} rounds of {n} ops")
    print(f"{'backend':<10}{'op':<8}{'base us':>10}{'head us':>10}{'head/base':>11}")
    for key in sorted(runs["base"][0]):
        base = statistics.median(r[key] for r in runs["base"])
        head = statistics.median(r[key] for r in runs["head"])
        print(f"{key[0]:<10}{key[1]:<8}{base:>10.1f}{head:>10.1f}{head / base:>11.3f}")


if __name__ == "__main__":
    main()
