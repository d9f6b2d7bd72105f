"""What a store's blob reference counts must be, and a random history to check them against.

Shared by the SQLite (``test_incremental_gc.py``) and in-memory (``test_memory_blobs.py``)
tests of the scheme of docs/incremental.md §8.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiocheckpoint import AgentStatus, Checkpoint, StateSnapshot
from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.format.tree import TreeParams, node_children
from aiocheckpoint.storage.base import BlobCheckpointStorage

PARAMS = TreeParams(inline_limit=128, root_inline_limit=512, chunk_min=64, chunk_avg=256)


def checkpoint(wf: str, step: int, state: dict[str, Any]) -> Checkpoint:
    """A checkpoint of ``state`` (made storable) as step ``step`` of ``wf``."""
    return Checkpoint(
        workflow_id=wf,
        step=step,
        agent_id="a",
        status=AgentStatus.RUNNING,
        state_snapshot=StateSnapshot(data=to_storable(state)),
    )


def true_counts(
    roots: Iterable[tuple[bytes, ...]], blobs: Mapping[bytes, bytes]
) -> tuple[set[bytes], Counter[bytes]]:
    """The blobs the records' ``roots`` reach, and each one's count of records and parents."""
    counts: Counter[bytes] = Counter()
    reachable: set[bytes] = set()
    for refs in roots:
        counts.update(refs)
        pending = list(refs)
        while pending:
            h = pending.pop()
            if h not in reachable:
                reachable.add(h)
                pending.extend(node_children(blobs[h]))
    for h in reachable:
        counts.update(node_children(blobs[h]))
    return reachable, counts


async def random_history(
    store: BlobCheckpointStorage, check: Callable[[], Awaitable[dict[tuple[str, int], Any]]]
) -> None:
    """Random saves, replacements, deletes, keep_last and version-1 overwrites on ``store``.

    After every operation ``check()`` (which checks the counts its own way) must return
    ``{(wf, step): state}`` of what is stored; at the end every record is deleted.
    """
    rng = random.Random(7)
    shared_docs = {f"doc{i}": "lorem ipsum " * rng.randint(5, 30) for i in range(12)}
    states = {wf: {"docs": dict(shared_docs), "log": [], "n": 0} for wf in ("a", "b")}
    expected: dict[tuple[str, int], Any] = {}
    steps = {"a": 0, "b": 0}
    for op in range(150):
        wf = rng.choice(["a", "b"])
        action = rng.random()
        if action < 0.1 and any(k[0] == wf for k in expected):
            victim = rng.choice([k for k in expected if k[0] == wf])
            assert await store.delete(*victim)
            del expected[victim]
        elif action < 0.13:
            await store.delete(wf)
            expected = {k: v for k, v in expected.items() if k[0] != wf}
        else:
            step = steps[wf] if action > 0.85 and steps[wf] > 0 else steps[wf] + 1
            steps[wf] = step
            keep = 4 if wf == "a" else None
            state = _next_state(states[wf], op, action, rng)
            expected[wf, step] = await _save(store, wf, step, state, op, action, keep)
            if keep is not None:
                for old in sorted(k for k in expected if k[0] == wf)[:-keep]:
                    del expected[old]
        assert await check() == expected
    for wf, step in list(expected):
        assert await store.delete(wf, step)
    assert await check() == {}


def _next_state(
    state: dict[str, Any], op: int, action: float, rng: random.Random
) -> dict[str, Any]:
    state["n"] += 1
    state["log"].append({"op": op, "text": f"entry {op} " * rng.randint(1, 8)})
    if action < 0.4:
        key = rng.choice(list(state["docs"]))
        state["docs"][key] += " edit"
    return state


async def _save(
    store: BlobCheckpointStorage,
    wf: str,
    step: int,
    state: dict[str, Any],
    op: int,
    action: float,
    keep: int | None,
) -> Any:
    """Save ``state`` as a tree, or (now and then) a small version-1 record in its place."""
    if action > 0.95:
        small = checkpoint(wf, step, {"small": op})
        await store.save(wf, step, encode_checkpoint(small), keep_last=keep)
        return small.state_snapshot.data
    written = checkpoint(wf, step, state)
    record, split = encode_checkpoint_v2(written, PARAMS)
    await store.save_tree(wf, step, record, split, keep_last=keep)
    return written.state_snapshot.data
