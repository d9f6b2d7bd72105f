"""AioCheckpointSaver against LangGraph's own savers, on the same compiled graph.

    PYTHONPATH=src python bench/langgraph_saver.py [--steps 1000] [--threads 100]
        [--thread-steps 10] [--rounds 2] [--only sqlite|postgres] [--dsn DSN] [--freeze]

The graph has two nodes taking turns (``plan``, ``act``), each appending a ~1 KB message
to a ``messages`` list (LangGraph's ``add_messages``), so the state grows every step.
Rows, per system, alternated in one process (``--rounds`` times, medians reported):

* ``growing``: one thread driven for ``--steps`` steps: steps/s, p99 step latency (the time
  between two steps' updates in ``astream``), and the bytes stored afterwards (SQLite: the
  database and its WAL files; PostgreSQL: ``pg_total_relation_size`` of the saver's tables);
* ``concurrent``: ``--threads`` threads at once, ``--thread-steps`` steps each: steps/s and
  p99 step latency;
* ``replayed``: the saver calls of one ``concurrent`` run (recorded once, with the no-op
  checkpointer) replayed on each saver, every thread at once, without the graph: what the
  saver alone costs, as loop-thread and process CPU per checkpoint (with its writes).

``--freeze`` calls ``gc.freeze()`` before the first round, as an application may once it has
started: the imported modules' objects then leave every full collection.

Each store is opened (its schema created) before the clock starts. ``concurrent`` rows also
give ``loop_cpu_us``: the event-loop thread's CPU per step (a figure
that holds up better than steps/s on a loaded machine), and the garbage collector's share of
it: ``gc_us`` (its CPU per step, from ``gc.callbacks``) and ``gc_runs`` (collections of
generations 0, 1 and 2 during the run).

Systems: ``graph-only`` (no checkpointer: the graph's own time), ``noop`` (a checkpointer that
stores nothing: LangGraph's own checkpointing work, the floor of any saver), ``waiting`` (one
that stores nothing but waits, as a group commit does: every call awaits a future that a
callback resolves with the others queued in the same loop iteration; the floor of any
durable saver, LangGraph's tasks waiting on it included), ``ours-sqlite``
(``AioCheckpointSaver`` over ``SQLiteCheckpointStorage``), ``lg-sqlite``
(``AsyncSqliteSaver``), ``ours-postgres`` (``AioCheckpointSaver`` over
``PostgresCheckpointStorage``), ``lg-postgres`` (``AsyncPostgresSaver``). LangGraph runs
with its default durability (``"async"``: a step's checkpoint is saved while the next
step runs). Output: one JSON line per measurement, then ratio lines.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import asyncpg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pg_support import drop_schema

from aiocheckpoint.integrations.langgraph import AioCheckpointSaver

DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
WORDS = [
    "the",
    "agent",
    "called",
    "a",
    "tool",
    "and",
    "read",
    "its",
    "result",
    "then",
    "wrote",
    "an",
    "answer",
    "for",
    "user",
]


def text(seed: str) -> str:
    """~1 KB of word salad, different per message (compressible like prose, not like 'y' * n)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(220))[:1000]


class BenchState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turn: int
    limit: int


def _node(name: str) -> Callable[[BenchState], dict[str, Any]]:
    def run(state: BenchState) -> dict[str, Any]:
        turn = state["turn"]
        message = AIMessage(f"{name} {turn}: {text(f'{name}-{turn}')}", id=f"{name}-{turn}")
        return {"messages": [message], "turn": turn + 1}

    return run


def _next(after: str) -> Callable[[BenchState], str]:
    return lambda state: after if state["turn"] < state["limit"] else END


def build(checkpointer: Any) -> Any:
    """The bench graph: ``plan`` and ``act`` take turns until ``limit`` steps are done."""
    graph = StateGraph(BenchState)
    graph.add_node("plan", _node("plan"))
    graph.add_node("act", _node("act"))
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", _next("act"), ["act", END])
    graph.add_conditional_edges("act", _next("plan"), ["plan", END])
    return graph.compile(checkpointer=checkpointer)


async def drive(graph: Any, thread: str, steps: int) -> list[float]:
    """Run one thread for ``steps`` steps; return each step's latency in seconds."""
    config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
    start = {"messages": [HumanMessage("go", id="go")], "turn": 0, "limit": steps}
    latencies: list[float] = []
    last = time.perf_counter()
    async for _ in graph.astream(start, config, stream_mode="updates"):
        now = time.perf_counter()
        latencies.append(now - last)
        last = now
    return latencies


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


# -- systems: an async context manager yielding (checkpointer, bytes-stored function) -----


@asynccontextmanager
async def graph_only(root: Path, schema: str) -> AsyncIterator[tuple[Any, Any]]:
    async def size() -> int:
        return 0

    yield None, size


class NoopSaver(BaseCheckpointSaver[str]):
    """A checkpointer that stores nothing: what LangGraph's checkpointing costs by itself."""

    async def aget_tuple(self, config: Any) -> Any:
        return None

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        conf = config["configurable"]
        return {"configurable": {**conf, "checkpoint_id": checkpoint["id"]}}

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        return None

    def get_next_version(self, current: Any, channel: Any) -> str:
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"


@asynccontextmanager
async def noop(root: Path, schema: str) -> AsyncIterator[tuple[Any, Any]]:
    async def size() -> int:
        return 0

    yield NoopSaver(), size


class WaitingSaver(NoopSaver):
    """Stores nothing, but every call waits as for a group commit that costs nothing.

    Each call awaits a future; one loop iteration after the first of them, a callback
    resolves every future queued meanwhile (as the SQLite store's group commit wakes the
    callers of one batch). What LangGraph itself costs with a saver that suspends.
    """

    def __init__(self) -> None:
        super().__init__()
        self._queued: list[asyncio.Future[None]] = []

    def _commit(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._queued:
            loop.call_soon(self._wake)
        self._queued.append(future)
        return future

    def _wake(self) -> None:
        queued, self._queued = self._queued, []
        for future in queued:
            if not future.done():
                future.set_result(None)

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        await self._commit()
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        await self._commit()


@asynccontextmanager
async def waiting(root: Path, schema: str) -> AsyncIterator[tuple[Any, Any]]:
    async def size() -> int:
        return 0

    yield WaitingSaver(), size


def _files_size(path: Path) -> Callable[[], Any]:
    async def size() -> int:
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))

    return size


@asynccontextmanager
async def ours_sqlite(root: Path, schema: str) -> AsyncIterator[tuple[Any, Any]]:
    path = root / f"ours-{uuid.uuid4().hex[:6]}.db"
    async with AioCheckpointSaver.from_url(f"sqlite://{path}") as saver:
        yield saver, _files_size(path)


@asynccontextmanager
async def lg_sqlite(root: Path, schema: str) -> AsyncIterator[tuple[Any, Any]]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = root / f"lg-{uuid.uuid4().hex[:6]}.db"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield saver, _files_size(path)


def _pg_size(schema: str) -> Callable[[], Any]:
    async def size() -> int:
        con = await asyncpg.connect(DSN)
        try:
            total: int = await con.fetchval(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND c.relkind = 'r'",
                schema,
            )
        finally:
            await con.close()
        return total

    return size


@asynccontextmanager
async def ours_postgres(root: Path, schema: str) -> AsyncIterator[tuple[Any, Any]]:
    async with AioCheckpointSaver.from_url(f"{DSN}?schema={schema}") as saver:
        yield saver, _pg_size(schema)


@asynccontextmanager
async def lg_postgres(root: Path, schema: str) -> AsyncIterator[tuple[Any, Any]]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg_pool import AsyncConnectionPool

    con = await asyncpg.connect(DSN)
    await con.execute(f'CREATE SCHEMA "{schema}"')
    await con.close()
    kwargs = {"autocommit": True, "prepare_threshold": 0, "options": f"-c search_path={schema}"}
    async with AsyncConnectionPool(DSN, max_size=10, kwargs=kwargs, open=False) as pool:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        yield saver, _pg_size(schema)


SYSTEMS: dict[str, Callable[[Path, str], AbstractAsyncContextManager[tuple[Any, Any]]]] = {
    "graph-only": graph_only,
    "noop": noop,
    "waiting": waiting,
    "ours-sqlite": ours_sqlite,
    "lg-sqlite": lg_sqlite,
    "ours-postgres": ours_postgres,
    "lg-postgres": lg_postgres,
}


async def warm(saver: Any) -> None:
    """Open the store before the clock starts, as ``AsyncPostgresSaver.setup()`` is here.

    Our stores open (and create their schema) on first use, so without this the first step
    of the ``growing`` row would carry the schema's creation and be its p99.
    """
    if saver is not None:
        await saver.aget_tuple({"configurable": {"thread_id": "warm-up", "checkpoint_ns": ""}})


async def growing(name: str, root: Path, steps: int) -> dict[str, Any]:
    schema = f"lgbench_{uuid.uuid4().hex[:10]}"
    try:
        async with SYSTEMS[name](root, schema) as (saver, size):
            await warm(saver)
            begin = time.perf_counter()
            latencies = await drive(build(saver), "growing", steps)
            elapsed = time.perf_counter() - begin
        stored = await size()
    finally:
        await drop_schema(schema)
    return {"steps_per_s": steps / elapsed, "p99_ms": p99(latencies), "bytes": stored}


class GcClock:
    """The garbage collector's CPU time (``time.thread_time``) and runs per generation."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        self.runs[info["generation"]] += 1
        self.seconds += time.thread_time() - self._started

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


async def concurrent(name: str, root: Path, threads: int, steps: int) -> dict[str, Any]:
    schema = f"lgbench_{uuid.uuid4().hex[:10]}"
    try:
        async with SYSTEMS[name](root, schema) as (saver, _):
            await warm(saver)
            graph = build(saver)
            with GcClock() as collector:
                begin, cpu = time.perf_counter(), time.thread_time()
                runs = await asyncio.gather(*(drive(graph, f"t{n}", steps) for n in range(threads)))
                elapsed, cpu = time.perf_counter() - begin, time.thread_time() - cpu
    finally:
        await drop_schema(schema)
    latencies = [value for run in runs for value in run]
    return {
        "steps_per_s": threads * steps / elapsed,
        "p99_ms": p99(latencies),
        "loop_cpu_us": cpu / (threads * steps) * 1e6,
        "gc_us": collector.seconds / (threads * steps) * 1e6,
        "gc_runs": collector.runs,
    }


class Recorder(NoopSaver):
    """The no-op checkpointer, keeping each thread's calls for :func:`replayed`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, list[tuple[Any, ...]]] = {}

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        call = (self.aput.__name__, config, checkpoint, metadata, new_versions)
        self.calls.setdefault(config["configurable"]["thread_id"], []).append(call)
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        call = (self.aput_writes.__name__, config, writes, task_id, task_path)
        self.calls.setdefault(config["configurable"]["thread_id"], []).append(call)


async def record_calls(threads: int, steps: int) -> dict[str, list[tuple[Any, ...]]]:
    """The saver calls of ``threads`` threads of ``steps`` steps, as LangGraph makes them."""
    recorder = Recorder()
    graph = build(recorder)
    await asyncio.gather(*(drive(graph, f"t{n}", steps) for n in range(threads)))
    return recorder.calls


async def replayed(name: str, root: Path, calls: dict[str, list[tuple[Any, ...]]]) -> Any:
    """The recorded calls replayed on a saver, every thread at once, without the graph.

    What the saver alone costs: loop-thread and process CPU per checkpoint (with its writes).
    """

    async def play(saver: Any, thread: list[tuple[Any, ...]]) -> None:
        for method, *args in thread:
            await getattr(saver, method)(*args)

    puts = sum(1 for thread in calls.values() for call in thread if call[0] == "aput")
    schema = f"lgbench_{uuid.uuid4().hex[:10]}"
    try:
        async with SYSTEMS[name](root, schema) as (saver, _):
            await warm(saver)
            begin, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
            await asyncio.gather(*(play(saver, thread) for thread in calls.values()))
            elapsed = time.perf_counter() - begin
            cpu, process = time.thread_time() - cpu, time.process_time() - process
    finally:
        await drop_schema(schema)
    return {
        "puts_per_s": puts / elapsed,
        "loop_cpu_us": cpu / puts * 1e6,
        "process_cpu_us": process / puts * 1e6,
    }


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> Any:
        if isinstance(rows[0][key], list):  # per generation
            return [statistics.median(row[key][i] for row in rows) for i in range(3)]
        return statistics.median(row[key] for row in rows)

    return {key: median(key) for key in rows[0]}


def ratios(results: dict[tuple[str, str], dict[str, Any]]) -> None:
    for workload, row in results:
        if not workload.startswith("ours-"):
            continue
        peer = results.get((workload.replace("ours-", "lg-"), row))
        if peer is None:
            continue
        ours = results[(workload, row)]
        line = {"kind": "ratio", "row": row, "system": workload}
        if row == "replayed":
            line["loop_cpu_x"] = round(peer["loop_cpu_us"] / ours["loop_cpu_us"], 2)
            line["process_cpu_x"] = round(peer["process_cpu_us"] / ours["process_cpu_us"], 2)
            emit(line)
            continue
        line["steps_per_s_x"] = round(ours["steps_per_s"] / peer["steps_per_s"], 2)
        line["p99_x"] = round(ours["p99_ms"] / peer["p99_ms"], 2)
        floor = results.get(("noop", row))
        if "loop_cpu_us" in ours and floor is not None:
            # What each saver costs the loop beyond LangGraph's own checkpointing.
            line["loop_cpu_us_above_noop"] = round(ours["loop_cpu_us"] - floor["loop_cpu_us"])
            line["peer_loop_cpu_us_above_noop"] = round(peer["loop_cpu_us"] - floor["loop_cpu_us"])
            line["gc_us_above_noop"] = round(ours["gc_us"] - floor["gc_us"])
            line["peer_gc_us_above_noop"] = round(peer["gc_us"] - floor["gc_us"])
        waits = results.get(("waiting", row))
        if "loop_cpu_us" in ours and waits is not None:
            # What each saver costs the loop beyond a saver that only waits.
            line["loop_cpu_us_above_waiting"] = round(ours["loop_cpu_us"] - waits["loop_cpu_us"])
        if "bytes" in ours and peer["bytes"]:
            line["bytes_fraction"] = round(ours["bytes"] / peer["bytes"], 4)
        emit(line)


async def main(args: argparse.Namespace) -> None:
    always = ("graph-only", "noop", "waiting")
    names = [n for n in SYSTEMS if args.only is None or args.only in n or n in always]
    collected: dict[tuple[str, str], list[dict[str, Any]]] = {}
    calls = await record_calls(args.threads, args.thread_steps)
    if args.freeze:
        # What an application may do once started: the modules' objects (LangGraph,
        # langchain, pydantic: ~125,000) leave every later full collection.
        gc.collect()
        gc.freeze()
    with tempfile.TemporaryDirectory(prefix="lgbench-") as tmp:
        root = Path(tmp)
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else list(reversed(names)):
                if name not in always:
                    row = await replayed(name, root, calls)
                    emit({"kind": "measurement", "system": name, "row": "replayed", **row})
                    collected.setdefault((name, "replayed"), []).append(row)
                row = await growing(name, root, args.steps)
                emit({"kind": "measurement", "system": name, "row": "growing", **row})
                collected.setdefault((name, "growing"), []).append(row)
                row = await concurrent(name, root, args.threads, args.thread_steps)
                emit({"kind": "measurement", "system": name, "row": "concurrent", **row})
                collected.setdefault((name, "concurrent"), []).append(row)
    results = {key: medians(rows) for key, rows in collected.items()}
    for (name, row), values in results.items():
        emit({"kind": "median", "system": name, "row": row, **values})
    ratios(results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--thread-steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument(
        "--freeze", action="store_true", help="gc.freeze() once the imports and calls are made"
    )
    options = parser.parse_args()
    DSN = options.dsn
    sys.exit(asyncio.run(main(options)))
