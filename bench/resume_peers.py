"""Resume of a ~10 MB state on SQLite: ours against LangGraph's ``aget_tuple`` and the floor.

    python bench/resume_peers.py [--rounds N] [--states docs,short] [--only ours,lg,floor]
                                 [--mb 10]

For each state (``docs``: the bench's 10,000 documents of ~1 KB, as ``bench/run.py``'s
resume row; ``short``: a dict of 100,000 keys holding ~100-byte strings), in one process
and in turns (round robin, the first round a warm-up):

* ``ours``: ``CheckpointManager.get_resume_point`` on the SQLite store, the state saved
  as a plain dict;
* ``ours-shared``: the same, the state saved as a ``SharedState``;
* ``lg``: LangGraph's ``AsyncSqliteSaver.aget_tuple`` of a checkpoint whose channel
  values are the same dict (one channel per top-level key);
* ``floor``: one SQLite row holding the state's compact JSON, read in a worker thread,
  and ``orjson.loads`` of it (the raw read + decode floor).

Reported per call kind: median wall time, median process CPU time (every thread: robust to
other processes' load), and the longest heartbeat lateness on the event loop during the
call (``lag``: how long the loop was blocked), then the ratios ours/lg and ours/floor.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]


def states(mb: float = 10) -> dict[str, dict[str, Any]]:
    """The two plain states of ~``mb`` MB, by name."""
    from bench.data import DocStates, text

    short = {f"key-{i:06d}": text(100, seed=i % 997) for i in range(int(mb * 10_000))}
    return {"docs": DocStates.of(int(mb * 1_000_000)).at(1), "short": short}


async def _lg_saver(path: Path, state: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    import aiosqlite
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(str(path))
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    config: dict[str, Any] = {"configurable": {"thread_id": "wf", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = dict(state)
    versions = {key: saver.get_next_version(None, None) for key in state}
    checkpoint["channel_versions"] = versions
    await saver.aput(config, checkpoint, {"source": "loop", "step": 1, "parents": {}}, versions)
    return conn, saver, config


class _Lag:
    """The longest lateness of a 1 ms heartbeat while running."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._on = True

    async def beat(self) -> None:
        while self._on:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - start - 0.001)

    def stop(self) -> None:
        self._on = False


async def _timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, float, float]:
    lag = _Lag()
    task = asyncio.create_task(lag.beat())
    await asyncio.sleep(0.002)
    start, start_cpu = time.perf_counter(), time.process_time()
    result = await call()
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    lag.stop()
    await task
    assert result is not None
    del result
    return wall, cpu, lag.worst


async def run_state(name: str, state: dict[str, Any], rounds: int, only: set[str]) -> None:
    import orjson

    from aiocheckpoint import CheckpointManager, SharedState, open_storage

    with tempfile.TemporaryDirectory(prefix="ackp-resume-") as tmp:
        calls: dict[str, Callable[[], Awaitable[Any]]] = {}
        closers: list[Callable[[], Awaitable[Any]]] = []
        if "ours" in only:
            plain = CheckpointManager(open_storage(f"sqlite://{tmp}/plain.db"))
            await plain.create_checkpoint("wf", 1, "a", "completed", state)
            shared = CheckpointManager(open_storage(f"sqlite://{tmp}/shared.db"))
            await shared.create_checkpoint("wf", 1, "a", "completed", SharedState(state))
            calls["ours"] = lambda: plain.get_resume_point("wf")
            calls["ours-shared"] = lambda: shared.get_resume_point("wf")
            closers += [plain.close, shared.close]
        if "lg" in only:
            conn, saver, config = await _lg_saver(Path(tmp, "lg.db"), state)
            calls["lg"] = lambda: saver.aget_tuple(config)
            closers.append(conn.close)
        if "floor" in only:
            db = sqlite3.connect(Path(tmp, "raw.db"), isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE ck (k INTEGER PRIMARY KEY, data BLOB)")
            db.execute("INSERT INTO ck VALUES (1, ?)", (orjson.dumps(state),))

            def row() -> Any:
                return orjson.loads(db.execute("SELECT data FROM ck WHERE k = 1").fetchone()[0])

            calls["floor"] = lambda: asyncio.to_thread(row)
        wall: dict[str, list[float]] = {who: [] for who in calls}
        cpu: dict[str, list[float]] = {who: [] for who in calls}
        lag: dict[str, list[float]] = {who: [] for who in calls}
        for i in range(rounds + 1):
            for who, call in calls.items():
                w, c, g = await _timed(call)
                if i:
                    wall[who].append(w)
                    cpu[who].append(c)
                    lag[who].append(g)
        for close in closers:
            await close()
    med = {who: statistics.median(wall[who]) * 1e3 for who in calls}
    for who in calls:
        cpu_ms = statistics.median(cpu[who]) * 1e3
        print(
            f"{name:6} {who:12} wall {med[who]:7.2f} ms  cpu {cpu_ms:7.2f}"
            f" ms  lag max {statistics.median(lag[who]) * 1e3:6.2f} ms"
            f"  (wall min {min(wall[who]) * 1e3:.2f})"
        )
    for who in ("ours", "ours-shared"):
        for peer in ("lg", "floor"):
            if who in med and peer in med:
                cpu_ratio = statistics.median(cpu[who]) / statistics.median(cpu[peer])
                print(
                    f"{name:6} {who}/{peer}: wall {med[who] / med[peer]:.2f}x  cpu {cpu_ratio:.2f}x"
                )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--states", default="docs,short")
    parser.add_argument("--only", default="ours,lg,floor")
    parser.add_argument("--mb", type=float, default=10, help="the states' size")
    args = parser.parse_args()
    chosen = states(args.mb)
    for name in args.states.split(","):
        await run_state(name, chosen[name], args.rounds, set(args.only.split(",")))


if __name__ == "__main__":
    asyncio.run(main())
