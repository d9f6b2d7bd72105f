"""Large states (issues #6 and #9): event-loop lag, split/join speed, resume, small writes.

    python bench/large_state.py [--quick] [--compare OTHER_SRC] [--rounds N]

Measures, in one process per source tree:

* ``lag``: a 1 ms heartbeat's lateness (p50/p99/max) while 20 workflows write ~1 MB states
  (bench workload 2, "20x1MB") through ``CheckpointManager`` on the memory store, the file
  store (incremental, and ``incremental=False``) and SQLite;
* ``split``/``join``: MB/s (of CPU time) of ``split_state`` (exact and, where it exists,
  ``finite=True``) and ``join_state`` on the 1 MB state with an in-memory fetch, next to
  the version-1 ``encode_checkpoint``/``decode_checkpoint``;
* ``resume``: ``get_resume_point`` of a ~10 MB state on the file store, incremental vs
  ``incremental=False`` (wall time); and the same decode with blobs in a dict (CPU time);
* ``small``: ~1 KB writes per second on the file store, incremental vs not;
* ``shared`` (instead of ``lag``): the lag runs with each workflow's state in a
  ``SharedState`` (whose copy the manager takes in slices) on the memory and file stores;
* ``floor``: ``get_resume_point`` of the ~10 MB state on the file and SQLite stores (median
  wall time, and process CPU time) against raw floors measured alternately in the same
  process: read the state's compact JSON from a file, or as one row of a SQLite table (in a
  worker thread), and ``json.loads`` it;
* ``huge``: a 1 ms heartbeat's lateness (max) while one 50 MB value is written and read
  on the file and SQLite stores (issue #21): a ``SharedState`` holding one 50 MB string, and
  one holding a 50,000-message chat (~1 KB each): its first checkpoint, a second one with
  another key changed, and ``get_resume_point``; for the string also a worker thread that
  only joins its ~1 MB slices into one ``str`` (``join_floor``: the one copy its read cannot
  avoid). Each as ``max`` (the heartbeat's lateness) and ``hold``: the longest CPU time one
  thread ran while a watcher thread waited for the GIL, which other processes' load does
  not inflate (Linux).

``--compare OTHER_SRC`` runs the same measurements against another checkout's ``src`` (for
example the main branch) in alternating child processes, ``--rounds`` times each, and
prints medians side by side with the ratio this/other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent


def _mb_s(seconds: float, nbytes: int) -> float:
    return nbytes / seconds / 1e6


def _best(call: Any, repeats: int) -> float:
    """Median CPU time of ``call()`` over ``repeats`` runs (after one warm-up).

    CPU rather than wall time: on a shared machine it does not count the time other
    processes hold the cores (the calls measured here are single-threaded, no I/O).
    """
    call()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return statistics.median(times)


def cpu(quick: bool) -> dict[str, float]:
    """Split, join and version-1 encode/decode speeds on the 1 MB documents state."""
    import inspect

    from aiocheckpoint.codec.copy import storable_copy
    from aiocheckpoint.codec.tree.join import join_state
    from aiocheckpoint.codec.tree.split import split_state
    from aiocheckpoint.codec.v1 import decode_checkpoint, encode_checkpoint
    from aiocheckpoint.models import AgentStatus, Checkpoint, StateSnapshot
    from bench.data import DocStates

    state, _ = storable_copy(DocStates.of(1_000_000).at(1))
    checkpoint = Checkpoint(
        workflow_id="wf",
        step=1,
        agent_id="a",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data=state),
    )
    record = encode_checkpoint(checkpoint, finite=True)
    size = len(record)
    n = 5 if quick else 15
    out = {
        "v1_encode_MB_s": _mb_s(_best(lambda: encode_checkpoint(checkpoint, finite=True), n), size),
        "v1_decode_MB_s": _mb_s(_best(lambda: decode_checkpoint(record), n), size),
        "split_exact_MB_s": _mb_s(_best(lambda: split_state(state), n), size),
    }
    kwargs: dict[str, Any] = {}
    if "finite" in inspect.signature(split_state).parameters:
        kwargs["finite"] = True
        out["split_fast_MB_s"] = _mb_s(_best(lambda: split_state(state, finite=True), n), size)
    split = split_state(state, **kwargs)
    blobs = split.blobs

    def fetch(hashes: Any) -> dict[bytes, bytes]:
        return {h: blobs[h] for h in hashes}

    out["join_MB_s"] = _mb_s(_best(lambda: join_state(split.root, fetch), n), size)
    return out


async def _lag_run(manager: Any, seconds: float, shared: bool = False) -> dict[str, float]:
    """20 workflows write ~1 MB states for ``seconds`` while a heartbeat measures lateness.

    With ``shared``, each workflow keeps its state in a ``SharedState`` whose counter it
    sets before each checkpoint, instead of handing over a plain dict.
    """
    from aiocheckpoint import SharedState
    from bench.data import DocStates
    from bench.workloads import Heartbeat

    docs = DocStates.of(1_000_000)
    workflows = [f"wf-{i}" for i in range(20)]
    states = {wf: SharedState(docs.at(0)) for wf in workflows} if shared else {}

    def state_at(wf: str, step: int) -> Any:
        if not shared:
            return docs.at(step)
        states[wf].set("counter", step)
        return states[wf]

    await asyncio.gather(
        *(manager.create_checkpoint(wf, 0, "a", "completed", state_at(wf, 0)) for wf in workflows)
    )
    heartbeat = Heartbeat()
    heartbeat.start()
    deadline = time.perf_counter() + seconds
    written = 0

    async def writer(wf: str) -> None:
        nonlocal written
        step = 1
        while time.perf_counter() < deadline:
            await manager.create_checkpoint(wf, step, "a", "completed", state_at(wf, step))
            written += 1
            step += 1
            await asyncio.sleep(0)

    await asyncio.gather(*(writer(wf) for wf in workflows))
    figures = await heartbeat.stop()
    return {
        "p50_ms": figures["lag_p50_ms"],
        "p99_ms": figures["lag_p99_ms"],
        "max_ms": figures["lag_max_ms"],
        "writes_s": written / seconds,
    }


async def lag(quick: bool, parts: str) -> dict[str, float]:
    """Workload 2 with 20 writers of ~1 MB states, per backend (SharedState ones: "shared")."""
    from aiocheckpoint import CheckpointManager, open_storage

    out: dict[str, float] = {}
    for name, url, options, shared in (
        ("memory", "memory://", {}, False),
        ("file", "file://{dir}/store", {}, False),
        ("file-v1", "file://{dir}/store", {"incremental": False}, False),
        ("sqlite", "sqlite://{dir}/store.db", {}, False),
        ("shared-memory", "memory://", {}, True),
        ("shared-file", "file://{dir}/store", {}, True),
    ):
        if shared != ("shared" in parts):
            continue
        with tempfile.TemporaryDirectory(prefix="ackp-lag-") as tmp:
            async with CheckpointManager(open_storage(url.format(dir=tmp)), **options) as manager:
                figures = await _lag_run(manager, 1.0 if quick else 2.0, shared)
        out.update({f"lag_{name}_{key}": value for key, value in figures.items()})
    return out


async def slices(quick: bool) -> dict[str, float]:
    """CPU time the event loop's thread spends in each callback during the 20 x 1 MB run.

    Unlike the heartbeat's lateness, CPU time does not count the time other processes hold
    the cores, so on a loaded machine it shows what the loop itself is asked to do: a round
    over 20 busy writers costs the heartbeat about 20 of these slices.
    """
    from aiocheckpoint import CheckpointManager, open_storage

    run = asyncio.events.Handle._run
    spent: list[float] = []

    def timed(handle: asyncio.events.Handle) -> None:
        start = time.thread_time()
        run(handle)
        spent.append(time.thread_time() - start)

    out: dict[str, float] = {}
    for name, url in (("memory", "memory://"), ("file", "file://{dir}/store")):
        with tempfile.TemporaryDirectory(prefix="ackp-slices-") as tmp:
            async with CheckpointManager(open_storage(url.format(dir=tmp))) as manager:
                asyncio.events.Handle._run = timed  # type: ignore[method-assign]
                try:
                    await _lag_run(manager, 1.0 if quick else 2.0)
                finally:
                    asyncio.events.Handle._run = run  # type: ignore[method-assign]
        spent.sort()
        out[f"slice_{name}_p50_ms"] = spent[len(spent) // 2] * 1e3
        out[f"slice_{name}_p99_ms"] = spent[int(len(spent) * 0.99)] * 1e3
        out[f"slice_{name}_max_ms"] = spent[-1] * 1e3
        spent.clear()
    return out


_FLOOR_STORES: Final = (("file", "file://{dir}/store"), ("sqlite", "sqlite://{dir}/store.db"))


async def floor(quick: bool) -> dict[str, float]:
    """Resume of the 10 MB state against raw floors: a file, or one SQLite row, + ``json.loads``.

    Each store's resume alternates with both floors in the same process; wall time and the
    process's CPU time (every thread: robust to other processes' load) are medians.
    """
    import sqlite3

    from aiocheckpoint import CheckpointManager, open_storage
    from bench.data import DocStates

    big = DocStates.of(10_000_000).at(1)
    calls = 3 if quick else 7
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ackp-floor-") as tmp:
        text = json.dumps(big, separators=(",", ":")).encode()
        raw = Path(tmp, "raw.json")
        await asyncio.to_thread(raw.write_bytes, text)
        db = sqlite3.connect(Path(tmp, "raw.db"), isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE ck (k INTEGER PRIMARY KEY, data BLOB)")
        db.execute("INSERT INTO ck VALUES (1, ?)", (text,))

        def row() -> Any:
            return json.loads(db.execute("SELECT data FROM ck WHERE k = 1").fetchone()[0])

        async def floor_call() -> Any:
            return json.loads(await asyncio.to_thread(raw.read_bytes))

        for name, url in _FLOOR_STORES:
            async with CheckpointManager(open_storage(url.format(dir=tmp))) as manager:
                await manager.create_checkpoint("wf", 1, "a", "completed", big)
                calls_of = {
                    "ours": lambda: manager.get_resume_point("wf"),
                    "raw": floor_call,
                    "row": lambda: asyncio.to_thread(row),
                }
                out.update(await _alternate(name, calls_of, calls))
        db.close()
    return out


async def _alternate(name: str, calls_of: dict[str, Any], calls: int) -> dict[str, float]:
    """Wall and CPU medians of each call, run in turns; ours over each floor."""
    wall: dict[str, list[float]] = {who: [] for who in calls_of}
    cpu: dict[str, list[float]] = {who: [] for who in calls_of}
    for i in range(calls + 1):  # the first round warms up
        for who, call in calls_of.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            assert await call() is not None
            if i:
                wall[who].append(time.perf_counter() - start)
                cpu[who].append(time.process_time() - start_cpu)
    ours, floor_ms, row_ms = (statistics.median(wall[w]) * 1e3 for w in ("ours", "raw", "row"))
    ours_cpu, row_cpu = (statistics.median(cpu[w]) * 1e3 for w in ("ours", "row"))
    return {
        f"resume_{name}_ms": ours,
        f"resume_{name}_floor_ms": floor_ms,
        f"resume_{name}_over_floor": ours / floor_ms,
        f"resume_{name}_over_sqlite_row": ours / row_ms,
        f"resume_{name}_cpu_ms": ours_cpu,
        f"resume_{name}_cpu_over_sqlite_row": ours_cpu / row_cpu,
    }


def _huge_states() -> dict[str, dict[str, Any]]:
    from bench.data import text

    chat = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text(1000, seed=i % 97)}
        for i in range(50_000)
    ]
    return {"string": {"blob": "x" * 50_000_000, "n": 0}, "chat": {"messages": chat, "n": 0}}


class _Holds:
    """The longest stretch of CPU one thread of the process ran while a watcher waited.

    A watcher thread wakes every 0.5 ms and reads every other thread's CPU clock: what a
    thread used between two of its wake-ups is, at most, how long it kept the watcher (which
    needs the GIL to wake) waiting. Unlike a heartbeat's lateness, the time the process
    waits for a core is not counted, so on a loaded machine this still shows the longest
    GIL hold (or loop callback) of the code measured. Linux (per-thread CPU clocks).
    """

    def __init__(self) -> None:
        self.longest = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _Holds:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _clocks(self) -> dict[int, int]:
        me = threading.get_ident()
        return {
            t.ident: time.pthread_getcpuclockid(t.ident)
            for t in threading.enumerate()
            if t.ident is not None and t.ident != me
        }

    def _watch(self) -> None:
        clocks, last = self._clocks(), {}
        while not self._done.wait(0.0005):
            now = {}
            for ident, clock in list(clocks.items()):
                try:
                    now[ident] = time.clock_gettime(clock)
                except OSError:  # the thread ended
                    continue
                self.longest = max(self.longest, now[ident] - last.get(ident, now[ident]))
            clocks, last = {**clocks, **self._clocks()}, now


async def _lag_of(call: Any) -> tuple[float, float]:
    """Heartbeat lateness max and the longest hold (:class:`_Holds`), in ms, while ``call()``
    is awaited.

    What the call returns is dropped after the heartbeat stops: freeing a resumed 50 MB
    value is the caller's work (a 50,000-message chat: ~10 ms on the thread that drops it),
    not the call's.
    """
    from bench.workloads import Heartbeat

    heartbeat = Heartbeat()
    with _Holds() as holds:
        heartbeat.start()
        await asyncio.sleep(0.005)
        result = await call()
        await asyncio.sleep(0.005)
        figures = await heartbeat.stop()
    del result
    return figures["lag_max_ms"], holds.longest * 1e3


def _join_floor(parts: list[str]) -> str:
    """The one copy a read of a long string cannot avoid: its ~1 MB slices into one ``str``."""
    return "".join(parts)


async def huge(quick: bool) -> dict[str, float]:
    """Loop lag while a 50 MB string or a 50,000-message chat is written and read."""
    from aiocheckpoint import CheckpointManager, SharedState, open_storage

    out: dict[str, float] = {}
    out["huge_idle_max_ms"], out["huge_idle_hold_ms"] = await _lag_of(lambda: asyncio.sleep(0.2))
    for kind, state in _huge_states().items():
        for name, url in _FLOOR_STORES:
            with tempfile.TemporaryDirectory(prefix="ackp-huge-") as tmp:
                async with CheckpointManager(open_storage(url.format(dir=tmp))) as manager:
                    figures = await _huge_rounds(manager, SharedState(state), state)
            for k, (lag, hold) in figures.items():
                out[f"huge_{kind}_{name}_{k}_max_ms"] = lag
                out[f"huge_{kind}_{name}_{k}_hold_ms"] = hold
    return out


async def _huge_rounds(
    manager: Any, shared: Any, state: dict[str, Any]
) -> dict[str, tuple[float, float]]:
    """Lag max and longest hold of a first checkpoint, a second with another key changed,
    and a resume.

    ``state`` is what ``shared`` was made from (for a string, its read's floor is measured).
    """

    def save(step: int) -> Any:
        return lambda: manager.create_checkpoint("wf", step, "a", "running", shared)

    # Warm up: the first checkpoint and read of a process import and open what they use.
    await manager.create_checkpoint("warm", 0, "a", "running", {"n": 0})
    await manager.get_resume_point("warm")

    out = {}
    out["write"] = await _lag_of(save(1))
    shared.set("n", 1)
    out["next"] = await _lag_of(save(2))
    out["read"] = await _lag_of(lambda: manager.get_resume_point("wf"))
    value = state.get("blob")
    if isinstance(value, str):  # the floor of its read, in the same process and store state
        step = 1024 * 1024
        parts = [value[i : i + step] for i in range(0, len(value), step)]
        out["join_floor"] = await _lag_of(lambda: asyncio.to_thread(_join_floor, parts))
    return out


def _read_blobs(root: Path) -> dict[bytes, bytes]:
    """Every blob of a file store, read into a dict (for a CPU-only decode)."""
    return {bytes.fromhex(p.name): p.read_bytes() for p in root.glob("??/*") if len(p.name) > 8}


def _decode_seconds(data: bytes, blobs: dict[bytes, bytes] | None, calls: int) -> float:
    """CPU time of decoding one record with its blobs in a dict (no I/O)."""
    from aiocheckpoint.codec.tree.v2 import decode_checkpoint_v2
    from aiocheckpoint.codec.v1 import decode_checkpoint

    if blobs is None:
        return _best(lambda: decode_checkpoint(data), calls)
    return _best(lambda: decode_checkpoint_v2(data, lambda hs: {h: blobs[h] for h in hs}), calls)


async def resume_and_small(quick: bool) -> dict[str, float]:
    """10 MB resume and ~1 KB write rate on the file store, incremental vs not."""
    from aiocheckpoint import CheckpointManager
    from aiocheckpoint.storage.file import FileCheckpointStorage
    from bench.data import DocStates, small_state

    big = DocStates.of(10_000_000).at(1)
    out: dict[str, float] = {}
    calls = 3 if quick else 7
    with tempfile.TemporaryDirectory(prefix="ackp-resume-") as tmp:
        for incremental in (False, True):
            label = "v2" if incremental else "v1"
            storage = FileCheckpointStorage(os.path.join(tmp, label))
            async with CheckpointManager(storage, incremental=incremental) as manager:
                await manager.create_checkpoint("wf", 1, "a", "completed", big)
                await manager.get_resume_point("wf")
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    await manager.get_resume_point("wf")
                    times.append(time.perf_counter() - start)
                out[f"resume_{label}_ms"] = statistics.median(times) * 1e3
                stored = await storage.load("wf", 1)
                assert stored is not None
                blobs = None
                if incremental:
                    blobs = await asyncio.to_thread(_read_blobs, Path(tmp, label, "blobs"))
                out[f"resume_{label}_cpu_ms"] = _decode_seconds(stored.data, blobs, calls) * 1e3
                n = 100 if quick else 300
                start = time.perf_counter()
                for step in range(n):
                    await manager.create_checkpoint(
                        "small", step, "a", "running", small_state(step)
                    )
                out[f"small_{label}_writes_s"] = n / (time.perf_counter() - start)
    out["resume_ratio_v2_v1"] = out["resume_v2_ms"] / out["resume_v1_ms"]
    out["resume_cpu_ratio_v2_v1"] = out["resume_v2_cpu_ms"] / out["resume_v1_cpu_ms"]
    out["small_time_ratio_v2_v1"] = out["small_v1_writes_s"] / out["small_v2_writes_s"]
    return out


def child(src: str, quick: bool, parts: str) -> None:
    sys.path[:0] = [src, str(ROOT)]
    out: dict[str, Any] = {"src": src}
    if "cpu" in parts:
        out.update(cpu(quick))
    if "lag" in parts or "shared" in parts:
        out.update(asyncio.run(lag(quick, parts)))
    if "slices" in parts:
        out.update(asyncio.run(slices(quick)))
    if "resume" in parts:
        out.update(asyncio.run(resume_and_small(quick)))
    if "floor" in parts:
        out.update(asyncio.run(floor(quick)))
    if "huge" in parts:
        out.update(asyncio.run(huge(quick)))
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--compare", help="another checkout's src directory (the baseline)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="cpu,lag,resume")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.quick, args.parts)
        return
    sources = {"this": str(ROOT / "src")}
    if args.compare:
        sources["other"] = str(Path(args.compare).resolve())
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    for _ in range(args.rounds):
        for name, src in sources.items():
            command = [sys.executable, __file__, "--child", src, "--parts", args.parts]
            if args.quick:
                command.append("--quick")
            env = {**os.environ, "PYTHONPATH": src}
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = [k for k in results["this"][0] if k != "src"]
    print(f"{'figure':28s} " + " ".join(f"{n:>10s}" for n in sources) + "  this/other")
    for key in keys:
        values = [
            statistics.median(r.get(key, float("nan")) for r in results[name]) for name in sources
        ]
        ratio = ""
        if len(values) == 2 and values[1] and values[0] == values[0]:
            ratio = f"{values[0] / values[1]:10.2f}"
        print(f"{key:28s} " + " ".join(f"{v:10.2f}" for v in values) + f"  {ratio}")


if __name__ == "__main__":
    main()
