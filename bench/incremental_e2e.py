"""Workload 4 end to end: CheckpointManager + the file or SQLite store on a real directory.

    PYTHONPATH=src python bench/incremental_e2e.py [--steps 1000] [--zstd] [--dir DIR]
        [--store file|sqlite]

Stored size is the sum of file sizes under the store's directory (file store: records,
blobs, marker, hints, locks; SQLite: the database file, its WAL checkpointed by the close).
Every save is a real durable write (fsync).

(a) ``--steps`` checkpoints of a ~1 MB state in which one small key changes per step;
(b) ``--steps`` steps of a chat state whose message list grows by one ~1 KB message;
(c) small-state write throughput and ~10 MB resume time, incremental vs version-1 records
    (``CheckpointManager(storage, incremental=False)``), wall-clock medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from incremental_size import _docs_state, _message

from aiocheckpoint import CheckpointManager
from aiocheckpoint.incremental import TreeParams
from aiocheckpoint.serde import encode_checkpoint, to_storable
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

STORE = "file"


def open_store(path: str, zstd: bool = False) -> CheckpointStorage:
    """The store under test (``--store``), in directory ``path``."""
    compression = "zstd" if zstd else None
    if STORE == "sqlite":
        os.makedirs(path, exist_ok=True)
        params = TreeParams(compression=compression)
        return SQLiteCheckpointStorage(os.path.join(path, "db.sqlite"), blob_params=params)
    return FileCheckpointStorage(path, compression=compression)


def du(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
    )


def nfiles(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


async def workload_a(base: str, steps: int, zstd: bool) -> None:
    path = os.path.join(base, "a")
    storage = open_store(path, zstd)
    state = _docs_state(random.Random(1), 1000)
    t0 = time.perf_counter()
    async with CheckpointManager(storage) as manager:
        for step in range(steps):
            state["counter"] = step
            await manager.create_checkpoint("wf", step, "agent", "running", state)
        elapsed = time.perf_counter() - t0
        last = await manager.get_checkpoint("wf", steps - 1)
        assert last.state_snapshot.data == to_storable(state)
    size = du(path)
    print(
        f"(a) {steps} checkpoints of a {v1_size(state) / 1e6:.2f} MB state, one key changing: "
        f"stored {size / 1e6:.2f} MB in {nfiles(path)} files "
        f"(v1 would be ~{steps * v1_size(state) / 1e6:.0f} MB); {elapsed:.1f} s, "
        f"{elapsed / steps * 1000:.1f} ms/save"
    )


async def workload_b(base: str, steps: int, zstd: bool) -> None:
    path = os.path.join(base, "b")
    storage = open_store(path, zstd)
    rng = random.Random(2)
    state: dict[str, Any] = {"system": "You are helpful.", "messages": []}
    t0 = time.perf_counter()
    async with CheckpointManager(storage) as manager:
        for step in range(steps):
            state["messages"].append(_message(rng, step))
            await manager.create_checkpoint("chat", step, "agent", "running", state)
        elapsed = time.perf_counter() - t0
        last = await manager.get_checkpoint("chat", steps - 1)
        assert last.state_snapshot.data == state
    size = du(path)
    final = v1_size(state)
    print(
        f"(b) {steps} steps of a chat growing by ~1 KB: final state {final / 1e6:.2f} MB, "
        f"stored {size / 1e6:.2f} MB = {size / final:.2f}x final, {nfiles(path)} files; "
        f"{elapsed:.1f} s"
    )


def v1_size(state: dict[str, Any]) -> int:
    from aiocheckpoint.models import AgentStatus, Checkpoint, StateSnapshot

    snap = StateSnapshot(data=to_storable(state))
    cp = Checkpoint(
        workflow_id="wf", step=0, agent_id="a", status=AgentStatus.RUNNING, state_snapshot=snap
    )
    return len(encode_checkpoint(cp))


async def small_writes(base: str, incremental: bool, n: int) -> float:
    path = os.path.join(base, f"small-{incremental}")
    storage = open_store(path)
    state = {"counter": 0, "notes": "x" * 800, "plan": ["a", "b", "c"]}
    async with CheckpointManager(storage, incremental=incremental) as manager:
        t0 = time.perf_counter()
        for step in range(n):
            state["counter"] = step
            await manager.create_checkpoint("wf", step, "agent", "running", state)
        return n / (time.perf_counter() - t0)


async def big_resume(base: str, incremental: bool, repeats: int) -> tuple[float, float]:
    path = os.path.join(base, f"big-{incremental}")
    storage = open_store(path)
    state = _docs_state(random.Random(3), 10_000)
    async with CheckpointManager(storage, incremental=incremental) as manager:
        t0 = time.perf_counter()
        await manager.create_checkpoint("wf", 0, "agent", "running", state)
        write = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            point = await manager.get_resume_point("wf")
            times.append(time.perf_counter() - t0)
            assert point is not None and point[1].data["counter"] == 0
    return write, statistics.median(times)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--zstd", action="store_true")
    parser.add_argument("--dir", default=None, help="where to create the stores (default: tmp)")
    parser.add_argument("--only", default="abc")
    parser.add_argument("--store", choices=("file", "sqlite"), default="file")
    args = parser.parse_args()
    global STORE
    STORE = args.store
    base = tempfile.mkdtemp(prefix="ackp-e2e-", dir=args.dir)
    try:
        if "a" in args.only:
            await workload_a(base, args.steps, args.zstd)
        if "b" in args.only:
            await workload_b(base, args.steps, args.zstd)
        if "c" in args.only:
            rates = {inc: [] for inc in (False, True)}  # type: dict[bool, list[float]]
            for _ in range(3):
                for inc in (False, True):
                    rates[inc].append(await small_writes(base, inc, 300))
            v1, v2 = (statistics.median(rates[inc]) for inc in (False, True))
            print(
                f"(c) small-state writes/s (~1 KB, fsynced): v1 {v1:.0f}, incremental {v2:.0f} "
                f"(v1/incremental time ratio {v1 / v2:.2f})"
            )
            w1, r1 = await big_resume(base, False, 5)
            w2, r2 = await big_resume(base, True, 5)
            print(
                f"(c) 10 MB state (10k ~1 KB documents): first write v1 {w1 * 1000:.0f} ms, "
                f"incremental {w2 * 1000:.0f} ms; resume v1 {r1 * 1000:.0f} ms, incremental "
                f"{r2 * 1000:.0f} ms (ratio {r2 / r1:.2f})"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
