"""Where a SQLite sweep's CPU goes, the sweep alone: per thread, per stage, and the GC.

    python bench/sweep_profile.py [--workflows 20000] [--checkpoints 10] [--keep-last 3]
                                  [--rounds 1] [--profile N] [--dir DIR]

Each round builds a fresh store in SQL (``bench/scale_fill.py``: ``workflows`` x
``checkpoints`` RUNNING checkpoints), then runs one ``sweep(keep_last=...)`` with nothing
else running and prints one JSON line: the sweep's wall time; each thread's CPU seconds
(``/proc``: the loop's, the read threads', the writer's); the read of histories' and the
slices' own CPU (``time.thread_time`` inside their threads); CPU microseconds per record
read; and the cyclic garbage collector's collections per generation, with the time the
full ones took. ``--profile N`` adds cProfile's N costliest functions (own time) of the
loop thread. Run it with another worktree's virtualenv to compare that code, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scale_fill import fill_histories_sqlite

import aiocheckpoint
from aiocheckpoint import CheckpointManager, RetentionPolicy
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage, sweeps

_TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    cpu: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), f"tid-{tid}")
        kind = name.rsplit("_", 1)[0]
        cpu[kind] = cpu.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / _TICKS
    return cpu


class Stages:
    """The CPU the read of histories and the sweep's slices took in their own threads."""

    def __init__(self) -> None:
        self.cpu = {"read_histories": 0.0, "thin_one": 0.0}
        self.calls = {"read_histories": 0, "thin_one": 0}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[name] += time.thread_time() - began
                self.calls[name] += 1

        return timed


@contextmanager
def staged(stages: Stages) -> Iterator[None]:
    """``sweeps.read_histories`` and ``sweeps.thin_one`` timed while inside."""
    read, thin = sweeps.read_histories, sweeps.thin_one
    sweeps.read_histories = stages.wrap("read_histories", read)  # type: ignore[assignment]
    sweeps.thin_one = stages.wrap("thin_one", thin)  # type: ignore[assignment]
    try:
        yield
    finally:
        sweeps.read_histories, sweeps.thin_one = read, thin  # type: ignore[assignment]


class Collections:
    """The cyclic GC's collections per generation, and the full ones' wall time."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.full_ms: list[float] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.count[info["generation"]] += 1
        if info["generation"] == 2:
            self.full_ms.append((time.perf_counter() - self._began) * 1000)


async def build(path: Path, workflows: int, checkpoints: int) -> None:
    """The store's histories, written in SQL from one template record."""
    async with CheckpointManager(SQLiteCheckpointStorage(path)) as manager:
        await manager.create_checkpoint("template", 0, "a", "running", {"n": 0})
        stored = await manager.storage.load("template", 0)
        assert stored is not None
        await manager.storage.delete("template")
    await asyncio.to_thread(fill_histories_sqlite, path, workflows, checkpoints, stored.data)


async def one_round(args: argparse.Namespace, where: Path) -> dict[str, Any]:
    path = where / "store.db"
    await build(path, args.workflows, args.checkpoints)
    policy = RetentionPolicy(keep_last=args.keep_last)
    stages, collections = Stages(), Collections()
    profile = cProfile.Profile() if args.profile else None
    async with CheckpointManager(SQLiteCheckpointStorage(path), retention=policy) as manager:
        await manager.storage.exists("wf-0000000")  # opened, threads started
        gc.collect()
        before = thread_cpu()
        gc.callbacks.append(collections)
        try:
            with staged(stages):
                if profile is not None:
                    profile.enable()
                began = time.perf_counter()
                report = await manager.sweep()
                wall = time.perf_counter() - began
                if profile is not None:
                    profile.disable()
        finally:
            gc.callbacks.remove(collections)
        after = thread_cpu()
    cpu = {k: round(after[k] - before.get(k, 0.0), 3) for k in after if k in before or after[k]}
    records = args.workflows * args.checkpoints
    line: dict[str, Any] = {
        "workflows": args.workflows,
        "sweep_s": round(wall, 3),
        "deleted": report.checkpoints_deleted,
        "thread_cpu_s": cpu,
        "us_per_record": {k: round(v * 1e6 / records, 2) for k, v in cpu.items() if v},
        "stage_cpu_s": {k: round(v, 3) for k, v in stages.cpu.items()},
        "stage_calls": stages.calls,
        "gc_collections": collections.count,
        "gc_full_ms_sum": round(sum(collections.full_ms), 1),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "code": str(Path(aiocheckpoint.__file__).parent.parent.parent),
    }
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.profile)
        line["profile"] = out.getvalue().splitlines()
    return line


async def run(args: argparse.Namespace) -> None:
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            line = await one_round(args, Path(tmp))
        profile = line.pop("profile", None)
        print(json.dumps(line), flush=True)
        if profile:
            print("\n".join(profile), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=20_000)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="cProfile's top N (loop thread)")
    parser.add_argument("--dir", help="where the SQLite file goes (default: the temp dir)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
