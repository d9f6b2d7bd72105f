"""What OpenTelemetry costs on the ~1 KB hot path: without it, with a no-op tracer, recording.

Not a test: it prints one JSON line per measurement, then one per ratio. Five modes, each in
a fresh interpreter, run one after the other in each of ``--rounds`` rounds so that the
machine's load hits them alike; a ratio is the median over the rounds of each round's ratio:

* ``absent``: ``opentelemetry`` cannot be imported (a meta-path blocker), as without the
  ``[otel]`` extra.
* ``noop``: the API installed, no SDK configured: the API's no-op tracer and meter.
* ``sdk``: the SDK recording every span (a ``BatchSpanProcessor`` exporting to nowhere, as a
  production exporter would in its thread) and every metric (an in-memory reader).
* ``sampled``: the same with a ``ParentBased(TraceIdRatioBased(0.01))`` sampler: 1% of the
  checkpoints (root spans here) are traced; every metric is recorded.
* ``metrics``: a meter provider only (no tracer provider): metrics, no spans.

Workloads, each ``create_checkpoint`` of the bench's ~1 KB state: ``memory``, back to back
on the in-memory store (the manager's own work: the worst case for relative overhead);
``sqlite-c20``, 20 concurrent writers on a SQLite file (group commit, fsync);
``sqlite-c1`` and ``postgres-c1``, one workflow saving step after step, each save durable
before the next (the latency one agent sees). Figures are CPU
microseconds per checkpoint, of the event-loop thread (``loop_us``) and of the whole process
including the exporter's thread (``process_us``), and wall-clock microseconds per checkpoint
(``wall_us``: 1 / throughput); the best of five repeats in each process. The ``sdk`` rows
also give the SDK's own floor in that process: one bare span started and ended
(``sdk_span_us``), one histogram point (``sdk_point_us``), and the SDK calls one
checkpoint makes (``sdk_checkpoint_us``): two spans, the storage round trip's current
inside the call's, and one histogram point, its duration (its bytes are summed in the
library and read by the SDK when it collects).

``--before DIR`` also runs the three SDK modes with another checkout's library (``DIR/src``,
e.g. a ``git worktree`` of the previous commit) in the same rounds: ``sdk-before``...
rows and ratios, to compare a change to the instrumentation side by side.

Usage: ``python bench/otel.py [--rounds N] [--checkpoints N] [--tiny] [--before DIR]
[--workload NAME ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.abc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
#: The library measured: this checkout's, or (``--before``) another's, not an installed copy.
SRC = os.environ.get("BENCH_OTEL_SRC", str(ROOT / "src"))
if Path(SRC).is_dir() and SRC not in sys.path:
    sys.path.insert(0, SRC)

MODES = ("absent", "noop", "sdk", "sampled", "metrics")
#: Each workload, and the share of ``--checkpoints`` it writes (a durable one-by-one save
#: waits for its own commit: fewer of them).
WORKLOADS = {"memory": 1.0, "sqlite-c20": 1.0, "sqlite-c1": 0.1, "postgres-c1": 0.1}
WRITERS = 20
DSN = os.environ.get("AIOCHECKPOINT_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")


class _Blocker(importlib.abc.MetaPathFinder):
    """Makes ``opentelemetry`` unimportable, as if the extra were not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"{name} is blocked")


def _install_sdk(mode: str = "sdk") -> None:
    """The SDK's providers for ``mode``: every span, 1% of root spans, or metrics only."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Nowhere(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if mode != "metrics":
        sampler = ParentBased(TraceIdRatioBased(0.01)) if mode == "sampled" else None
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(Nowhere()))
        trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def _memory(count: int) -> None:
    from aiocheckpoint import CheckpointManager
    from bench.data import small_state

    manager = CheckpointManager()
    state = small_state(3)
    for step in range(count):
        await manager.create_checkpoint("wf-0001", step, "bench", "completed", state)


async def _writers(manager: Any, count: int, writers: int) -> None:
    from bench.data import small_state

    state = small_state(3)
    run = uuid.uuid4().hex[:8]

    async def writer(n: int) -> None:
        for step in range(count // writers):
            await manager.create_checkpoint(f"wf-{run}-{n}", step, "bench", "completed", state)

    await asyncio.gather(*(writer(n) for n in range(writers)))


async def _sqlite(count: int, writers: int) -> None:
    from aiocheckpoint import CheckpointManager
    from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

    with tempfile.TemporaryDirectory() as tmp:
        async with CheckpointManager(SQLiteCheckpointStorage(Path(tmp) / "b.db")) as manager:
            await manager.list_workflows()  # open the file outside the loop of saves
            await _writers(manager, count, writers)


async def _postgres(count: int) -> None:
    from aiocheckpoint import CheckpointManager
    from aiocheckpoint.storage.postgres import PostgresCheckpointStorage

    storage = PostgresCheckpointStorage(DSN, schema=os.environ["BENCH_OTEL_SCHEMA"])
    async with CheckpointManager(storage) as manager:
        await manager.list_workflows()  # open the pool and the schema outside the saves
        await _writers(manager, count, 1)


def _workload(name: str) -> Callable[[int], Coroutine[Any, Any, None]]:
    if name == "memory":
        return _memory
    if name == "postgres-c1":
        return _postgres
    return functools.partial(_sqlite, writers=WRITERS if name == "sqlite-c20" else 1)


def child(mode: str, workload: str, count: int) -> dict[str, Any]:
    """One process's figures: the best of five repeats of ``count`` checkpoints."""
    if mode == "absent":
        sys.meta_path.insert(0, _Blocker())
    elif mode != "noop":
        _install_sdk(mode)
    from aiocheckpoint import _telemetry

    assert _telemetry.ENABLED is (mode != "absent")
    run = _workload(workload)
    asyncio.run(run(count // 5))  # warm-up
    loop, process, wall = [], [], []
    for _ in range(5):
        cpu, total, start = time.thread_time(), time.process_time(), time.perf_counter()
        asyncio.run(run(count))
        loop.append((time.thread_time() - cpu) / count * 1e6)
        process.append((time.process_time() - total) / count * 1e6)
        wall.append((time.perf_counter() - start) / count * 1e6)
    figures = {"loop_us": min(loop), "process_us": min(process), "wall_us": min(wall)}
    if mode == "sdk":
        figures.update(_sdk_floor())
    return figures


#: A storage round trip's span attributes: system, operation, bytes written.
CLIENT: dict[str, str | int] = {
    "db.system.name": "memory",
    "db.operation.name": "save",
    "size": 1100,
}


def _sdk_floor() -> dict[str, float]:
    """The SDK's own cost, in the same process: a bare span, a point, one save's calls."""
    from opentelemetry import context, metrics, trace
    from opentelemetry.trace import SpanKind

    tracer = trace.get_tracer("bench")
    histogram = metrics.get_meter("bench").create_histogram("bench.h")

    def span() -> None:
        tracer.start_span("bare", attributes={"a": "b"}).end()

    def point() -> None:
        histogram.record(1.0, {"a": "b"})

    def checkpoint() -> None:  # what the SDK itself does for one instrumented save
        outer = tracer.start_span("save", attributes={"w": "wf-0001", "s": 3})
        token = context.attach(trace.set_span_in_context(outer))
        inner = tracer.start_span("db", kind=SpanKind.CLIENT, attributes=CLIENT)
        inner_token = context.attach(trace.set_span_in_context(inner))
        context.detach(inner_token)
        inner.end()
        context.detach(token)
        outer.end()
        histogram.record(1e-4, {"o": "create_checkpoint", "d": "memory"})

    fns = (("sdk_span_us", span), ("sdk_point_us", point), ("sdk_checkpoint_us", checkpoint))
    return {
        name: min(timeit.repeat(fn, number=2000, repeat=5, timer=time.thread_time)) / 2000 * 1e6
        for name, fn in fns
    }


def _spawn(mode: str, workload: str, count: int, schema: str, before: str | None) -> dict[str, Any]:
    mode, _, other = mode.partition("-")  # "sdk-before": the SDK mode, the other checkout
    command = [sys.executable, __file__, "--child", mode, workload, "--checkpoints", str(count)]
    env = {**os.environ, "BENCH_OTEL_SCHEMA": schema}
    if other and before:
        env["BENCH_OTEL_SRC"] = str(Path(before, "src").resolve())
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run every mode on every workload, alternately; print figures, then ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=4000)
    parser.add_argument("--tiny", action="store_true", help="seconds; checks the script runs")
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="only these")
    parser.add_argument("--before", metavar="DIR", help="also measure DIR/src's SDK modes")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.checkpoints)))
        return 0
    rounds, count = (1, 200) if args.tiny else (args.rounds, args.checkpoints)
    print(json.dumps({"kind": "env", "load": os.getloadavg(), "nproc": os.cpu_count()}))
    schema = f"aiocp_bench_otel_{uuid.uuid4().hex[:8]}"
    try:
        for workload in args.workload or WORKLOADS:
            share = WORKLOADS[workload]
            size = max(WRITERS, int(count * share))
            _workload_rows(workload, rounds, size, schema, args.before)
    finally:
        asyncio.run(_drop(schema))
    print(json.dumps({"kind": "env", "load": os.getloadavg()}))
    return 0


async def _drop(schema: str) -> None:
    import asyncpg

    try:
        connection = await asyncpg.connect(DSN)
    except (OSError, asyncpg.PostgresError):
        return
    try:
        await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await connection.close()


def _workload_rows(workload: str, rounds: int, count: int, schema: str, before: str | None) -> None:
    modes = MODES + (tuple(f"{mode}-before" for mode in MODES[2:]) if before else ())
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode in modes:
            figures = _spawn(mode, workload, count, schema, before)
            runs[mode].append(figures)
            print(json.dumps({"kind": "measurement", "workload": workload, "mode": mode,
                              **{k: round(v, 2) for k, v in figures.items()}}))  # fmt: skip
    _ratios(workload, runs)


def _ratios(workload: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Per figure and mode: the median of the rounds' ratios (each round's modes ran together)."""
    for figure in ("loop_us", "process_us", "wall_us"):
        base = [r[figure] for r in runs["absent"]]
        for mode in list(runs)[1:]:
            mine = [r[figure] for r in runs[mode]]
            record = {
                "kind": "ratio",
                "workload": workload,
                "figure": figure,
                "mode": mode,
                "absent": round(statistics.median(base), 2),
                mode: round(statistics.median(mine), 2),
                "ratio": round(
                    statistics.median(m / b for m, b in zip(mine, base, strict=True)), 3
                ),
            }
            print(json.dumps(record))


if __name__ == "__main__":
    sys.exit(main())
