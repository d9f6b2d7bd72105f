"""Python's full (generation-2) garbage collections during ``bench/run.py``'s write workload.

Not a test: it prints one JSON line per run. With C workflows writing the ~1 KB state back
to back (``bench.workloads``' write workload), it counts through ``gc.callbacks`` the
full collections per 10,000 checkpoints and their event-loop-thread CPU time, and with
``--promoted`` the objects the collector moved into generation 2 per checkpoint (each young
collection of generation 1 promotes what survived it; a full collection runs once those
exceed a quarter of the objects already there). Counting promotions walks generation 2 at
every generation-1 collection, so the other figures are taken without it unless asked.

``--freeze`` calls ``gc.freeze()`` after the warm-up, as an application may after its
start-up (bench/NOTES.md "Garbage collection pauses"): the full collections then skip
every object that existed by then.

Usage: ``python bench/gc_pauses.py [--systems ours-sqlite,ours-memory] [--seconds S]
[--repeats N] [--concurrency C] [--promoted] [--freeze]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if (ROOT / "src").is_dir() and str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))  # measure this checkout, not an installed copy

from bench.data import small_state  # noqa: E402
from bench.systems import ALL_SYSTEMS, Env  # noqa: E402
from bench.workloads import _timed_writes, opened  # noqa: E402


class _Collections:
    """A ``gc.callbacks`` hook: full collections' CPU times, objects promoted to gen 2."""

    def __init__(self, promoted: bool) -> None:
        self.counting = promoted
        self.full_ms: list[float] = []
        self.promoted = 0
        self._started = 0.0
        self._old = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if phase == "start":
            self._started = time.thread_time()
            if generation == 1 and self.counting:
                self._old = len(gc.get_objects(2))
        elif generation == 2:
            self.full_ms.append((time.thread_time() - self._started) * 1e3)
        elif generation == 1 and self.counting:
            self.promoted += len(gc.get_objects(2)) - self._old


async def measure(name: str, args: argparse.Namespace) -> None:
    """Warm up one system, then print one line per timed run."""
    system_cls = next(s for s in ALL_SYSTEMS if s.name == name)
    with tempfile.TemporaryDirectory() as root:
        await _runs(system_cls, Env(pg_dsn=args.dsn, root=Path(root)), args)


async def _runs(system_cls: Any, env: Env, args: argparse.Namespace) -> None:
    name = system_cls.name
    async with opened(system_cls, env) as system:
        await _timed_writes(system, args.concurrency, 0.3, small_state, "warm")
        if args.freeze:
            gc.collect()
            gc.freeze()
        for repeat in range(args.repeats):
            gc.collect()
            hook = _Collections(args.promoted)
            gc.callbacks.append(hook)
            try:
                run = await _timed_writes(
                    system, args.concurrency, args.seconds, small_state, f"r{repeat}"
                )
            finally:
                gc.callbacks.remove(hook)
            saves = run["checkpoints"]
            figures = {
                "system": name,
                "C": args.concurrency,
                "frozen": args.freeze,
                "checkpoints": saves,
                "per_s": round(run["per_s"]),
                "p99_ms": round(run["p99_ms"], 1),
                "full_per_10k": round(len(hook.full_ms) * 1e4 / saves, 2),
                "full_cpu_ms": [round(ms, 1) for ms in hook.full_ms],
                "tracked": len(gc.get_objects()),
            }
            if args.promoted:
                figures["promoted_per_save"] = round(hook.promoted / saves, 2)
            print(json.dumps(figures), flush=True)
        if args.freeze:
            gc.unfreeze()


def main() -> None:
    """Parse arguments and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="ours-sqlite,ours-memory")
    parser.add_argument("--seconds", type=float, default=5.0, help="per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--promoted", action="store_true", help="count promotions (slower)")
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() after the warm-up")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    for name in args.systems.split(","):
        asyncio.run(measure(name, args))


if __name__ == "__main__":
    main()
