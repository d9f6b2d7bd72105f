"""Workload 4 of the benchmark suite, simulated on the incremental tree format.

The blob store is an in-memory dict, so the figures are the bytes a backend would store
(unique blobs + one record per checkpoint), not file-system overhead.

    PYTHONPATH=src python bench/incremental_size.py [--quick] [--zstd] [--profile]

(a) 1,000 checkpoints of a ~1 MB state in which one small key changes per step (two
    variants: a top-level counter, and a counter inside one of the documents);
(b) 1,000 steps of a chat state whose message list grows by one ~1 KB message per step;
(c) write and resume time against the version-1 record path for a ~1 KB and a ~10 MB state.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import string
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.codec.tree.split import split_state
from aiocheckpoint.codec.tree.v2 import decode_checkpoint_v2, encode_checkpoint_v2
from aiocheckpoint.codec.v1 import decode_checkpoint, encode_checkpoint
from aiocheckpoint.format.tree import SplitMemory, TreeParams
from aiocheckpoint.models import AgentStatus, Checkpoint, StateSnapshot

_WORDS = [
    "".join(random.Random(i).choices(string.ascii_lowercase, k=random.Random(i).randint(2, 9)))
    for i in range(5000)
]


def _text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        word = rng.choice(_WORDS)
        out.append(word)
        n += len(word) + 1
    return " ".join(out)[:size]


def _docs_state(rng: random.Random, n_docs: int) -> dict[str, Any]:
    """~1 KB per document: a context of retrieved documents plus a little bookkeeping."""
    return {
        "counter": 0,
        "plan": ["retrieve", "summarise", "answer"],
        "documents": {
            f"doc-{i:05d}": {
                "title": _text(rng, 40),
                "url": f"https://example.org/{i}",
                "score": rng.random(),
                "views": 0,
                "body": _text(rng, 900),
            }
            for i in range(n_docs)
        },
    }


def _message(rng: random.Random, i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 else "assistant", "id": i, "content": _text(rng, 1000)}


class Store:
    """A content-addressed blob store in memory, plus the records written."""

    def __init__(self) -> None:
        self.blobs: dict[bytes, bytes] = {}
        self.memory: SplitMemory | None = None  # what the manager keeps per workflow
        self.record_bytes = 0
        self.records = 0

    def put(self, record: bytes, blobs: Mapping[bytes, bytes]) -> None:
        for h, blob in blobs.items():
            self.blobs.setdefault(h, blob)
        self.record_bytes += len(record)
        self.records += 1

    def fetch(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        return {h: self.blobs[h] for h in hashes if h in self.blobs}

    @property
    def total(self) -> int:
        return self.record_bytes + sum(map(len, self.blobs.values()))


def _checkpoint(step: int, data: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        workflow_id="wf",
        step=step,
        agent_id="agent",
        status=AgentStatus.RUNNING,
        state_snapshot=StateSnapshot(data=to_storable(data)),
    )


def _save(store: Store, step: int, data: dict[str, Any], params: TreeParams) -> bytes:
    record, split = encode_checkpoint_v2(
        _checkpoint(step, data), params, known=store.blobs, previous=store.memory
    )
    store.memory = split.memory
    store.put(record, split.blobs)
    return record


def _emit(name: str, **fields: Any) -> None:
    print(json.dumps({"name": name, **fields}))


def workload_a(steps: int, params: TreeParams, nested: bool) -> None:
    rng = random.Random(1)
    state = _docs_state(rng, 1000)
    v1_size = len(encode_checkpoint(_checkpoint(0, state)))
    store = Store()
    keys = list(state["documents"])
    record = b""
    t0 = time.perf_counter()
    for step in range(steps):
        if nested:
            state["documents"][keys[rng.randrange(len(keys))]]["views"] += 1
        else:
            state["counter"] += 1
        record = _save(store, step, state, params)
    elapsed = time.perf_counter() - t0
    back = decode_checkpoint_v2(record, store.fetch)
    assert back.state_snapshot.data == state
    _emit(
        "4a-one-key" + ("-nested" if nested else "-top"),
        steps=steps,
        state_bytes=v1_size,
        stored_bytes=store.total,
        blobs=len(store.blobs),
        record_bytes=store.record_bytes,
        full_copies_bytes=v1_size * steps,
        ratio_vs_full=round(v1_size * steps / store.total, 1),
        save_ms_mean=round(elapsed / steps * 1000, 2),
    )


def workload_b(steps: int, params: TreeParams) -> None:
    rng = random.Random(2)
    state: dict[str, Any] = {"system": "You are helpful.", "turn": 0, "messages": []}
    store = Store()
    record = b""
    t0 = time.perf_counter()
    for step in range(steps):
        state["messages"].append(_message(rng, step))
        state["turn"] = step
        record = _save(store, step, state, params)
    elapsed = time.perf_counter() - t0
    final = len(encode_checkpoint(_checkpoint(steps, state)))
    back = decode_checkpoint_v2(record, store.fetch)
    assert back.state_snapshot.data == state
    _emit(
        "4b-growing-messages",
        steps=steps,
        final_state_bytes=final,
        stored_bytes=store.total,
        blobs=len(store.blobs),
        record_bytes=store.record_bytes,
        ratio_stored_to_final=round(store.total / final, 2),
        full_copies_bytes=final * steps // 2,
        save_ms_mean=round(elapsed / steps * 1000, 2),
    )


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    # CPU time: both paths are CPU-bound here, and the machine is shared with other jobs.
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def workload_c(name: str, state: dict[str, Any], params: TreeParams, repeats: int) -> None:
    cp = _checkpoint(1, state)
    v1 = encode_checkpoint(cp)
    store = Store()
    record, split = encode_checkpoint_v2(cp, params)
    store.put(record, split.blobs)
    write_v1 = _median_time(lambda: encode_checkpoint(cp), repeats)
    write_v2 = _median_time(lambda: encode_checkpoint_v2(cp, params), repeats)
    read_v1 = _median_time(lambda: decode_checkpoint(v1), repeats)
    read_v2 = _median_time(lambda: decode_checkpoint_v2(record, store.fetch), repeats)
    _emit(
        f"4c-{name}",
        state_bytes=len(v1),
        blobs=len(split.blobs),
        write_v1_ms=round(write_v1 * 1000, 3),
        write_v2_ms=round(write_v2 * 1000, 3),
        write_ratio=round(write_v2 / write_v1, 2),
        resume_v1_ms=round(read_v1 * 1000, 3),
        resume_v2_ms=round(read_v2 * 1000, 3),
        resume_ratio=round(read_v2 / read_v1, 2),
    )


def _profile(state: dict[str, Any], params: TreeParams) -> None:
    cp = _checkpoint(1, state)
    store = Store()
    record, split = encode_checkpoint_v2(cp, params)
    store.put(record, split.blobs)
    for label, fn in (
        ("split", lambda: split_state(cp.state_snapshot.data, params)),
        ("resume", lambda: decode_checkpoint_v2(record, store.fetch)),
    ):
        prof = cProfile.Profile()
        prof.runcall(fn)
        print(f"--- profile: {label} of a {len(encode_checkpoint(cp)) // 1000} kB state")
        pstats.Stats(prof).sort_stats("tottime").print_stats(8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 steps, 2 MB large state")
    parser.add_argument("--zstd", action="store_true", help="compress blobs with zstd")
    parser.add_argument("--profile", action="store_true", help="profile split and resume")
    parser.add_argument(
        "--params", default="", help="TreeParams overrides, e.g. inline_limit=4096,chunk_avg=8192"
    )
    parser.add_argument("--only", default="abc", help="which workloads to run, e.g. ab")
    args = parser.parse_args()
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in args.params.split(",") if kv)}
    params = TreeParams(compression="zstd" if args.zstd else None, **overrides)
    print(json.dumps({"params": repr(params)}))
    steps = 100 if args.quick else 1000
    if "a" in args.only:
        workload_a(steps, params, nested=False)
        workload_a(steps, params, nested=True)
    if "b" in args.only:
        workload_b(steps, params)
    if "c" not in args.only:
        return
    rng = random.Random(3)
    small = {"counter": 7, "goal": _text(rng, 600), "plan": ["a", "b", "c"], "scratch": {}}
    workload_c("small-1kB", small, params, 2000)
    large = _docs_state(rng, 2000 if args.quick else 10000)
    large["messages"] = [_message(rng, i) for i in range(100)]
    workload_c("large-documents", large, params, 3 if args.quick else 7)
    n_big = 20 if args.quick else 100
    big = {"counter": 1, "context": [_text(rng, 100_000) for _ in range(n_big)]}
    workload_c("large-strings", big, params, 3 if args.quick else 7)
    if args.profile:
        _profile(large, params)


if __name__ == "__main__":
    main()
