"""The five workloads. Each run gets a fresh system and returns a dict of figures.

1. ``write``: durable write throughput and p50/p99 latency with C concurrent workflows.
2. ``lag``: event-loop lateness of a 1 ms heartbeat while writes run.
3. ``lookup``: latest-checkpoint lookup with a short and a long history; first page of 10.
4. ``growth``: bytes stored after many steps of a big, barely changing state and of a chat.
5. ``resume``: ``get_resume_point`` (or the system's equivalent) on a ~10 MB state.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .data import ChatStates, DocStates, encoded_size, small_state
from .systems import Env, System

__all__ = [
    "Heartbeat",
    "Sizes",
    "growth_reference",
    "percentile",
    "run_growth",
    "run_idle_lag",
    "run_lag",
    "run_lookup",
    "run_resume",
    "run_write",
]


@dataclass(frozen=True)
class Sizes:
    """How big and how long each workload runs."""

    write_seconds: float
    write_repeats: int
    concurrency: tuple[int, ...]
    lag_seconds: float
    lag_repeats: int
    big_state_bytes: int
    lag_writers: int
    history: int
    lookup_calls: int
    growth_steps: int
    growth_state_bytes: int
    chat_steps: int
    message_bytes: int
    resume_state_bytes: int
    resume_calls: int

    @classmethod
    def full(cls) -> Sizes:
        """The sizes the issue names."""
        return cls(1.0, 3, (1, 10, 100), 1.5, 3, 1_000_000, 20, 10_000, 60, 1000, 1_000_000,
                   1000, 1000, 10_000_000, 5)  # fmt: skip

    @classmethod
    def quick(cls) -> Sizes:
        """Under two minutes on two cores: shorter runs, shorter histories, fewer steps."""
        return cls(0.2, 3, (1, 10, 100), 0.4, 1, 1_000_000, 20, 1_000, 20, 50, 1_000_000,
                   100, 1000, 10_000_000, 3)  # fmt: skip

    @classmethod
    def tiny(cls) -> Sizes:
        """Seconds: checks that every script runs, measures nothing."""
        return cls(0.03, 1, (1, 10, 100), 0.05, 1, 20_000, 3, 50, 3, 5, 20_000,
                   5, 200, 50_000, 1)  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@asynccontextmanager
async def opened(system_cls: type[System], env: Env) -> AsyncIterator[System]:
    """A fresh system in a fresh directory, closed and removed afterwards."""
    workdir = tempfile.mkdtemp(prefix=f"{system_cls.name}-", dir=env.root)
    system = system_cls(Path(workdir), env)
    try:
        await system.open()
        yield system
    finally:
        try:
            await system.close()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


class Heartbeat:
    """A task that sleeps 1 ms in a loop and records how late each wake-up is."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self._running = True
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while self._running:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lateness.append(time.perf_counter() - start - 0.001)

    def start(self) -> None:
        """Begin beating."""
        self._task = asyncio.create_task(self._beat())

    async def stop(self) -> dict[str, float]:
        """Let the beat in progress finish (it may be the late one), then report in ms."""
        assert self._task is not None
        self._running = False
        await self._task
        return {
            "lag_p50_ms": percentile(self.lateness, 50) * 1e3,
            "lag_p99_ms": percentile(self.lateness, 99) * 1e3,
            "lag_max_ms": max(self.lateness, default=0.0) * 1e3,
            "beats": len(self.lateness),
        }


async def _timed_writes(
    system: System,
    concurrency: int,
    seconds: float,
    state_at: Callable[[int], dict[str, Any]],
    prefix: str = "wf",
    large: bool = False,
) -> dict[str, float]:
    """C workflows each write steps back to back for ``seconds``; one warm-up step first.

    Each workflow yields to the event loop between its checkpoints, as a real one does
    (it awaits a model or a tool in between); without that, a store whose ``save`` never
    suspends would let one workflow run alone until the deadline.
    """
    workflows = [f"{prefix}-{i:04d}" for i in range(concurrency)]
    save = system.save_large if large else system.save
    await asyncio.gather(*(save(wf, 0, state_at(0)) for wf in workflows))
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def writer(wf: str) -> None:
        step = 1
        while time.perf_counter() < deadline:
            state = state_at(step)
            start = time.perf_counter()
            await save(wf, step, state)
            latencies.append(time.perf_counter() - start)
            step += 1
            await asyncio.sleep(0)

    start = time.perf_counter()
    await asyncio.gather(*(writer(wf) for wf in workflows))
    elapsed = time.perf_counter() - start
    return {
        "checkpoints": len(latencies),
        "per_s": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
    }


async def run_write(
    system_cls: type[System], env: Env, sizes: Sizes, concurrency: int
) -> list[dict[str, Any]]:
    """Workload 1: ~1 KB states, C workflows writing as fast as they can; one run per repeat.

    The repeats share one store (each with workflows of its own), so setup costs once.
    """
    runs = []
    async with opened(system_cls, env) as system:
        for repeat in range(sizes.write_repeats):
            seconds = sizes.write_seconds
            runs.append(
                await _timed_writes(system, concurrency, seconds, small_state, f"r{repeat}")
            )
    return runs


async def run_lag(
    system_cls: type[System], env: Env, sizes: Sizes, scenario: str
) -> list[dict[str, Any]]:
    """Workload 2: heartbeat lateness while ``write`` runs at C=100 or 20 writers of ~1 MB."""
    large = scenario != "small-c100"
    if not large:
        concurrency, state_at = 100, small_state
    else:
        docs = DocStates.of(sizes.big_state_bytes)
        concurrency, state_at = sizes.lag_writers, docs.at
    runs = []
    async with opened(system_cls, env) as system:
        for repeat in range(sizes.lag_repeats):
            heartbeat = Heartbeat()
            heartbeat.start()
            writes = await _timed_writes(
                system, concurrency, sizes.lag_seconds, state_at, f"r{repeat}", large
            )
            lag = await heartbeat.stop()
            runs.append({**lag, "per_s": writes["per_s"], "checkpoints": writes["checkpoints"]})
    return runs


async def run_idle_lag(sizes: Sizes) -> dict[str, Any]:
    """The heartbeat's own floor: lateness with nothing else running."""
    heartbeat = Heartbeat()
    heartbeat.start()
    await asyncio.sleep(sizes.lag_seconds)
    return await heartbeat.stop()


async def _median_seconds(call: Callable[[], Awaitable[Any]], calls: int) -> float:
    await call()  # warm caches and lazy opens
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        result = await call()
        times.append(time.perf_counter() - start)
        if result is None or result == []:
            raise RuntimeError("lookup returned nothing")
    return statistics.median(times)


async def _populate(system: System, wf: str, steps: int, parallel: int = 16) -> None:
    """Write steps 0..steps-1 of one workflow, ``parallel`` writes in flight."""
    queue = iter(range(steps))

    async def worker() -> None:
        for step in queue:
            await system.save(wf, step, small_state(step))

    await asyncio.gather(*(worker() for _ in range(parallel)))


async def run_lookup(system_cls: type[System], env: Env, sizes: Sizes) -> dict[str, Any]:
    """Workload 3: latest lookup at history 10 and at the long history; a first page of 10."""
    figures: dict[str, Any] = {"history": sizes.history}
    for label, history in (("short", 10), ("long", sizes.history)):
        async with opened(system_cls, env) as system:
            await _populate(system, "wf-lookup", history)
            latest = await _median_seconds(lambda: system.latest("wf-lookup"), sizes.lookup_calls)
            figures[f"latest_{label}_ms"] = latest * 1e3
            if label == "long":
                page = await _median_seconds(
                    lambda: system.page("wf-lookup", 10), max(3, sizes.lookup_calls // 20)
                )
                figures["page10_long_ms"] = page * 1e3
    figures["long_over_short"] = figures["latest_long_ms"] / figures["latest_short_ms"]
    return figures


def _growth_states(sizes: Sizes, scenario: str) -> tuple[int, Callable[[int], dict[str, Any]]]:
    if scenario == "doc-1mb":
        return sizes.growth_steps, DocStates.of(sizes.growth_state_bytes).at
    return sizes.chat_steps, ChatStates(sizes.message_bytes).next


async def run_growth(
    system_cls: type[System], env: Env, sizes: Sizes, scenario: str
) -> dict[str, Any]:
    """Workload 4: bytes stored after many sequential steps of one workflow."""
    steps, state_at = _growth_states(sizes, scenario)
    start = time.perf_counter()
    per_step: list[float] = []
    cpu_step: list[float] = []  # the process's CPU (every thread of it), less noisy
    async with opened(system_cls, env) as system:
        for step in range(steps):
            state = state_at(step)
            began, cpu = time.perf_counter(), time.process_time()
            await system.save_large("wf-growth", step, state)
            per_step.append(time.perf_counter() - began)
            cpu_step.append(time.process_time() - cpu)
        elapsed = time.perf_counter() - start
        stored = await system.stored_bytes()
    final = encoded_size(state)
    figures = {"steps": steps, "bytes": stored, "x_final_state": stored / final, "seconds": elapsed}
    # The cost of one step as the state grows: median of the 11 steps around each size.
    for at in (10, 100, 1000):
        window = slice(max(0, at - 6), at + 5)
        if len(per_step) >= at:
            figures[f"ms_at_{at}"] = statistics.median(per_step[window]) * 1e3
            figures[f"cpu_ms_at_{at}"] = statistics.median(cpu_step[window]) * 1e3
    return figures


def growth_reference(sizes: Sizes, scenario: str) -> dict[str, Any]:
    """The JSON payload itself: the final state's size and the sum over every step's state.

    A store that writes the whole state on every step needs about ``full_copies_bytes``;
    one that stores each piece once needs about ``final_state_bytes``.
    """
    steps, state_at = _growth_states(sizes, scenario)
    if scenario == "doc-1mb":
        first, final = encoded_size(state_at(0)), encoded_size(state_at(steps - 1))
        total = first * steps + (final - first) * steps // 2
    else:
        total = messages = 0
        for step in range(steps):
            state = state_at(step)
            messages += encoded_size(state["messages"][-1])
            # '{"messages":[...],"turn":k}' with k commas between the k + 1 messages
            total += encoded_size({"messages": [], "turn": step}) + messages + step
        final = encoded_size(state)
    return {
        "steps": steps,
        "bytes": total,
        "final_state_bytes": final,
        "x_final_state": total / final,
    }


async def run_resume(system_cls: type[System], env: Env, sizes: Sizes) -> dict[str, Any]:
    """Workload 5: resume a workflow whose latest checkpoint holds a ~10 MB state."""
    state = DocStates.of(sizes.resume_state_bytes).at(1)
    async with opened(system_cls, env) as system:
        await system.save("wf-resume", 1, state)
        seconds = await _median_seconds(lambda: system.resume("wf-resume"), sizes.resume_calls)
    return {"state_bytes": encoded_size(state), "resume_ms": seconds * 1e3}
