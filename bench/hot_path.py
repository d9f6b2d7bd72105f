"""Where a small checkpoint's time goes: the manager on the event loop and the SQLite round.

Not a test: it prints figures (one JSON line each, then a summary). CPU figures are
``time.thread_time()`` of the event-loop thread, so they hold up better than wall-clock
ones on a loaded machine; compare them between two checkouts run one after the other.

* ``manager``: ``create_checkpoint`` of the ~1 KB bench state over a storage whose ``save``
  returns at once: validation, the state copy, the models, the encoding. Then each of
  those parts alone.
* ``loop C=N`` (memory, sqlite): loop-thread CPU per checkpoint with N workflows writing back
  to back, yielding once between checkpoints as ``bench/run.py``'s write workload does.
* ``encryption``: the ~1 KB write on the memory backend and SQLite throughput at C=100,
  plain and encrypted (``docs/encryption.md``) alternately in one run, and their ratios.
* ``encrypted-incremental``: a growing ~2 MB chat saved incrementally to SQLite, plain and
  encrypted alternately: wall and loop-CPU time per save, bytes stored, the read back (least of 5).
* ``sqlite round``: at C=100 the share of wall time the loop sat idle in ``epoll`` (waiting
  for the writer thread), the writer's busy share, the batch sizes, and the writer's phases
  per batch (BEGIN, applying the saves, COMMIT with its fsync, the hand-over gap between
  two batches) as p50/p99/max.

Usage: ``python bench/hot_path.py [--seconds S] [--dir DIR] [--only SECTION]`` (SECTION:
``encryption`` or ``encrypted-incremental``)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import selectors
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if (ROOT / "src").is_dir() and str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))  # measure this checkout, not an installed copy

from aiocheckpoint import CheckpointManager, Keyring, open_storage  # noqa: E402
from aiocheckpoint.codec.copy import storable_copy  # noqa: E402
from aiocheckpoint.codec.v1 import encode_checkpoint  # noqa: E402
from aiocheckpoint.models import (  # noqa: E402
    AgentStatus,
    Checkpoint,
    StateSnapshot,
    StateVersion,
    built,
    utcnow,
)
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage  # noqa: E402
from aiocheckpoint.storage.sqlite import writer as sqlite_writer  # noqa: E402
from bench.data import small_state  # noqa: E402
from bench.workloads import _timed_writes  # noqa: E402


def emit(**figures: Any) -> None:
    """One JSON line of figures."""
    print(json.dumps(figures), flush=True)


class _NullStorage(InMemoryCheckpointStorage):
    async def save(self, workflow_id: str, step: int, data: bytes, **_: Any) -> None:
        self.last = data


def _cpu_us(fn: Callable[[], object], number: int) -> float:
    """Best of five: thread CPU microseconds per call."""
    runs = timeit.repeat(fn, number=number, repeat=5, timer=time.thread_time)
    return min(runs) / number * 1e6


async def manager_parts() -> None:
    """The manager's synchronous work per checkpoint, whole and in parts."""
    manager = CheckpointManager(_NullStorage())
    state = small_state(3)
    runs = []
    for _ in range(5):
        start = time.thread_time()
        for step in range(5000):
            await manager.create_checkpoint("wf-0001", step, "bench", "completed", state)
        runs.append((time.thread_time() - start) / 5000 * 1e6)
    emit(figure="manager create_checkpoint (save returns at once)", cpu_us=round(min(runs), 2))
    checkpoint = Checkpoint(
        workflow_id="wf-0001",
        step=3,
        agent_id="bench",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data=state),
    )
    fields = {"version": 0, "timestamp": utcnow(), "agent_id": None, "changed_fields": []}
    parts: Sequence[tuple[str, Callable[[], object]]] = (
        ("storable_copy (validated copy of the state)", lambda: storable_copy(state)),
        (
            "encode_checkpoint (body, orjson, CRC-32)",
            lambda: encode_checkpoint(checkpoint, finite=True),
        ),
        ("one model built without validation", lambda: built(StateVersion, **fields)),
        ("utcnow", utcnow),
    )
    for name, fn in parts:
        emit(figure=f"manager part: {name}", cpu_us=round(_cpu_us(fn, 20000), 2))


class _ManagerSaves:
    """What ``bench.workloads`` drives: the ``ours-*`` systems' ``save``, on one manager."""

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        await self.manager.create_checkpoint(wf, step, "bench", "completed", state)


async def _writers(
    manager: CheckpointManager, concurrency: int, seconds: float, tag: str
) -> dict[str, float]:
    """``bench/run.py``'s write workload, plus the loop thread's CPU per checkpoint."""
    wall, cpu = time.perf_counter(), time.thread_time()
    saves: Any = _ManagerSaves(manager)  # duck-typed: the workload only calls save()
    run = await _timed_writes(saves, concurrency, seconds, small_state, tag)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    # The workload's warm-up writes one checkpoint per workflow first: counted here too.
    run["loop_cpu_us"] = cpu / (run["checkpoints"] + concurrency) * 1e6
    run["wall_s"] = wall
    return run


class _Idle:
    """Sums the time the loop's selector spends waiting (the loop is idle)."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self.seconds = 0.0
        inner = selector.select

        def select(timeout: float | None = None) -> Any:
            start = time.perf_counter()
            try:
                return inner(timeout)
            finally:
                self.seconds += time.perf_counter() - start

        selector.select = select  # type: ignore[method-assign]


def _spread(times: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of a phase's durations."""
    ordered = sorted(times)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
    }


class _WriterProbe:
    """Times the SQLite writer's batches and their phases (runs in the writer thread)."""

    def __init__(self) -> None:
        self.sizes: collections.Counter[int] = collections.Counter()
        self.phases: dict[str, list[float]] = collections.defaultdict(list)
        self.last_end: float | None = None
        writer = sqlite_writer.Writer
        self._saved = {
            name: writer.__dict__[name]
            for name in ("run_batch", "_begin", "_commit", "_apply_all", "_checkpoint")
            if name in writer.__dict__  # _checkpoint: the writer's own (catch-up) checkpoints
        }
        probe = self

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any) -> Any:
                start = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    probe.phases[name].append(time.perf_counter() - start)

            return wrapper

        timed_batch = timed("batch", self._saved["run_batch"])

        def run_batch(writer_self: Any, ops: Sequence[Any]) -> Any:
            probe.sizes[len(ops)] += 1
            if probe.last_end is not None:  # the hand-over: the loop settling and re-queuing
                probe.phases["gap"].append(time.perf_counter() - probe.last_end)
            try:
                return timed_batch(writer_self, ops)
            finally:
                probe.last_end = time.perf_counter()

        apply_all = self._saved["_apply_all"].__func__
        writer.run_batch = run_batch  # type: ignore[method-assign]
        writer._begin = timed("BEGIN", self._saved["_begin"])  # type: ignore[method-assign]
        writer._commit = timed("COMMIT", self._saved["_commit"])  # type: ignore[method-assign]
        writer._apply_all = classmethod(timed("apply saves", apply_all))  # type: ignore[method-assign,assignment]
        if "_checkpoint" in self._saved:
            writer._checkpoint = timed("catch-up", self._saved["_checkpoint"])  # type: ignore[method-assign]

    def reset(self) -> None:
        self.sizes.clear()
        self.phases.clear()
        self.last_end = None

    def close(self) -> None:
        for name, value in self._saved.items():
            setattr(sqlite_writer.Writer, name, value)


async def loops(seconds: float, root: Path) -> None:
    """Loop CPU per checkpoint at C=1/10/100 on memory and SQLite; the SQLite round at 100."""
    idle = _Idle(asyncio.get_running_loop()._selector)  # type: ignore[attr-defined]
    probe = _WriterProbe()
    try:
        for name, url in (("memory", "memory://"), ("sqlite", f"sqlite://{root / 'hot.db'}")):
            manager = CheckpointManager(open_storage(url))
            for concurrency in (1, 10, 100):
                runs = []
                for repeat in range(3):
                    idle.seconds = 0.0
                    probe.reset()
                    run = await _writers(manager, concurrency, seconds, f"c{concurrency}r{repeat}")
                    run["idle"] = idle.seconds / run["wall_s"]
                    run["writer_busy"] = sum(probe.phases["batch"]) / run["wall_s"]
                    run["batches"] = sum(probe.sizes.values())
                    runs.append(run)
                    if name == "sqlite" and concurrency == 100:
                        phases = {
                            f"{phase} {label}_ms": round(value * 1e3, 3)
                            for phase, times in probe.phases.items()
                            for label, value in _spread(times).items()
                        }
                        emit(
                            figure="sqlite round C=100",
                            repeat=repeat,
                            idle=round(run["idle"], 3),
                            writer_busy=round(run["writer_busy"], 3),
                            batch_sizes=dict(sorted(probe.sizes.items())),
                            **phases,
                        )
                emit(
                    figure=f"loop {name} C={concurrency}",
                    **{
                        key: round(statistics.median(r[key] for r in runs), 3)
                        for key in ("per_s", "loop_cpu_us", "p50_ms", "p99_ms", "idle")
                    },
                )
            await manager.close()
    finally:
        probe.close()


_KEYS = Keyring(keys={"bench": bytes(range(32))}, primary="bench")


async def _write_cpu_us(manager: CheckpointManager, state: dict[str, Any], count: int) -> float:
    start = time.thread_time()
    for step in range(count):
        await manager.create_checkpoint("wf-0001", step, "bench", "completed", state)
    return (time.thread_time() - start) / count * 1e6


async def encryption(seconds: float, root: Path) -> None:
    """Plain vs encrypted, alternating in one run: the ~1 KB write; SQLite at C=100."""
    state = small_state(3)
    managers = {
        "plain": CheckpointManager(_NullStorage()),
        "encrypted": CheckpointManager(_NullStorage(), encryption=_KEYS),
    }
    cpu: dict[str, list[float]] = {name: [] for name in managers}
    for _ in range(7):
        for name, manager in managers.items():
            cpu[name].append(await _write_cpu_us(manager, state, 3000))
    best = {name: min(runs) for name, runs in cpu.items()}
    emit(
        figure="encryption: ~1 KB create_checkpoint, memory (save returns at once)",
        plain_cpu_us=round(best["plain"], 2),
        encrypted_cpu_us=round(best["encrypted"], 2),
        ratio=round(best["encrypted"] / best["plain"], 3),
    )
    per_s: dict[str, list[float]] = {"plain": [], "encrypted": []}
    for repeat in range(3):
        for name in per_s:
            url = f"sqlite://{root / f'enc-{name}-{repeat}.db'}"
            keys = _KEYS if name == "encrypted" else None
            async with CheckpointManager(open_storage(url), encryption=keys) as manager:
                run = await _writers(manager, 100, seconds, f"{name}{repeat}")
            per_s[name].append(run["per_s"])
    medians = {name: statistics.median(runs) for name, runs in per_s.items()}
    emit(
        figure="encryption: SQLite C=100 throughput",
        plain_per_s=round(medians["plain"]),
        encrypted_per_s=round(medians["encrypted"]),
        ratio=round(medians["encrypted"] / medians["plain"], 3),
    )


def _chat(messages: int) -> dict[str, Any]:
    """A chat state of ``messages`` ~1 KB messages (what an agent's history grows into)."""
    return {"messages": [_message(i) for i in range(messages)], "summary": "s" * 500}


def _message(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 else "assistant", "n": i, "text": f"{i} " + "w" * 1000}


async def _chat_run(url: str, keys: Keyring | None, base: int, steps: int) -> dict[str, float]:
    """One growing chat: wall ms and loop CPU us per save, bytes stored, ms to read it back."""
    state = _chat(base)
    async with CheckpointManager(open_storage(url), encryption=keys, incremental=True) as manager:
        wall, cpu = time.perf_counter(), time.thread_time()
        for step in range(steps):
            state["messages"].append(_message(base + step))
            await manager.create_checkpoint("chat", step, "bench", "running", state)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        reads = []
        for _ in range(5):  # the least of five: reads are short, the machine is shared
            read = time.perf_counter()
            checkpoint = await manager.get_checkpoint("chat", steps - 1)
            reads.append(time.perf_counter() - read)
            assert checkpoint.state_snapshot.data == state
        read = min(reads)
    size = sum(p.stat().st_size for p in Path(url.removeprefix("sqlite://")).parent.glob("*"))
    return {
        "save_ms": wall / steps * 1e3,
        "cpu_us": cpu / steps * 1e6,
        "read_ms": read * 1e3,
        "bytes": size,
    }


async def encrypted_incremental(root: Path, base: int = 2000, steps: int = 60) -> None:
    """Plain vs encrypted incremental checkpoints of a growing ~2 MB chat on SQLite."""
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "encrypted": []}
    for repeat in range(3):
        for name, keys in (("plain", None), ("encrypted", _KEYS)):
            where = root / f"chat-{name}-{repeat}"
            where.mkdir()
            runs[name].append(await _chat_run(f"sqlite://{where / 'c.db'}", keys, base, steps))
    med = {
        name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        for name, rows in runs.items()
    }
    emit(
        figure=f"encryption: incremental growing chat, SQLite, {base} + {steps} messages",
        **{f"{name}_{k}": round(v, 2) for name, m in med.items() for k, v in m.items()},
        **{f"ratio_{k}": round(med["encrypted"][k] / med["plain"][k], 3) for k in med["plain"]},
    )


def main() -> None:
    """Parse arguments and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per write run (3 repeats)")
    parser.add_argument("--dir", type=Path, default=None, help="where the database goes")
    parser.add_argument(
        "--only",
        choices=["encryption", "encrypted-incremental"],
        default=None,
        help="one section",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        if args.only is None:
            asyncio.run(manager_parts())
            asyncio.run(loops(args.seconds, Path(root)))
        if args.only != "encrypted-incremental":
            asyncio.run(encryption(args.seconds, Path(root)))
        if args.only != "encryption":
            asyncio.run(encrypted_incremental(Path(root)))


if __name__ == "__main__":
    main()
