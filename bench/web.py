"""The web inspector's server time and memory over large SQLite stores.

    python bench/web.py [--workflows 100000] [--rounds 20] [--db PATH]
                        [--state-mb 50] [--skip-state | --state-only]

Builds (or reuses, with ``--db``) a SQLite store of ``workflows`` workflows, each one
checkpoint through a manager (200 tasks, group commit; every 10th agent failed, every 7th
with checkpoint metadata), then times the inspector's pages in this process through its
ASGI app (httpx's ASGI transport: no socket, so the time is the server's: routing, reads,
rendering): the list page, a list filtered by status, a page far down the list, an id
prefix search, the store page, the throughput page and a workflow page, ``rounds`` times
each, median and worst. Then, unless ``--skip-state``, a workflow whose state is
``state-mb`` MB (strings of 1,000 characters) at two steps one key apart: its step page and
its diff page, time and the peak of Python's allocations while serving them (tracemalloc),
and the size of the HTML (the state's store, ``state.db`` beside ``--db``, is written once
and reused). A step page beyond the first (``?offset=``, a key near the end) is timed too,
and the diff page of a second workflow, a list of about ``state-mb`` MB of messages (dicts
of 1,000 characters) with one appended.

Prints one JSON line per measure. The machine is shared: the load average is printed with
each line; compare runs side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

from aiocheckpoint import CheckpointManager, ResumableWorkflow, open_storage
from aiocheckpoint.web import create_app


def emit(**fields: Any) -> None:
    fields["load"] = round(os.getloadavg()[0], 2)
    print(json.dumps(fields), flush=True)


async def build(url: str, workflows: int) -> float:
    """Write ``workflows`` workflows of one checkpoint each; the seconds it took."""
    async with CheckpointManager(open_storage(url)) as manager:
        queue = iter(range(workflows))

        async def task() -> None:
            for n in queue:
                workflow_id = f"wf-{n:07}"
                status = "failed" if n % 10 == 0 else "completed"
                meta = {"tenant": f"t{n % 50}"} if n % 7 == 0 else None
                await manager.create_checkpoint(
                    workflow_id, 0, "agent", status, {"n": n}, metadata=meta
                )

        began = time.perf_counter()
        await asyncio.gather(*(task() for _ in range(200)))
        return time.perf_counter() - began


async def timed(http: httpx.AsyncClient, target: str, rounds: int) -> dict[str, Any]:
    """Median and worst milliseconds of ``rounds`` GETs of ``target`` (after one warm-up)."""
    first = await http.get(target)
    assert first.status_code == 200, (target, first.status_code, first.text[:300])
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        reply = await http.get(target)
        times.append((time.perf_counter() - began) * 1000)
        assert reply.status_code == 200
    return {
        "page": target,
        "median_ms": round(statistics.median(times), 1),
        "worst_ms": round(max(times), 1),
        "html_bytes": len(first.content),
    }


async def pages(url: str, workflows: int, rounds: int) -> None:
    async with CheckpointManager(open_storage(url)) as manager:
        app = create_app(manager, url)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            middle = f"wf-{workflows // 2:07}"
            for target in [
                "/",
                "/?status=unfinished",
                f"/?after={middle}",
                f"/?q=wf-{workflows // 3:07}"[:-2],
                "/store",
                "/throughput",
                f"/workflow?id={middle}",
            ]:
                emit(workflows=workflows, **await timed(http, target, rounds))


async def big_state(url: str, megabytes: int) -> None:
    """A workflow of a ``megabytes`` MB state at two steps: its step and diff pages.

    The workflow is written once: a store that holds it already (``--db``'s state.db) is
    reused, so that runs of two versions compare pages over the same store.
    """
    async with CheckpointManager(open_storage(url)) as manager:
        if not await manager.has_checkpoint("big-state", 1):
            async with ResumableWorkflow("big-state", manager) as wf:
                async with wf.step(0, agent_id="a"):
                    for n in range(megabytes * 1000):
                        wf.state.set(f"k{n:06}", "x" * 1000)
                async with wf.step(1, agent_id="a"):
                    wf.state.set("k000000", "y")
        if not await manager.has_checkpoint("big-list", 1):
            async with ResumableWorkflow("big-list", manager) as wf:
                messages = [
                    {"role": "user", "content": f"{n}:" + "x" * 990}
                    for n in range(megabytes * 1000)
                ]
                async with wf.step(0, agent_id="a"):
                    wf.state.set("messages", messages)
                async with wf.step(1, agent_id="a"):
                    wf.state.set("messages", [*messages, {"role": "ai", "content": "new"}])
    async with CheckpointManager(open_storage(url)) as manager:
        app = create_app(manager, url)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            last = f'["k{megabytes * 1000 - 1:06}"]'
            for target in [
                "/step?id=big-state&step=1",
                "/step?id=big-state&step=1&path=%5B%5D&offset=25000",
                f"/step?id=big-state&step=1&path={last}",
                "/diff?id=big-state&step=1",
                "/diff?id=big-list&step=1",
            ]:
                tracemalloc.start()
                began, cpu = time.perf_counter(), time.process_time()
                reply = await http.get(target)
                took = (time.perf_counter() - began) * 1000
                cpu_ms = (time.process_time() - cpu) * 1000
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                assert reply.status_code == 200, reply.text[:300]
                emit(
                    page=target,
                    state_mb=megabytes,
                    ms=round(took, 1),
                    cpu_ms=round(cpu_ms, 1),
                    peak_mb=round(peak / 2**20, 1),
                    html_bytes=len(reply.content),
                )
                emit(**await timed(http, target, 3), state_mb=megabytes, note="untraced")


async def run(args: argparse.Namespace) -> None:
    where = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "web.db"
    url = f"sqlite:///{where}"
    if not where.exists():
        seconds = await build(url, args.workflows)
        emit(built=args.workflows, seconds=round(seconds, 1), db_bytes=where.stat().st_size)
    if not args.state_only:
        await pages(url, args.workflows, args.rounds)
    if not args.skip_state:
        await big_state(f"sqlite:///{where.parent / 'state.db'}", args.state_mb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--db", help="reuse (or build once) the store at this path")
    parser.add_argument("--state-mb", type=int, default=50)
    parser.add_argument("--skip-state", action="store_true")
    parser.add_argument("--state-only", action="store_true", help="only the large state's pages")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
