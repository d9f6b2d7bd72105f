"""FileCheckpointStorage figures: write latency, latest lookup at 10 vs 10,000 steps.

Run: PYTHONPATH=src python bench/file_storage.py [--dir DIR]
Prints figures; asserts nothing. DIR defaults to a temporary directory on the disk that
holds /tmp (use a directory on the disk you care about: fsync cost is the disk's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from aiocheckpoint import CheckpointManager, InMemoryCheckpointStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.names import step_name


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} us"


async def timed(fn: Callable[[], Awaitable[object]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


def summary(label: str, samples: list[float]) -> None:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(f"{label:52s} median {fmt(statistics.median(samples))}  p99 {fmt(p99)}")


async def write_latency(base: Path) -> None:
    store = FileCheckpointStorage(base / "writes")
    manager = CheckpointManager(store)
    small = {"msg": "x" * 900}
    big = {"blob": "x" * (1024 * 1024)}
    counter = iter(range(10**9))
    await manager.create_checkpoint("warm", 0, "a", "completed", small)
    summary(
        "create_checkpoint, ~1 KB state (serial)",
        await timed(
            lambda: manager.create_checkpoint("s", next(counter), "a", "completed", small), 300
        ),
    )
    summary(
        "create_checkpoint, 1 MB state (serial)",
        await timed(
            lambda: manager.create_checkpoint("b", next(counter), "a", "completed", big), 40
        ),
    )
    summary(
        "create_checkpoint, ~1 KB, keep_last=10 (serial)",
        await timed(
            lambda: CheckpointManager(store, max_checkpoints=10).create_checkpoint(
                "k", next(counter), "a", "completed", small
            ),
            300,
        ),
    )
    # Interleaved, so that the disk's mood affects both alike: a save that raises the
    # latest step (hint rewritten + fsynced) against one below it (hint untouched).
    raising: list[float] = []
    lower: list[float] = []
    record = (await store.load("s")).data  # type: ignore[union-attr]
    for i in range(200):
        t0 = time.perf_counter()
        await store.save("h", 10**6 + i, record)
        raising.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await store.save("h", i, record)
        lower.append(time.perf_counter() - t0)
    summary("storage.save raising the latest (3 fsyncs)", raising)
    summary("storage.save below the latest (2 fsyncs)", lower)
    n_tasks, per_task = 100, 10
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for t in range(n_tasks):

            async def run(t: int = t) -> None:
                for step in range(per_task):
                    await manager.create_checkpoint(f"c-{t}", step, "a", "completed", small)

            tg.start_soon(run)
    elapsed = time.perf_counter() - t0
    total = n_tasks * per_task
    print(f"{'100 tasks x 10 saves, ~1 KB, 100 workflows':52s} {total / elapsed:9.0f} saves/s")
    await store.close()


async def lookup(base: Path) -> None:
    memory = InMemoryCheckpointStorage()
    encoder = CheckpointManager(memory)
    for step in range(10_000):
        await encoder.create_checkpoint("wf", step, "a", "completed", {"msg": "x" * 900})
    records = {r.step: r.data for r in await memory.scan("wf")}
    sizes = (10, 10_000)
    stores: dict[int, FileCheckpointStorage] = {}
    first: dict[int, float] = {}
    for history in sizes:
        store = FileCheckpointStorage(base / f"h{history}")
        await store.save("wf", 0, records[0])
        wdir = Path(store.workflow_dir("wf"))
        for step in range(1, history):  # written directly: the bench is about reads
            (wdir / step_name(step)).write_bytes(records[step])
        (wdir / "latest").unlink()  # files written behind the store's back: drop the hint
        await store.close()
        stores[history] = FileCheckpointStorage(base / f"h{history}")
        t0 = time.perf_counter()
        latest = await stores[history].load("wf")  # the hint is missing: one scan
        first[history] = time.perf_counter() - t0
        assert latest is not None and latest.step == history - 1

    async def fresh_load(history: int) -> None:
        async with FileCheckpointStorage(base / f"h{history}") as fresh:
            await fresh.load("wf")  # a new process in the same boot trusts the hint

    async def rebuild(history: int) -> None:
        async with FileCheckpointStorage(base / f"h{history}") as fresh:
            (Path(fresh.workflow_dir("wf")) / "latest").unlink()
            await fresh.load("wf")

    ops: dict[str, Callable[[int], Awaitable[object]]] = {
        "storage.load(wf): latest, hint trusted": lambda h: stores[h].load("wf"),
        "manager.get_latest_checkpoint (+decode/verify)": lambda h: CheckpointManager(
            stores[h]
        ).get_latest_checkpoint("wf"),
        "load latest from a new store object": fresh_load,
        "load latest, hint missing (scan + rebuild)": rebuild,
        "list_checkpoints(limit=10, descending=True)": lambda h: CheckpointManager(
            stores[h]
        ).list_checkpoints("wf", limit=10, descending=True),
        "scan(limit=1, after=history-2)": lambda h: stores[h].scan("wf", after=h - 2, limit=1),
    }
    print(f"{'(medians, interleaved rounds)':52s} {'10 steps':>12s} {'10,000 steps':>14s} ratio")
    print(f"{'first load, no hint yet (one scan)':52s} {fmt(first[10])} {fmt(first[10_000]):>14s}")
    for label, op in ops.items():
        samples: dict[int, list[float]] = {h: [] for h in sizes}
        rounds = 15 if "missing" in label or "list" in label else 200
        for _ in range(rounds):
            for h in sizes:
                t0 = time.perf_counter()
                await op(h)
                samples[h].append(time.perf_counter() - t0)
        a, b = (statistics.median(samples[h]) for h in sizes)
        print(f"{label:52s} {fmt(a)} {fmt(b):>14s} {b / a:5.2f}")
    for store in stores.values():
        await store.close()


def hint_fsync_cost(base: Path) -> None:
    """What the durable hint update adds to a save that raises the latest step."""
    path = base / "hint-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"\0" * 28)
    os.fsync(fd)
    samples = []
    for i in range(200):
        t0 = time.perf_counter()
        os.pwrite(fd, i.to_bytes(28, "big"), 0)
        os.fdatasync(fd)
        samples.append(time.perf_counter() - t0)
    os.close(fd)
    summary("pwrite+fdatasync of the 28-byte hint, in place", samples)


async def main(base: Path) -> None:
    print(f"store on {base}")
    await write_latency(base)
    await lookup(base)
    hint_fsync_cost(base)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix="aiockpt-bench-") as tmp:
            anyio.run(main, Path(tmp))
    else:
        args.dir.mkdir(parents=True, exist_ok=True)
        anyio.run(main, args.dir)
