"""The framework integrations against each framework's own default storage.

    python bench/frameworks.py [--backends memory,sqlite,file,postgres] [--ops 300]
                               [--rounds 3] [--dsn DSN] [--tiny] [--only pydantic-ai]

OpenAI Agents SDK, one session, against the SDK's ``SQLiteSession`` on a file:

* ``session-add``: ``add_items`` of one ~200-byte message, ``ops`` times;
* ``session-get``: ``get_items(limit=10)`` on that history, ``ops`` times;
* ``session-add-c50``: 50 sessions at once, each ``add_items`` of one message ``ops / 50``
  times (time per add over all of them: what concurrent conversations share).

Microsoft Agent Framework, one workflow name of ``ops`` chained checkpoints (a few keys of
state, executor states, one message in transit), against its ``FileCheckpointStorage``
(system ``framework``) and its ``InMemoryCheckpointStorage`` (``framework-memory``):

* ``af-save``: ``save`` of each checkpoint;
* ``af-load``: ``load`` by id of each, through the storage object that saved them;
* ``af-load-cold``: ``load`` by id of the oldest ``ops / 10``, each through a new storage
  object (ours then searches the workflow name's records, newest first);
* ``af-latest``: ``get_latest``, ``ops / 10`` times (the framework's storages read every
  checkpoint for it).

pydantic-ai, ``ops / 10`` runs one after another of an agent on a scripted ``FunctionModel``
(three model requests; two tool calls in parallel, then one more), each a new durable run
(``AioCheckpointDurability.run``), against the same agent without durability (system
``pydantic-ai``: plain ``agent.run``; pydantic-ai stores nothing of its own) and made
durable by pydantic-ai's DBOS engine (``DBOSDurability``, each run a ``@DBOS.workflow``),
the one of its engines that needs no server, on a SQLite file (``dbos-sqlite``) and on
PostgreSQL (``dbos-postgres``); each DBOS system runs in a child process of its own (DBOS
is one per process):

* ``pa-run``: wall time per run;
* ``pa-run-cpu``: the process's CPU time per run (all threads: the stores' writer threads
  too, not the PostgreSQL server's).

The summary lines of these rows also give ``units``, the durable units (effects) a run
records, and ``per_unit_us``, what durability adds per unit: (ours - plain) / units;
against DBOS, ``units`` is what DBOS records per run (its steps: the model requests; it
does not make function tools steps).
``--only pydantic-ai`` measures these rows alone.

Each round runs every system on fresh stores, alternating their order; prints one JSON
line per system, row and round (``us_per_op``), then per row the medians and the ratio of
the framework's time to ours (above 1: ours is faster). Timings are ratios within one run:
the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent_framework import FileCheckpointStorage as AfFiles
from agent_framework import InMemoryCheckpointStorage as AfMemory
from agent_framework import WorkflowCheckpoint, WorkflowMessage
from agents.memory import SQLiteSession
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from aiocheckpoint import CheckpointManager, CheckpointStorage
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from aiocheckpoint.integrations.pydantic_ai import AioCheckpointDurability
from aiocheckpoint.storage.file import FileCheckpointStorage as OurFiles
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

BACKENDS = ("memory", "sqlite", "file", "postgres")
#: The reference systems, and the rows each one is compared on.
REFERENCES = ("framework", "framework-memory", "pydantic-ai", "dbos-sqlite", "dbos-postgres")
#: The references of the pydantic-ai rows.
PA_REFERENCES = ("pydantic-ai", "dbos-sqlite", "dbos-postgres")
DSN = "postgresql://postgres@127.0.0.1:5432/test"
Timings = dict[str, float]


def message(n: int) -> Any:
    return {"role": "user", "content": f"message {n}: " + "x" * 180}


async def timed(ops: int, op: Callable[[int], Awaitable[Any]]) -> float:
    """Microseconds per call of ``op(0..ops-1)``, one after another."""
    start = time.perf_counter()
    for n in range(ops):
        await op(n)
    return (time.perf_counter() - start) / ops * 1e6


async def session_rows(session: Any, ops: int) -> Timings:
    add = await timed(ops, lambda n: session.add_items([message(n)]))
    get = await timed(ops, lambda n: session.get_items(limit=10))
    return {"session-add": add, "session-get": get}


CONCURRENT = 50


async def concurrent_adds(sessions: list[Any], ops: int) -> float:
    """Microseconds per add, ``ops`` adds spread over ``sessions`` running at once."""
    each = max(1, ops // len(sessions))

    async def writer(session: Any) -> None:
        for n in range(each):
            await session.add_items([message(n)])

    start = time.perf_counter()
    await asyncio.gather(*(writer(session) for session in sessions))
    return (time.perf_counter() - start) / (each * len(sessions)) * 1e6


def workflow_checkpoint(n: int, previous: str | None) -> WorkflowCheckpoint:
    """A checkpoint as a small workflow saves one at the end of a superstep."""
    message = WorkflowMessage(data=f"payload {n}: " + "x" * 150, source_id="add", target_id="check")
    return WorkflowCheckpoint(
        workflow_name="bench",
        graph_signature_hash="h" * 64,
        previous_checkpoint_id=previous,
        messages={"add": [message]},
        state={
            "total": n,
            "seen": list(range(n % 20)),
            "_executor_state": {"add": {"count": n}, "check": {}},
        },
        iteration_count=n,
    )


async def checkpoint_rows(storage: Any, new_storage: Callable[[], Any], ops: int) -> Timings:
    ids: list[str] = []

    async def save(n: int) -> None:
        ids.append(await storage.save(workflow_checkpoint(n, ids[-1] if ids else None)))

    out = {"af-save": await timed(ops, save)}
    out["af-load"] = await timed(ops, lambda n: storage.load(ids[n]))
    few = max(1, ops // 10)
    out["af-load-cold"] = await timed(few, lambda n: new_storage().load(ids[n]))
    out["af-latest"] = await timed(few, lambda n: storage.get_latest(workflow_name="bench"))
    return out


def trip_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look two cities up (two tool calls at once), book the better one, answer."""
    answers = sum(isinstance(m, ModelResponse) for m in messages)
    if answers == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"city": c}) for c in ("Paris", "Rome")])
    if answers == 1:
        return ModelResponse(parts=[ToolCallPart("book", {"city": "Rome"})])
    return ModelResponse(parts=[TextPart("booked bk-Rome")])


def trip_agent(durability: Any) -> Agent[None, str]:
    """The agent of the pydantic-ai rows, durable with capability ``durability`` (None:
    plain)."""
    capabilities = [] if durability is None else [durability]
    agent = Agent(FunctionModel(trip_model), name="trip", capabilities=capabilities)

    @agent.tool_plain
    async def lookup(city: str) -> int:
        return len(city) * 7

    @agent.tool_plain
    async def book(city: str) -> str:
        return f"bk-{city}"

    return agent


async def agent_rows(run: Callable[[int], Awaitable[Any]], ops: int) -> Timings:
    """Wall and CPU microseconds per ``run(n)``, ``ops / 10`` runs one after another (after
    an untimed one: the agent's first run builds its schemas)."""
    await run(-1)
    runs = max(1, ops // 10)
    cpu = time.process_time()
    wall = await timed(runs, run)
    return {"pa-run": wall, "pa-run-cpu": (time.process_time() - cpu) / runs * 1e6}


async def durable_runs(manager: CheckpointManager, ops: int) -> Timings:
    durability = AioCheckpointDurability[None](manager)
    agent = trip_agent(durability)

    async def run(n: int) -> None:
        await durability.run(agent, "plan a trip", workflow_id=f"trip-{n}")

    out = await agent_rows(run, ops)
    out["pa-units"] = len(await manager.get_effects("trip-0", 0))
    return out


async def plain_runs(ops: int) -> Timings:
    """The same runs without durability: pydantic-ai has no storage of its own."""
    agent = trip_agent(None)
    return await agent_rows(lambda n: agent.run("plan a trip"), ops)


async def dbos_runs(database: str, where: Path, ops: int, dsn: str) -> Timings:
    """The runs as DBOS workflows on ``database`` (``sqlite``, ``postgres``), in this process."""
    from dbos import DBOS, DBOSConfig, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    schema = f"bench_dbos_{uuid.uuid4().hex[:12]}"
    config: DBOSConfig = {
        "name": "bench",
        "system_database_url": f"sqlite:///{where / 'dbos.sqlite'}"
        if database == "sqlite"
        else dsn,
        "dbos_system_schema": schema,
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    agent = trip_agent(DBOSDurability())

    @DBOS.workflow()
    async def trip(prompt: str) -> str:
        return (await agent.run(prompt)).output

    DBOS.launch()
    try:

        async def run(n: int) -> None:
            with SetWorkflowID(f"trip-{n}"):
                await trip("plan a trip")

        out = await agent_rows(run, ops)
        out["pa-units"] = len(await DBOS.list_workflow_steps_async("trip-0"))
    finally:
        DBOS.destroy()
        if database == "postgres":
            await drop_named_schema(schema, dsn)
    return out


async def dbos_child(system: str, where: Path, ops: int, dsn: str) -> Timings:
    """``dbos_runs`` in a child process (DBOS is one per process): its timings."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--dbos-child",
        system.removeprefix("dbos-"),
        "--ops",
        str(ops),
        "--dsn",
        dsn,
        "--where",
        str(where),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the {system} child failed ({proc.returncode})")
    timings: Timings = json.loads(out.splitlines()[-1])
    return timings


def open_store(backend: str, where: Path, dsn: str) -> CheckpointStorage:
    if backend == "memory":
        return InMemoryCheckpointStorage()
    if backend == "sqlite":
        return SQLiteCheckpointStorage(where / "ours.db")
    if backend == "file":
        return OurFiles(where / "ours")
    return PostgresCheckpointStorage(dsn, schema=f"bench_{uuid.uuid4().hex[:12]}", max_size=2)


async def drop_schema(storage: CheckpointStorage, dsn: str) -> None:
    if isinstance(storage, PostgresCheckpointStorage):
        await drop_named_schema(storage.schema, dsn)


async def drop_named_schema(schema: str, dsn: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def ours(backend: str, where: Path, ops: int, dsn: str, only: str | None) -> Timings:
    storage = open_store(backend, where, dsn)
    try:
        async with storage:
            manager = CheckpointManager(storage)
            if only == "pydantic-ai":
                return await durable_runs(manager, ops)
            out = await session_rows(AioCheckpointSession("bench", manager), ops)
            many = [AioCheckpointSession(f"c{n}", manager) for n in range(CONCURRENT)]
            out["session-add-c50"] = await concurrent_adds(many, ops)
            out |= await checkpoint_rows(
                AioCheckpointStorage(manager), lambda: AioCheckpointStorage(manager), ops
            )
            out |= await durable_runs(manager, ops)
    finally:
        await drop_schema(storage, dsn)
    return out


async def theirs(where: Path, ops: int) -> Timings:
    session = SQLiteSession("bench", where / "sdk.db")
    many = [SQLiteSession(f"c{n}", where / "sdk.db") for n in range(CONCURRENT)]
    try:
        out = await session_rows(session, ops)
        out["session-add-c50"] = await concurrent_adds(many, ops)
    finally:
        for one in [session, *many]:
            one.close()
    files = AfFiles(where / "af")
    return out | await checkpoint_rows(files, lambda: AfFiles(where / "af"), ops)


async def theirs_in_memory(ops: int) -> Timings:
    """The framework's in-memory storage (one object: a new one holds nothing)."""
    memory = AfMemory()
    return await checkpoint_rows(memory, lambda: memory, ops)


async def one_round(systems: list[str], ops: int, dsn: str, only: str | None) -> dict[str, Timings]:
    results: dict[str, Timings] = {}
    for system in systems:
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp)
            if system == "framework":
                results[system] = await theirs(where, ops)
            elif system == "framework-memory":
                results[system] = await theirs_in_memory(ops)
            elif system == "pydantic-ai":
                results[system] = await plain_runs(ops)
            elif system.startswith("dbos-"):
                results[system] = await dbos_child(system, where, ops, dsn)
            else:
                results[system] = await ours(system, where, ops, dsn, only)
    return results


def summarize(
    all_rounds: list[dict[str, Timings]], backends: list[str], references: list[str]
) -> None:
    for reference in references:
        for row in all_rounds[0][reference]:
            if row == "pa-units":
                continue
            theirs_us = statistics.median(r[reference][row] for r in all_rounds)
            for backend in backends:
                ours_us = statistics.median(r[backend][row] for r in all_rounds)
                line: dict[str, Any] = {
                    "summary": row,
                    "backend": backend,
                    "reference": reference,
                    "ours_us": round(ours_us, 1),
                    "framework_us": round(theirs_us, 1),
                    "ratio": round(theirs_us / ours_us, 2),
                }
                if reference == "pydantic-ai":
                    units = int(all_rounds[0][backend]["pa-units"])
                    line |= {"units": units, "per_unit_us": round((ours_us - theirs_us) / units, 1)}
                elif reference in PA_REFERENCES:
                    line["units"] = int(all_rounds[0][reference]["pa-units"])
                print(json.dumps(line))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 5 ops, 1 round")
    parser.add_argument("--only", choices=["pydantic-ai"], help="measure one framework's rows")
    parser.add_argument("--dbos-child", choices=["sqlite", "postgres"], help=argparse.SUPPRESS)
    parser.add_argument("--where", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    ops, rounds = (5, 1) if args.tiny else (args.ops, args.rounds)
    if args.dbos_child:
        print(json.dumps(await dbos_runs(args.dbos_child, args.where, ops, args.dsn)))
        return
    all_rounds = []
    references = list(PA_REFERENCES) if args.only else list(REFERENCES)
    for n in range(rounds):
        systems = [*references, *backends]
        if n % 2:
            systems.reverse()
        result = await one_round(systems, ops, args.dsn, args.only)
        for system, timings in result.items():
            for row, us in timings.items():
                if row == "pa-units":
                    continue
                print(json.dumps({"round": n, "system": system, "row": row, "us_per_op": us}))
        all_rounds.append(result)
    summarize(all_rounds, backends, references)


if __name__ == "__main__":
    asyncio.run(main())
