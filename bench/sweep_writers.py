"""Writers' save latency alone and while a sweep runs, side by side, and where a save waits.

    python bench/sweep_writers.py [--backend sqlite|postgres] [--workflows 20000]
                                  [--checkpoints 10] [--keep-last 3] [--rounds 3]
                                  [--writers 8] [--writer-pause 0.02] [--writer-seconds 4]
                                  [--trace] [--gc-freeze]

Each round, on a fresh store built in SQL (``bench/scale_fill.py``: ``workflows`` x
``checkpoints`` RUNNING checkpoints), ``writers`` tasks save a small checkpoint of their own
workflow every ``writer_pause`` seconds: first alone for ``writer_seconds``, then while one
``sweep(keep_last=...)`` runs, in the same process and store. One JSON line per round (the
writers' p50/p99/max alone and during the sweep, the ratio of the p99s, the sweep's time),
then the medians over the rounds.

``--trace`` adds where the time went in each phase: the cyclic garbage collector's
collections (count and longest, per generation), the event loop's lateness (a 2 ms
heartbeat: p99, max), and on SQLite each save split into its parts, for the slowest 1% of
saves (medians): before it was queued (encoding, the manager's own steps), queued in the
group commit, in the writer thread (its batch: apply and commit), and from the batch's end
to the caller running again (the loop); the writer thread's part split further (waiting
in the thread's queue behind something else, such as a vacuum step; a WAL checkpoint the
batch ran first; its ``COMMIT``), and how many of the slowest 1% overlapped a background
WAL checkpoint, an incremental vacuum step, a sweep's slice (and its deletes and its
``COMMIT`` apart: ``slice_apply``, ``slice_commit``) or a full collection. The
phase's own counts of those (``events``: how many, longest) come with it. The tracing
costs a little itself: compare traced runs with traced runs.

``--gc-freeze``: ``gc.freeze()`` before the first round (as in ``bench/scale.py``).

The script runs whatever ``aiocheckpoint`` the interpreter imports: run it with another
worktree's virtualenv to measure that code beside this one, alternating (the machine is
shared: read the load average printed with each line).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
from pg_trace import WaitSampler, hook_postgres
from scale_fill import fill_histories_postgres, fill_histories_sqlite

from aiocheckpoint import CheckpointManager, RetentionPolicy
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite.walcheckpoint import Checkpointer
from aiocheckpoint.storage.sqlite.writer import Writer, is_background

DSN = "postgresql://postgres@127.0.0.1:5432/test"

#: The save a writer task is making (its trace record), for the group commit's hooks.
_SAVE: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "save", default=None
)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, rounded to 0.01."""
    if len(values) < 2:
        return round(values[0], 2) if values else 0.0
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 2)


#: Intervals (perf_counter start, end) of what the SQLite store's threads ran, by kind:
#: "checkpointer" (a background WAL checkpoint), "reclaim" (an incremental vacuum step),
#: "slice" (a batch of a sweep's slice), "catch_up" (a checkpoint the writer ran before a
#: batch), "gc2" (a full collection). Filled by the hooks, read per phase.
EVENTS: dict[str, list[tuple[float, float]]] = {}


#: The writer thread's last ``_apply_all`` (a classmethod: no writer to keep it on).
_APPLY: dict[str, float] = {}


def _event(kind: str, began: float) -> None:
    EVENTS.setdefault(kind, []).append((began, time.perf_counter()))


class Trace:
    """What ``--trace`` collects in one phase: GC pauses, loop lateness, saves' parts."""

    def __init__(self) -> None:
        self.gc: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.lag: list[float] = []
        self.saves: list[dict[str, float]] = []
        self._gc_began = 0.0
        self.began = self.ended = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.gc[info["generation"]].append((time.perf_counter() - self._gc_began) * 1000)
            if info["generation"] == 2:
                _event("gc2", self._gc_began)

    def events(self) -> dict[str, list[tuple[float, float]]]:
        """This phase's intervals of each kind."""
        return {
            kind: [(a, b) for a, b in spans if self.began <= a <= self.ended]
            for kind, spans in EVENTS.items()
        }

    def overlaps(self, slow: list[dict[str, float]]) -> dict[str, Any]:
        """How many of ``slow`` overlapped each kind of event, and the events' own figures."""
        out: dict[str, Any] = {}
        for kind, spans in sorted(self.events().items()):
            hit = sum(1 for s in slow if any(a < s["end"] and b > s["begin"] for a, b in spans))
            lengths = [(b - a) * 1000 for a, b in spans]
            out[kind] = {
                "n": len(spans),
                "max_ms": round(max(lengths, default=0), 1),
                "p50_ms": percentile(lengths, 50),
                "slow_saves_overlapping": hit,
                # From the first's start to the last's end: the vacuum's share of a sweep.
                "span_s": round(spans[-1][1] - spans[0][0], 2) if spans else 0,
            }
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            f"gc{g}": {"n": len(d), "max_ms": round(max(d, default=0), 2)}
            for g, d in self.gc.items()
        }
        out["gc2_ms_total"] = round(sum(self.gc[2]), 1)
        out["loop_lag_ms"] = {"p99": percentile(self.lag, 99), "max": round(max(self.lag), 2)}
        parts = [s for s in self.saves if "done" in s and "end" in s]
        if parts:
            parts.sort(key=lambda s: s["end"] - s["begin"])
            slow = parts[-max(1, len(parts) // 100) :]
            out["slowest_1pct_ms"] = {
                # A part the save's batch did not have (no checkpoint first) counts as 0.
                name: round(statistics.median(_part(s, a, b) for s in slow), 2)
                for name, a, b in (
                    ("total", "begin", "end"),
                    ("before_queue", "begin", "submit"),
                    ("queued", "submit", "taken"),
                    ("in_writer", "taken", "done"),
                    ("wake", "done", "end"),
                    ("thread_queue", "taken", "run_start"),
                    ("catch_up", "ckpt_start", "ckpt_end"),
                    ("commit", "commit_start", "commit_end"),
                    ("begin", "begin_start", "begin_end"),
                    ("apply", "apply_start", "apply_end"),
                    ("after_commit", "commit_end", "run_end"),
                    ("thread_to_loop", "run_end", "done"),
                    # PostgreSQL: the pool's acquire, the statements (their commit
                    # included), the callers resolved after.
                    ("pg_acquire", "taken", "run_start"),
                    ("pg_statements", "run_start", "run_end"),
                    ("pg_resolve", "run_end", "done"),
                )
            }
            out["slowest_1pct_n"] = len(slow)
            # The slowest few whole: each stamp in ms after the save began.
            out["slowest"] = [
                {
                    k: round((v - s["begin"]) * 1000, 2)
                    for k, v in sorted(s.items(), key=lambda kv: kv[1])
                }
                for s in slow[-8:]
            ]
            out["events"] = self.overlaps(slow)
        return out


def _part(save: dict[str, float], start: str, end: str) -> float:
    """Milliseconds from stamp ``start`` to ``end`` of ``save`` (0 without both)."""
    if start not in save or end not in save:
        return 0.0
    return (save[end] - save[start]) * 1000


@contextmanager
def tracing(trace: Trace | None) -> Iterator[None]:
    """The GC callback and the loop's heartbeat for one phase (nothing without a trace)."""
    if trace is None:
        yield
        return
    gc.callbacks.append(trace.on_gc)
    trace.began = time.perf_counter()

    async def heartbeat() -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(0.002)
            trace.lag.append((time.perf_counter() - began - 0.002) * 1000)

    beating = asyncio.ensure_future(heartbeat())
    try:
        yield
    finally:
        beating.cancel()
        gc.callbacks.remove(trace.on_gc)
        trace.ended = time.perf_counter()


def hook_group_commit() -> None:
    """Stamp each writer's save where the SQLite group commit queues, takes and ends it."""
    cls = SQLiteCheckpointStorage
    submit, take, done = cls._submit, cls._take_batch, cls._batch_done

    def _submit(self: Any, op: Any, size: int) -> Any:
        future = submit(self, op, size)
        record = _SAVE.get()
        if record is not None:
            record["submit"] = time.perf_counter()
            future._bench_save = record  # type: ignore[attr-defined]
        return future

    def _take_batch(self: Any) -> Any:
        batch = take(self)
        now = time.perf_counter()
        for item in batch:
            record = getattr(item.future, "_bench_save", None)
            if record is not None:
                record["taken"] = now
        return batch

    def _batch_done(self: Any, batch: Any, finished: Any) -> None:
        now = time.perf_counter()
        parts = getattr(self._writer, "_bench_batch", {})
        for item in batch:
            record = getattr(item.future, "_bench_save", None)
            if record is not None:
                record["done"] = now
                record.update(parts)
        done(self, batch, finished)

    cls._submit = _submit  # type: ignore[method-assign]
    cls._take_batch = _take_batch  # type: ignore[method-assign]
    cls._batch_done = _batch_done  # type: ignore[method-assign]
    hook_writer()


def hook_writer() -> None:
    """Time the writer thread's parts of a batch, its vacuum steps, the checkpointer's runs.

    A batch's parts go on the writer (``_bench_batch``, read by the loop's ``_batch_done``
    after the thread is done with it): when the thread started it, the checkpoint it ran
    first (``catch_up``) and its ``COMMIT``.
    """
    run_batch, checkpoint, commit = Writer.run_batch, Writer._checkpoint, Writer._commit
    begin, apply_all = Writer._begin, Writer._apply_all
    reclaim, background = getattr(Writer, "reclaim", None), Checkpointer.run

    def _run_batch(self: Any, ops: Any) -> Any:
        self._bench_batch = parts = {"run_start": time.perf_counter()}
        _APPLY.clear()
        try:
            return run_batch(self, ops)
        finally:
            parts.update(_APPLY, run_end=time.perf_counter())
            if ops and all(is_background(op) for op in ops):
                vacuum = ops[0].what == "incremental vacuum"  # a vacuum step in slices
                _event("reclaim" if vacuum else "slice", parts["run_start"])
                if not vacuum and "commit_start" in parts:  # its deletes, then its COMMIT
                    EVENTS.setdefault("slice_apply", []).append(
                        (parts["apply_start"], parts["apply_end"])
                    )
                    EVENTS.setdefault("slice_commit", []).append(
                        (parts["commit_start"], parts["commit_end"])
                    )

    def _checkpoint(self: Any, conn: Any, mode: str) -> None:
        began = time.perf_counter()
        try:
            checkpoint(self, conn, mode)
        finally:
            parts = getattr(self, "_bench_batch", None)
            if parts is not None and mode == "PASSIVE":
                parts.update(ckpt_start=began, ckpt_end=time.perf_counter())
                _event("catch_up", began)

    def _commit(self: Any, conn: Any) -> None:
        began = time.perf_counter()
        try:
            commit(self, conn)
        finally:
            self._bench_batch.update(commit_start=began, commit_end=time.perf_counter())

    def _begin(self: Any, conn: Any) -> None:
        began = time.perf_counter()
        try:
            begin(self, conn)
        finally:
            self._bench_batch.update(begin_start=began, begin_end=time.perf_counter())

    def _apply_all(conn: Any, ops: Any, *lists: Any) -> Any:  # blob_pages (and released)
        began = time.perf_counter()
        try:
            return apply_all(conn, ops, *lists)
        finally:
            _APPLY.update(apply_start=began, apply_end=time.perf_counter())

    def _reclaim(self: Any, pages: int) -> Any:  # a vacuum step of its own (before slices)
        began = time.perf_counter()
        try:
            return reclaim(self, pages)  # type: ignore[misc]
        finally:
            _event("reclaim", began)

    def _background(self: Any) -> Any:
        began = time.perf_counter()
        try:
            return background(self)
        finally:
            _event("checkpointer", began)

    Writer.run_batch = _run_batch  # type: ignore[method-assign]
    Writer._checkpoint = _checkpoint  # type: ignore[method-assign]
    Writer._commit = _commit  # type: ignore[method-assign]
    Writer._begin = _begin  # type: ignore[method-assign]
    Writer._apply_all = staticmethod(_apply_all)  # type: ignore[method-assign,assignment]
    if reclaim is not None:
        Writer.reclaim = _reclaim  # type: ignore[attr-defined]
    Checkpointer.run = _background  # type: ignore[method-assign]


async def write_steadily(
    manager: CheckpointManager,
    args: argparse.Namespace,
    stop: asyncio.Event,
    trace: Trace | None,
) -> list[float]:
    """``args.writers`` tasks saving until ``stop`` is set; every save's latency in ms."""
    latencies: list[float] = []

    async def writer(k: int) -> None:
        step = 0
        while not stop.is_set():
            record = {"begin": time.perf_counter()}
            if trace is not None:
                _SAVE.set(record)
            # Steps 0-2 over and over: never more than the sweep keeps, so it deletes none.
            await manager.create_checkpoint(f"writer-{k:03}", step % 3, "w", "running", {"k": k})
            record["end"] = time.perf_counter()
            latencies.append((record["end"] - record["begin"]) * 1000)
            if trace is not None:
                trace.saves.append(record)
                _SAVE.set(None)
            step += 1
            await asyncio.sleep(args.writer_pause)

    await asyncio.gather(*(writer(k) for k in range(args.writers)))
    return latencies


def open_store(args: argparse.Namespace, where: Path, schema: str) -> CheckpointStorage:
    if args.backend == "sqlite":
        return SQLiteCheckpointStorage(where / "store.db")
    # Named after the schema: the trace's sampler finds the store's backends by it.
    settings = {"application_name": schema}
    return PostgresCheckpointStorage(args.dsn, schema=schema, max_size=8, server_settings=settings)


async def build(args: argparse.Namespace, where: Path, schema: str) -> None:
    """The store's histories, written in SQL from one template record."""
    async with CheckpointManager(open_store(args, where, schema)) as manager:
        await manager.create_checkpoint("template", 0, "a", "running", {"n": 0})
        stored = await manager.storage.load("template", 0)
        assert stored is not None
        await manager.storage.delete("template")
    if args.backend == "sqlite":
        await asyncio.to_thread(
            fill_histories_sqlite, where / "store.db", args.workflows, args.checkpoints, stored.data
        )
    else:
        await fill_histories_postgres(
            args.dsn, schema, args.workflows, args.checkpoints, stored.data
        )


def latency_figures(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": round(max(values), 2),
    }


async def one_round(args: argparse.Namespace, where: Path) -> dict[str, Any]:
    """Writers alone, then writers while a sweep runs, on one fresh store."""
    schema = f"bench_sw_{uuid.uuid4().hex[:10]}"
    policy = RetentionPolicy(keep_last=args.keep_last)
    traces = (Trace(), Trace()) if args.trace else (None, None)
    sampler = None
    try:
        await build(args, where, schema)
        if args.trace and args.backend == "postgres":
            sampler = WaitSampler(args.dsn, schema)
        async with CheckpointManager(open_store(args, where, schema), retention=policy) as mgr:
            warm = asyncio.Event()
            warming = asyncio.ensure_future(write_steadily(mgr, args, warm, None))
            await asyncio.sleep(0.5)
            warm.set()
            await warming
            stop = asyncio.Event()
            if sampler is not None:
                sampler.phase("alone")
            with tracing(traces[0]):
                writing = asyncio.ensure_future(write_steadily(mgr, args, stop, traces[0]))
                await asyncio.sleep(args.writer_seconds)
                stop.set()
                alone = await writing
            stop = asyncio.Event()
            if sampler is not None:
                sampler.phase("during")
            with tracing(traces[1]):
                writing = asyncio.ensure_future(write_steadily(mgr, args, stop, traces[1]))
                began = time.perf_counter()
                try:
                    swept = await mgr.sweep()
                finally:
                    sweep_s = time.perf_counter() - began
                    stop.set()
                    during = await writing
    finally:
        waits = None if sampler is None else sampler.finish()
        if args.backend == "postgres":
            con = await asyncpg.connect(args.dsn)
            try:
                await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await con.close()
    line: dict[str, Any] = {
        "backend": args.backend,
        "workflows": args.workflows,
        "alone": latency_figures(alone),
        "during": latency_figures(during),
        "p99_ratio": round(percentile(during, 99) / max(percentile(alone, 99), 0.01), 2),
        "sweep_s": round(sweep_s, 2),
        "deleted": swept.checkpoints_deleted,
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    if traces[0] is not None and traces[1] is not None:
        line["trace_alone"] = traces[0].summary()
        line["trace_during"] = traces[1].summary()
    if waits is not None:
        line["pg_waits"] = waits
    return line


async def run(args: argparse.Namespace) -> None:
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    if args.trace and args.backend == "sqlite":
        hook_group_commit()
    elif args.trace:
        hook_postgres(_SAVE.get, _event)
    lines = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            line = await one_round(args, Path(tmp))
        print(json.dumps(line), flush=True)
        lines.append(line)
    print(
        json.dumps(
            {
                "median_p99_ratio": statistics.median(line["p99_ratio"] for line in lines),
                "median_alone_p99": statistics.median(line["alone"]["p99"] for line in lines),
                "median_during_p99": statistics.median(line["during"]["p99"] for line in lines),
                "median_sweep_s": statistics.median(line["sweep_s"] for line in lines),
                "rounds": args.rounds,
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--workflows", type=int, default=20_000)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--writer-pause", type=float, default=0.02)
    parser.add_argument("--writer-seconds", type=float, default=4.0)
    parser.add_argument("--trace", action="store_true", help="where the saves' time goes")
    parser.add_argument(
        "--dir", help="where the SQLite file goes (default: the temp dir; /dev/shm: no fsync cost)"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() what start-up made (imports): full collections then walk only the rest",
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
