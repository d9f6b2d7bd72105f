"""The OpenAI Agents SDK session against the SDK's own default durable storage.

    python bench/frameworks.py [--backends sqlite,file,postgres] [--ops 300] [--rounds 3]
                               [--dsn DSN] [--tiny]

OpenAI Agents SDK, one session, against the SDK's ``SQLiteSession`` on a file:

* ``session-add``: ``add_items`` of one ~200-byte message, ``ops`` times;
* ``session-get``: ``get_items(limit=10)`` on that history, ``ops`` times;
* ``session-add-c50``: 50 sessions at once, each ``add_items`` of one message ``ops / 50``
  times (time per add over all of them: what concurrent conversations share).

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

from agents.memory import SQLiteSession

from aiocheckpoint import CheckpointManager, CheckpointStorage
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from aiocheckpoint.storage.file import FileCheckpointStorage as OurFiles
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

BACKENDS = ("sqlite", "file", "postgres")
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


def open_store(backend: str, where: Path, dsn: str) -> CheckpointStorage:
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
    return out


async def one_round(systems: list[str], ops: int, dsn: str) -> dict[str, Timings]:
    results: dict[str, Timings] = {}
    for system in systems:
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp)
            if system == "framework":
                results[system] = await theirs(where, ops)
            else:
                results[system] = await ours(system, where, ops, dsn)
    return results


def summarize(all_rounds: list[dict[str, Timings]], backends: list[str]) -> None:
    rows = list(all_rounds[0]["framework"])
    for row in rows:
        theirs_us = statistics.median(r["framework"][row] for r in all_rounds)
        for backend in backends:
            ours_us = statistics.median(r[backend][row] for r in all_rounds)
            print(
                json.dumps(
                    {
                        "summary": row,
                        "backend": backend,
                        "ours_us": round(ours_us, 1),
                        "framework_us": round(theirs_us, 1),
                        "ratio": round(theirs_us / ours_us, 2),
                    }
                )
            )


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
        systems = ["framework", *backends]
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
