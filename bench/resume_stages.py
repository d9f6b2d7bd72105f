"""Where a 10 MB resume on SQLite goes, stage by stage, next to LangGraph's ``aget_tuple``.

    python bench/resume_stages.py [--rounds N] [--states docs,short] [--mb 10]

For each state of ``bench/resume_peers.py`` (``docs``, ``short``), saved as a plain dict
and as a ``SharedState`` on the SQLite store, in one process and in turns (round robin,
the first round a warm-up), CPU time of:

* ``resume``: ``CheckpointManager.get_resume_point`` (the process's CPU, every thread);
* ``fetch``: the tree's levels fetched by the store's read thread in one read transaction,
  as a resume fetches them (the store's connection and page cache; thread CPU);
* ``decode``: ``decode_tagged`` of the record over the blobs already in memory (verifies,
  joins and parses: thread CPU), and three of its parts measured alone over the plain
  dict's leaf chunks: ``crc32`` of their text, the ``joins`` of runs of chunks and the ``parse``
  (``orjson.loads`` per run, each run's list or dict merged into the value), of which
  ``parse-runs`` is the parse alone (each run's value dropped: ``parse - parse-runs`` is the
  merge); ``rest`` is ``resume - fetch - decode`` (the record's read, the hops between
  threads, the value stage, the models); and ``json-whole``, one ``orjson.loads`` of the
  state's whole text (the floor's parse);
* ``lg``: ``AsyncSqliteSaver.aget_tuple`` (process CPU), its ``lg-row`` (the checkpoint
  row's ``SELECT`` on a connection with SQLite's default page cache, as aiosqlite's) and
  ``lg-loads`` (its serializer's ``loads_typed`` of that row);
* a binary leaf kind's floor: the same leaf chunks re-encoded with msgpack, decoded one by
  one by ``ormsgpack.unpackb`` and merged (``mp-parse``), and the CRC-32 of those bytes
  (``mp-crc32``) or their XXH3-64 (``mp-xxh3``, when ``xxhash`` is installed: it is no
  dependency of ours), what a msgpack leaf kind would take in place of ``crc32 + joins +
  parse``; and ``mp-whole``, one ``unpackb`` of the whole state (LangGraph's way).

Medians over the rounds, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sqlite3
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.resume_peers import _lg_saver, states  # noqa: E402


def _cpu(call: Callable[[], Any]) -> float:
    start = time.thread_time()
    result = call()
    took = time.thread_time() - start
    del result
    return took * 1e3


async def _process_cpu(call: Callable[[], Any]) -> float:
    start = time.process_time()
    result = await call()
    took = time.process_time() - start
    del result
    return took * 1e3


class _Ours:
    """A store holding the state, the record and its tree's levels as a resume fetches them."""

    def __init__(self, manager: Any, storage: Any) -> None:
        self.manager, self.storage = manager, storage
        self.levels: list[list[bytes]] = []
        self.blobs: dict[bytes, bytes] = {}
        self.data = b""

    async def prepare(self) -> None:
        from aiocheckpoint.codec.tree.v2 import decode_tagged

        stored = await self.storage.load("wf")
        self.data = stored.data

        def record(fetch: Callable[[Collection[bytes]], Mapping[bytes, bytes]]) -> None:
            def recording(hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
                self.levels.append(list(hashes))
                got = fetch(hashes)
                self.blobs.update(got)
                return got

            decode_tagged(self.data, recording)

        await self.storage.read_blobs_in_thread(record)

    async def fetch(self) -> float:
        levels = self.levels

        def fetch_all(fetch: Callable[[Collection[bytes]], Mapping[bytes, bytes]]) -> float:
            return _cpu(lambda: [fetch(level) for level in levels])

        took: float = await self.storage.read_blobs_in_thread(fetch_all)
        return took

    def decode(self) -> float:
        from aiocheckpoint.codec.tree.v2 import decode_tagged

        blobs = self.blobs
        return _cpu(lambda: decode_tagged(self.data, lambda _hashes: blobs))

    def leaves(self) -> tuple[list[bytes], type]:
        """The leaf chunks of the largest list or dict of the state, and its kind."""
        from aiocheckpoint.format.tree import PLAIN_LEAF

        skip = len(PLAIN_LEAF)
        leaves = [self.blobs[h] for h in self.levels[-1] if self.blobs[h].startswith(PLAIN_LEAF)]
        lists = [b for b in leaves if b[skip : skip + 1] == b"["]
        dicts = [b for b in leaves if b[skip : skip + 1] == b"{"]
        return (lists, list) if len(lists) >= len(dicts) else (dicts, dict)


def _parts(state: Any, leaves: list[bytes], kind: type) -> dict[str, Callable[[], Any]]:
    """The decode's parts over ``leaves``, and a msgpack leaf kind's, as calls to time."""
    import collections

    import orjson
    import ormsgpack

    from aiocheckpoint.codec.tree.join import _runs
    from aiocheckpoint.format.tree import PLAIN_LEAF

    skip = len(PLAIN_LEAF)
    runs = list(_runs(leaves))
    packed = [ormsgpack.packb(orjson.loads(memoryview(b)[skip:])) for b in leaves]
    whole = ormsgpack.packb(state)
    text = orjson.dumps(state)

    def merged(parts: list[bytes], parse: Callable[[Any], Any]) -> Any:
        out = kind()
        add = out.extend if kind is list else out.update
        for part in parts:
            add(parse(part))
        return out

    def crc(blobs: list[bytes], start: int) -> int:
        value = 0
        for blob in blobs:
            value = zlib.crc32(memoryview(blob)[start:], value)
        return value

    calls = {
        "crc32": lambda: crc(leaves, skip),
        "joins": lambda: list(_runs(leaves)),
        "parse": lambda: merged(runs, orjson.loads),
        "parse-runs": lambda: collections.deque(map(orjson.loads, runs), maxlen=0),
        "json-whole": lambda: orjson.loads(text),
        "mp-parse": lambda: merged(packed, ormsgpack.unpackb),
        "mp-crc32": lambda: crc(packed, 0),
        "mp-whole": lambda: ormsgpack.unpackb(whole),
    }
    try:
        import xxhash
    except ImportError:  # not a dependency of ours: the row is left out
        return calls
    xxh3 = xxhash.xxh3_64_intdigest
    calls["mp-xxh3"] = lambda: [xxh3(blob, seed) for seed, blob in enumerate(packed)]
    return calls


async def run_state(name: str, state: dict[str, Any], rounds: int) -> None:
    """Time every stage of ``name``'s resume, ours (plain and shared) and LangGraph's."""
    from aiocheckpoint import CheckpointManager, SharedState, open_storage

    with tempfile.TemporaryDirectory(prefix="ackp-stages-") as tmp:
        ours: dict[str, _Ours] = {}
        for variant, value in (("plain", state), ("shared", SharedState(state))):
            storage = open_storage(f"sqlite://{tmp}/{variant}.db")
            manager = CheckpointManager(storage)
            await manager.create_checkpoint("wf", 1, "a", "completed", value)
            ours[variant] = _Ours(manager, storage)
            await ours[variant].prepare()
        conn, saver, config = await _lg_saver(Path(tmp, "lg.db"), state)
        raw = sqlite3.connect(Path(tmp, "lg.db"))
        select = "SELECT type, checkpoint FROM checkpoints WHERE thread_id = 'wf' LIMIT 1"
        lg_type, lg_blob = raw.execute(select).fetchone()
        parts = _parts(state, *ours["plain"].leaves())
        times: dict[str, list[float]] = {}

        def note(key: str, ms: float, first: bool) -> None:
            if not first:
                times.setdefault(key, []).append(ms)

        for i in range(rounds + 1):
            for variant, one in ours.items():
                resume = functools.partial(one.manager.get_resume_point, "wf")
                note(f"{variant} resume", await _process_cpu(resume), not i)
                note(f"{variant} fetch", await one.fetch(), not i)
                note(f"{variant} decode", one.decode(), not i)
            note("lg", await _process_cpu(lambda: saver.aget_tuple(config)), not i)
            note("lg-row", _cpu(lambda: raw.execute(select).fetchone()), not i)
            note("lg-loads", _cpu(lambda: saver.serde.loads_typed((lg_type, lg_blob))), not i)
            for part, call in parts.items():
                note(part, _cpu(call), not i)
        raw.close()
        await conn.close()
        for one in ours.values():
            await one.manager.close()
    med = {key: statistics.median(values) for key, values in times.items()}
    for variant in ours:
        med[f"{variant} rest"] = (
            med[f"{variant} resume"] - med[f"{variant} fetch"] - med[f"{variant} decode"]
        )
    med["lg-rest"] = med["lg"] - med["lg-row"] - med["lg-loads"]
    for key in (
        *(f"{v} {s}" for v in ours for s in ("resume", "fetch", "decode", "rest")),
        "crc32",
        "joins",
        "parse",
        "parse-runs",
        "json-whole",
        "mp-parse",
        "mp-crc32",
        "mp-xxh3",
        "mp-whole",
        "lg",
        "lg-row",
        "lg-loads",
        "lg-rest",
    ):
        if key in med:
            print(f"{name:6} {key:16} {med[key]:7.2f} ms")
    print(
        f"{name:6} plain/lg {med['plain resume'] / med['lg']:.2f}x"
        f"  shared/lg {med['shared resume'] / med['lg']:.2f}x"
    )
    json_leaves = med["crc32"] + med["joins"] + med["parse"]
    for check in ("mp-crc32", "mp-xxh3"):
        if check in med:
            binary = med["plain resume"] - json_leaves + med["mp-parse"] + med[check]
            print(
                f"{name:6} plain with msgpack leaves and {check[3:]} (estimate):"
                f" {binary:.2f} ms = {binary / med['lg']:.2f}x lg"
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--states", default="docs,short")
    parser.add_argument("--mb", type=float, default=10, help="the states' size")
    args = parser.parse_args()
    chosen = states(args.mb)
    for name in args.states.split(","):
        await run_state(name, chosen[name], args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
