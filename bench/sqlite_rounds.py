"""The anatomy of a C=100 round: ours-sqlite and raw-sqlite-100 alternating in one process.

    python bench/sqlite_rounds.py [--seconds S] [--rounds N]

A round of a group commit is the writer's batch (in its thread: BEGIN, the saves, COMMIT
with its fsync) plus the gap until the next batch starts (the event loop waking the
batch's callers and taking their next saves). For each system and run, prints the
throughput, the p99, the loop thread's CPU per checkpoint, the number of batches and their
mean size, and the batch and gap times (p50 and p90, ms). Both systems run
``bench/run.py``'s write workload (``bench.workloads``) on the ~1 KB state, one after the
other in each round, so their ratio holds up better than two separate runs on a loaded
machine. See bench/NOTES.md "Small states at C=100".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if (ROOT / "src").is_dir() and str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))  # measure this checkout, not an installed copy

from aiocheckpoint.storage.sqlite import writer as sqlite_writer  # noqa: E402
from bench import systems  # noqa: E402
from bench.data import small_state  # noqa: E402
from bench.workloads import _timed_writes  # noqa: E402

SYSTEMS = ("ours-sqlite", "raw-sqlite-100")


class _Batches:
    """Times each batch a writer thread runs, and the gap before it."""

    def __init__(self) -> None:
        self.busy: list[float] = []
        self.gaps: list[float] = []
        self.sizes: collections.Counter[int] = collections.Counter()
        self.last_end: float | None = None

    def reset(self) -> None:
        self.busy.clear()
        self.gaps.clear()
        self.sizes.clear()
        self.last_end = None

    def wrap(self, run: Callable[..., Any]) -> Callable[..., Any]:
        def timed(owner: Any, batch: Sequence[Any]) -> Any:
            start = time.perf_counter()
            if self.last_end is not None:
                self.gaps.append(start - self.last_end)
            self.sizes[len(batch)] += 1
            try:
                return run(owner, batch)
            finally:
                self.last_end = time.perf_counter()
                self.busy.append(self.last_end - start)

        return timed


def _ms(times: list[float], share: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] * 1e3 if ordered else 0.0


async def _run(name: str, probe: _Batches, seconds: float, tag: str) -> str:
    classes = {cls.name: cls for cls in systems.ALL_SYSTEMS}
    with tempfile.TemporaryDirectory() as workdir:
        system = classes[name](Path(workdir), systems.Env(Path(workdir), ""))
        await system.open()
        try:
            await _timed_writes(system, 100, 0.3, small_state, f"warm{tag}")
            probe.reset()
            cpu = time.thread_time()
            run = await _timed_writes(system, 100, seconds, small_state, tag)
            cpu = (time.thread_time() - cpu) / run["checkpoints"] * 1e6
        finally:
            await system.close()
    batches = sum(probe.sizes.values())
    mean = run["checkpoints"] / max(batches, 1)
    return (
        f"{name:15s} per_s {run['per_s']:7.0f}  p99 {run['p99_ms']:6.1f} ms  "
        f"loop {cpu:5.1f} us/ckpt  batches {batches} (mean {mean:.1f})"
        f"  batch p50/p90 {_ms(probe.busy, 0.5):.2f}/{_ms(probe.busy, 0.9):.2f} ms"
        f"  gap p50/p90 {_ms(probe.gaps, 0.5):.2f}/{_ms(probe.gaps, 0.9):.2f} ms"
    )


async def main(seconds: float, rounds: int) -> None:
    """Alternate the two systems ``rounds`` times; one line each."""
    probe = _Batches()
    sqlite_writer.Writer.run_batch = probe.wrap(sqlite_writer.Writer.run_batch)  # type: ignore[method-assign]
    systems._RawSQLite._write = probe.wrap(systems._RawSQLite._write)  # type: ignore[method-assign]
    for repeat in range(rounds):
        for name in SYSTEMS:
            print(await _run(name, probe, seconds, f"r{repeat}"), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.rounds))
