"""The framework integrations against each framework's own default storage.

    python bench/frameworks.py [--backends memory,sqlite,file,postgres] [--ops 300]
                               [--rounds 3] [--dsn DSN] [--tiny]

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

from aiocheckpoint import CheckpointManager, CheckpointStorage
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from aiocheckpoint.storage.file import FileCheckpointStorage as OurFiles
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

BACKENDS = ("memory", "sqlite", "file", "postgres")
#: The framework storages each Agent Framework row is compared with.
AF_REFERENCES = ("framework", "framework-memory")
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
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{storage.schema}" CASCADE')
        finally:
            await conn.close()


async def ours(backend: str, where: Path, ops: int, dsn: str) -> Timings:
    storage = open_store(backend, where, dsn)
    try:
        async with storage:
            manager = CheckpointManager(storage)
            out = await session_rows(AioCheckpointSession("bench", manager), ops)
            many = [AioCheckpointSession(f"c{n}", manager) for n in range(CONCURRENT)]
            out["session-add-c50"] = await concurrent_adds(many, ops)
            out |= await checkpoint_rows(
                AioCheckpointStorage(manager), lambda: AioCheckpointStorage(manager), ops
            )
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


async def one_round(systems: list[str], ops: int, dsn: str) -> dict[str, Timings]:
    results: dict[str, Timings] = {}
    for system in systems:
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp)
            if system == "framework":
                results[system] = await theirs(where, ops)
            elif system == "framework-memory":
                results[system] = await theirs_in_memory(ops)
            else:
                results[system] = await ours(system, where, ops, dsn)
    return results


def summarize(all_rounds: list[dict[str, Timings]], backends: list[str]) -> None:
    for reference in ("framework", "framework-memory"):
        for row in all_rounds[0][reference]:
            theirs_us = statistics.median(r[reference][row] for r in all_rounds)
            for backend in backends:
                ours_us = statistics.median(r[backend][row] for r in all_rounds)
                line = {
                    "summary": row,
                    "backend": backend,
                    "reference": reference,
                    "ours_us": round(ours_us, 1),
                    "framework_us": round(theirs_us, 1),
                    "ratio": round(theirs_us / ours_us, 2),
                }
                print(json.dumps(line))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 5 ops, 1 round")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    ops, rounds = (5, 1) if args.tiny else (args.ops, args.rounds)
    all_rounds = []
    for n in range(rounds):
        systems = ["framework", "framework-memory", *backends]
        if n % 2:
            systems.reverse()
        result = await one_round(systems, ops, args.dsn)
        for system, timings in result.items():
            for row, us in timings.items():
                print(json.dumps({"round": n, "system": system, "row": row, "us_per_op": us}))
        all_rounds.append(result)
    summarize(all_rounds, backends)


if __name__ == "__main__":
    asyncio.run(main())
