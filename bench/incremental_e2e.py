"""Workload 4 end to end: CheckpointManager + the file or SQLite store on a real directory.

    PYTHONPATH=src python bench/incremental_e2e.py [--steps 1000] [--zstd] [--dir DIR]
        [--store file|sqlite] [--repeats 5]

Stored size is the sum of file sizes under the store's directory (file store: records,
blobs, marker, hints, locks; SQLite: the database file, its WAL checkpointed by the close).
Every save is a real durable write (fsync).

(a) ``--steps`` checkpoints of a ~1 MB state in which one small key changes per step;
(b) ``--steps`` steps of a chat state whose message list grows by one ~1 KB message;
(c) small-state write throughput, the first save of a ~1 MB and a ~10 MB state (into a store
    that already holds another workflow), and ~10 MB resume time (warm: cached pack
    indexes; cold: a new storage object), incremental vs version-1 records
    (``CheckpointManager(storage, incremental=False)``) on the same
    machine in the same run, wall-clock medians of ``--repeats`` runs, printed as ratios.
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
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from incremental_size import _docs_state, _message

from aiocheckpoint import CheckpointManager
from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.format.tree import TreeParams
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
    v1_path = os.path.join(base, "a-v1")
    async with CheckpointManager(open_store(v1_path), incremental=False) as manager:
        await manager.create_checkpoint("wf", steps - 1, "agent", "running", state)
    cold: dict[str, list[float]] = {path: [], v1_path: []}
    for _ in range(5):
        for where in cold:  # a new storage object: nothing cached, as in a new process
            async with CheckpointManager(open_store(where)) as manager:
                t0 = time.perf_counter()
                point = await manager.get_resume_point("wf")
                cold[where].append(time.perf_counter() - t0)
                assert point is not None and point[0] == steps - 1
    r2, r1 = (statistics.median(cold[where]) for where in (path, v1_path))
    print(
        f"(a) cold resume of the last of them: v1 {_ms(r1)}, incremental {_ms(r2)} "
        f"(ratio {r2 / r1:.2f})"
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


class _Clock:
    """Adds up the wall time a store spends in ``fetch_blobs`` (the reads of a resume) and
    in ``save``/``save_tree`` (the writes of a save, blobs included), by wrapping those
    methods on the instance.
    """

    def __init__(self, storage: Any) -> None:
        self.fetch_seconds = 0.0
        self.save_seconds = 0.0
        for name, attr in (
            ("fetch_blobs", "fetch_seconds"),
            ("save", "save_seconds"),
            ("save_tree", "save_seconds"),
        ):
            setattr(storage, name, self._clocked(attr, getattr(storage, name)))

    def _clocked(self, attr: str, method: Callable[..., Awaitable[Any]]) -> Any:
        async def clocked(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                setattr(self, attr, getattr(self, attr) + time.perf_counter() - t0)

        return clocked


async def first_save(base: str, incremental: bool, docs: int, tag: str) -> tuple[float, float]:
    """The first save of a ``docs`` x ~1 KB state: (wall time, of which in the storage's
    save call). The store already holds another workflow's 20 KB state, so the one-time
    costs of a new store (directories, format marker) are not counted.
    """
    path = os.path.join(base, f"first-{incremental}-{docs}-{tag}")
    state = _docs_state(random.Random(3), docs)
    storage = open_store(path)
    clock = _Clock(storage)
    async with CheckpointManager(storage, incremental=incremental) as manager:
        other = _docs_state(random.Random(4), 20)
        await manager.create_checkpoint("other", 0, "agent", "running", other)
        clock.save_seconds = 0.0
        t0 = time.perf_counter()
        await manager.create_checkpoint("wf", 0, "agent", "running", state)
        elapsed = time.perf_counter() - t0
    shutil.rmtree(path)
    return elapsed, clock.save_seconds


async def big_resume(base: str, incremental: bool, repeats: int) -> tuple[float, float, float]:
    """Resume of a ~10 MB state: (median warm, median cold, median blob-read share of cold).

    Warm: the same storage object each time (its pack indexes cached); cold: a new storage
    object per resume, as a freshly started process would have.
    """
    path = os.path.join(base, f"big-{incremental}")
    state = _docs_state(random.Random(3), 10_000)
    async with CheckpointManager(open_store(path), incremental=incremental) as manager:
        await manager.create_checkpoint("wf", 0, "agent", "running", state)
        warm = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            point = await manager.get_resume_point("wf")
            warm.append(time.perf_counter() - t0)
            assert point is not None and point[1].data["counter"] == 0
    cold, reads = [], []
    for _ in range(repeats):
        storage = open_store(path)
        clock = _Clock(storage)
        async with CheckpointManager(storage, incremental=incremental) as manager:
            t0 = time.perf_counter()
            point = await manager.get_resume_point("wf")
            cold.append(time.perf_counter() - t0)
            reads.append(clock.fetch_seconds)
            assert point is not None and point[1].data["counter"] == 0
    return statistics.median(warm), statistics.median(cold), statistics.median(reads)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


async def part_c(base: str, repeats: int) -> None:
    rates: dict[bool, list[float]] = {inc: [] for inc in (False, True)}
    for _ in range(repeats):
        for inc in (False, True):
            rates[inc].append(await small_writes(base, inc, 300))
    v1, v2 = (statistics.median(rates[inc]) for inc in (False, True))
    print(
        f"(c) small-state writes/s (~1 KB, fsynced): v1 {v1:.0f}, incremental {v2:.0f} "
        f"(incremental/v1 time ratio {v1 / v2:.2f})"
    )
    for docs, label in ((1_000, "1 MB"), (10_000, "10 MB")):
        saves: dict[bool, list[tuple[float, float]]] = {inc: [] for inc in (False, True)}
        for n in range(repeats):
            for inc in (False, True):
                saves[inc].append(await first_save(base, inc, docs, str(n)))
        (w1, s1), (w2, s2) = (
            (
                statistics.median(t for t, _ in saves[inc]),
                statistics.median(s for _, s in saves[inc]),
            )
            for inc in (False, True)
        )
        print(
            f"(c) first save of a {label} state: v1 {_ms(w1)}, incremental {_ms(w2)} "
            f"(ratio {w2 / w1:.2f}); in the storage call: v1 {_ms(s1)}, incremental "
            f"{_ms(s2)} (ratio {s2 / s1:.2f})"
        )
    warm1, cold1, _ = await big_resume(base, False, repeats)
    warm2, cold2, reads2 = await big_resume(base, True, repeats)
    print(
        f"(c) resume of a 10 MB state: warm v1 {_ms(warm1)}, incremental {_ms(warm2)} "
        f"(ratio {warm2 / warm1:.2f}); cold (new storage object) v1 {_ms(cold1)}, "
        f"incremental {_ms(cold2)} (ratio {cold2 / cold1:.2f}), of which blob reads "
        f"{_ms(reads2)}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--zstd", action="store_true")
    parser.add_argument("--dir", default=None, help="where to create the stores (default: tmp)")
    parser.add_argument("--only", default="abc")
    parser.add_argument("--store", choices=("file", "sqlite"), default="file")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure in (c)")
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
            await part_c(base, args.repeats)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
