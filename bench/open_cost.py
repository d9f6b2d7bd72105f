"""What a manager per request costs on SQLite, against one manager per process.

    PYTHONPATH=src python bench/open_cost.py [--requests 200] [--rounds 3]

A "request" reads one workflow's latest checkpoint. Three ways, alternated round by round in
one process (the machine is shared: compare rows of one run, not runs):

* ``shared``: one manager for the whole process (the documented pattern);
* ``per request``: ``open_storage(url)`` + a manager, one read, close, every request;
* ``per request, first open``: the same with the process's record of databases whose
  directory entry is durable cleared before each open, i.e. every open fsyncs the
  directory, as every open did before that record existed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiocheckpoint import CheckpointManager, open_storage
from aiocheckpoint.storage.sqlite import connections


async def per_request(url: str) -> None:
    """One request with its own manager."""
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.get_latest_checkpoint("wf")


async def first_open(url: str) -> None:
    """One request with its own manager, on an open that fsyncs the directory."""
    connections._DURABLE.clear()
    await per_request(url)


async def timed(request: Callable[[], Awaitable[None]], count: int) -> float:
    """Milliseconds per request over ``count`` requests."""
    started = time.perf_counter()
    for _ in range(count):
        await request()
    return (time.perf_counter() - started) / count * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        url = f"sqlite://{tmp}/app.db"
        async with CheckpointManager(open_storage(url)) as shared:
            await shared.create_checkpoint("wf", 0, "a", "completed", {"x": 1})
            ways: dict[str, Callable[[], Awaitable[None]]] = {
                "shared": lambda: shared.get_latest_checkpoint("wf"),  # type: ignore[dict-item,return-value]
                "per request": lambda: per_request(url),
                "per request, first open": lambda: first_open(url),
            }
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, request in ways.items():
                    times[name].append(await timed(request, args.requests))
    base = statistics.median(times["shared"])
    print(f"{args.requests} requests x {args.rounds} rounds, median ms per request")
    print("| way | ms per request | x shared |")
    print("|---|---:|---:|")
    for name, values in times.items():
        ms = statistics.median(values)
        print(f"| {name} | {ms:.3f} | {ms / base:.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
