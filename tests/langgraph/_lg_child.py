"""A separate process running a LangGraph thread on AioCheckpointSaver (process tests).

``python -m tests.langgraph._lg_child run URL THREAD STEPS PAUSE [single [GATE]]``: run
(or resume, when the thread has a checkpoint) the loop graph to its end, printing
``step N`` as each step starts and ``done COUNT`` at the end; with ``single`` the saver
uses ``single_writer=True`` and a ``LeaseHeldError`` ends the process with status 3 after
printing ``held``. With ``GATE`` (a path), the third step waits until that file exists.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from aiocheckpoint import LeaseHeldError
from aiocheckpoint.integrations.langgraph import AioCheckpointSaver
from tests.langgraph.graphs import loop_graph, loop_input


def report(count: int) -> None:
    print(f"step {count}", flush=True)
    if count == 2 and len(sys.argv) > 7:
        gate = Path(sys.argv[7])
        while not gate.exists():
            time.sleep(0.02)


async def run(url: str, thread: str, steps: int, pause: float, single: bool) -> int:
    config = {"configurable": {"thread_id": thread}, "recursion_limit": 10_000}
    async with AioCheckpointSaver.from_url(url, single_writer=single, lease_ttl=60.0) as saver:
        graph = loop_graph(saver, steps=steps, pause=pause, report=report)
        started = await saver.aget_tuple(config) is not None
        try:
            final = await graph.ainvoke(None if started else loop_input(), config)
        except LeaseHeldError:
            print("held", flush=True)
            return 3
    print(f"done {final['count']}", flush=True)
    return 0


if __name__ == "__main__":
    url, thread, steps, pause = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    sys.exit(asyncio.run(run(url, thread, steps, pause, sys.argv[6:7] == ["single"])))
