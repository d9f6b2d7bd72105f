"""The reference-counting scheme of docs/incremental.md §8, on the SQLite backend.

A random sequence of saves, replacements, deletes, ``keep_last`` retention and version-1
overwrites, checked after every operation against the ground truth read from the file:
every record decodes, no blob is leaked or missing, every count is exact.
"""

import random
from pathlib import Path
from typing import Any

from aiocheckpoint import AgentStatus, Checkpoint, StateSnapshot
from aiocheckpoint.incremental import TreeParams, encode_checkpoint_v2
from aiocheckpoint.serde import encode_checkpoint, to_storable
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests._sqlite_blob_check import check_refcounts, sql

PARAMS = TreeParams(inline_limit=128, root_inline_limit=512, chunk_min=64, chunk_avg=256)


def _checkpoint(wf: str, step: int, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        workflow_id=wf,
        step=step,
        agent_id="a",
        status=AgentStatus.RUNNING,
        state_snapshot=StateSnapshot(data=to_storable(state)),
    )


async def test_reference_counts_free_exactly_the_unreferenced_blobs(tmp_path: Path) -> None:
    """Saves, replacements, deletes and keep_last leave no leaked and no missing blob."""
    rng = random.Random(7)
    path = tmp_path / "refs.db"
    store = SQLiteCheckpointStorage(path, blob_params=PARAMS)
    shared_docs = {f"doc{i}": "lorem ipsum " * rng.randint(5, 30) for i in range(12)}
    states = {wf: {"docs": dict(shared_docs), "log": [], "n": 0} for wf in ("a", "b")}
    expected: dict[tuple[str, int], Any] = {}
    steps = {"a": 0, "b": 0}
    most_blobs = 0
    for op in range(150):
        wf = rng.choice(["a", "b"])
        state = states[wf]
        action = rng.random()
        if action < 0.1 and any(k[0] == wf for k in expected):
            victim = rng.choice([k for k in expected if k[0] == wf])
            assert await store.delete(*victim)
            del expected[victim]
        elif action < 0.13:
            await store.delete(wf)
            expected = {k: v for k, v in expected.items() if k[0] != wf}
        else:
            state["n"] += 1
            state["log"].append({"op": op, "text": f"entry {op} " * rng.randint(1, 8)})
            if action < 0.4:
                key = rng.choice(list(state["docs"]))
                state["docs"][key] += " edit"
            replace = action > 0.85 and steps[wf] > 0
            step = steps[wf] if replace else steps[wf] + 1
            steps[wf] = step
            keep = 4 if wf == "a" else None
            checkpoint = _checkpoint(wf, step, state)
            if action > 0.95:  # a small version-1 record replacing whatever was there
                checkpoint = _checkpoint(wf, step, {"small": op})
                await store.save(wf, step, encode_checkpoint(checkpoint), keep_last=keep)
            else:
                record, split = encode_checkpoint_v2(checkpoint, PARAMS)
                await store.save_tree(wf, step, record, split, keep_last=keep)
            expected[wf, step] = checkpoint.state_snapshot.data
            if keep is not None:
                for old in sorted(k for k in expected if k[0] == wf)[:-keep]:
                    del expected[old]
        assert check_refcounts(path) == expected
        most_blobs = max(most_blobs, _blob_count(path))
    assert most_blobs > 20
    for wf, step in list(expected):
        assert await store.delete(wf, step)
    await store.close()
    assert check_refcounts(path) == {}
    assert _blob_count(path) == 0


def _blob_count(path: Path) -> int:
    return int(sql(path, "SELECT count(*) FROM blobs")[0][0])
