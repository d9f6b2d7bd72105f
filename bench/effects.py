"""Durable effects on SQLite at C=100: what an effect costs, and how it batches.

    python bench/effects.py [--rounds 3] [--steps 10] [--concurrency 100] [--tiny]

Each round runs, in this one process and alternating their order, three rows on fresh
databases, each with ``concurrency`` workflows running at once:

* ``plain``: steps with no effect (each step: one checkpoint);
* ``effects``: steps with 3 effects each (each step: 3 x (intent + result) + a checkpoint);
* ``journal``: effects only, many in one long step per workflow (no checkpoint between).

Prints one JSON line per row and round, then the medians: steps/s of ``plain`` and
``effects`` and their time ratio (a step with 3 effects over one without), and effects/s
with checkpoints (``effects``) and without (``journal``). ``commits`` is the number of
SQLite transactions the row took: far fewer than its writes when they batch. Timings are
ratios within one run: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiocheckpoint import CheckpointManager, ResumableWorkflow
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

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


async def measure(name: str, path: Path, concurrency: int, steps: int) -> dict[str, object]:
    store = SQLiteCheckpointStorage(path)
    async with CheckpointManager(store, max_checkpoints=5) as manager:
        await store.open()
        run = ROWS[name]

        async def one(w: int) -> int:
            async with ResumableWorkflow(f"wf-{w}", manager, {"notes": "x" * 500}) as wf:
                return await run(wf, steps)

        before = store._writer.commits
        started = time.perf_counter()
        made = sum(await asyncio.gather(*(one(w) for w in range(concurrency))))
        seconds = time.perf_counter() - started
        commits = store._writer.commits - before
    return {
        "row": name,
        "seconds": seconds,
        "steps_per_s": concurrency * steps / seconds if name != "journal" else None,
        "effects_per_s": made / seconds if made else None,
        "commits": commits,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--tiny", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.steps, args.concurrency = 1, 2, 5
    results: dict[str, list[dict[str, object]]] = {name: [] for name in ROWS}
    with tempfile.TemporaryDirectory(prefix="ackp-fx-") as tmp:
        for r in range(args.rounds):
            order = list(ROWS) if r % 2 == 0 else list(reversed(ROWS))
            for name in order:
                path = Path(tmp) / f"{name}-{r}.db"
                row = asyncio.run(measure(name, path, args.concurrency, args.steps))
                results[name].append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps(summary(results)))


def summary(results: dict[str, list[dict[str, object]]]) -> dict[str, object]:
    def median(name: str, field: str) -> float:
        return statistics.median(float(row[field]) for row in results[name])  # type: ignore[arg-type]

    return {
        "summary": "sqlite",
        "plain_steps_per_s": median("plain", "steps_per_s"),
        "effects_steps_per_s": median("effects", "steps_per_s"),
        "step_with_3_effects_over_plain": median("plain", "steps_per_s")
        / median("effects", "steps_per_s"),
        "effects_per_s_with_checkpoints": median("effects", "effects_per_s"),
        "effects_per_s_without_checkpoints": median("journal", "effects_per_s"),
        "commits": {name: median(name, "commits") for name in ROWS},
    }


if __name__ == "__main__":
    main()
