"""A SharedState whose bulk is ``bytes`` or a tuple: does a checkpoint cost what changed?

    PYTHONPATH=src python bench/cache_bulk.py [--runs 5] [--before]

Each run writes 21 checkpoints of one state to the memory store, one small key changed
before each, and reports the median CPU of the last 20 (the first fills the sub-tree
cache): the loop thread's (``time.thread_time``) and the process's (``time.process_time``).
States: 1 MB of ``bytes``; a tuple of 10,000 rows; 1 MB of documents, and the same with
one datetime beside them (a tagged state: the returned checkpoint is restored, since
2026-12-02 without a walk of its untagged sub-trees); a chat of 1,000 registered pydantic
messages (~300 B each), one appended before each checkpoint (every message is tagged).
With ``--before``, each run is paired with one under the count ``exceeds`` made before
2026-12-02 (a ``bytes``, tuple or set value counted as one character: such a state never
took the cache), alternating in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from aiocheckpoint import CheckpointManager, SharedState, TypeRegistry, open_storage
from aiocheckpoint.codec import sizes

Bound = Callable[[Any, int], int]


def _bound_before(value: Any, limit: int) -> int:
    """``text_bound`` as it was: bytes, tuples and sets one character each."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            total += len(item) + 2
        elif kind is dict:
            total += 1 + 3 * len(item)
            for key in item:
                total += len(key)
            stack.extend(item.values())
        elif kind is list:
            total += 1 + len(item)
            stack.extend(item)
        else:
            total += 1
        if total > limit:
            break
    return total


class Message(BaseModel):
    """A chat message, stored as a registered type."""

    role: str
    text: str
    at: datetime


TYPES = TypeRegistry()
TYPES.register(Message, name="Message")
KINDS = ("bytes", "tuple", "docs", "docs+dt", "chat+model")


def _message(n: int) -> Message:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return Message(role="user" if n % 2 else "assistant", text=f"{n} " + "m" * 250, at=at)


def _state(kind: str) -> SharedState:
    if kind == "chat+model":
        return SharedState({"messages": [_message(n) for n in range(1000)], "n": 0})
    if kind == "bytes":
        return SharedState({"image": b"x" * 1_000_000, "n": 0})
    if kind == "tuple":
        return SharedState({"rows": tuple(f"row {i} " + "y" * 90 for i in range(10_000)), "n": 0})
    docs = {f"d{i}": {"id": i, "text": "z" * 1000} for i in range(1000)}
    when: Any = datetime(2026, 1, 1, tzinfo=timezone.utc) if kind == "docs+dt" else "plain"
    return SharedState({"docs": docs, "when": when, "n": 0})


async def _run(kind: str, bound: Bound) -> tuple[float, float]:
    """Median loop-thread and process CPU per checkpoint, in ms."""
    sizes.text_bound = bound  # what exceeds calls
    storage = open_storage("memory://")
    manager = CheckpointManager(storage, types=TYPES)
    state = _state(kind)
    thread: list[float] = []
    process: list[float] = []
    try:
        for step in range(21):
            state.set("n", step)
            if kind == "chat+model":
                state.append("messages", _message(1000 + step))
            t0, p0 = time.thread_time(), time.process_time()
            await manager.create_checkpoint("wf", step, "a", "running", state)
            if step:
                thread.append(time.thread_time() - t0)
                process.append(time.process_time() - p0)
    finally:
        await storage.close()
    return statistics.median(thread) * 1000, statistics.median(process) * 1000


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ms ({min(values):.2f}-{max(values):.2f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", action="store_true", help="pair each run with the old count")
    parser.add_argument("--kinds", nargs="*", choices=KINDS, default=list(KINDS))
    args = parser.parse_args()
    now = sizes.text_bound
    modes: dict[str, Bound] = {"after": now}
    if args.before:
        modes = {"before": _bound_before, "after": now}
    for kind in args.kinds:
        results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
        for _ in range(args.runs):
            for mode, bound in modes.items():
                results[mode].append(await _run(kind, bound))
        for mode, runs in results.items():
            thread = _summary([t for t, _ in runs])
            process = _summary([p for _, p in runs])
            print(f"{kind:7} {mode:6} loop thread {thread}, process {process}")
    sizes.text_bound = now


if __name__ == "__main__":
    asyncio.run(main())
