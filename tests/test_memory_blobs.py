"""The in-memory store's blobs: reference counts, all-or-nothing saves, what a save costs.

The counts are checked after every operation of the random history of
``tests/_blob_refs.py`` against the ground truth recomputed from the records, as
``tests/test_incremental_gc.py`` does for SQLite.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    InMemoryCheckpointStorage,
    InvalidArgumentError,
    SharedState,
)
from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.codec.tree.v2 import decode_checkpoint_v2, encode_checkpoint_v2
from aiocheckpoint.format.tree import record_root_refs
from tests._blob_refs import PARAMS, random_history, true_counts
from tests._blob_refs import checkpoint as _checkpoint


def _check(store: InMemoryCheckpointStorage) -> dict[tuple[str, int], Any]:
    """Every record decodes; no blob is leaked; every count is exact; the bytes add up.

    Returns ``{(wf, step): state}``.
    """
    blobs = store._blobs  # the ground truth, as the SQLite test reads the file

    def fetch(hashes: Any) -> dict[bytes, bytes]:
        return {h: blobs.data[h] for h in hashes if h in blobs.data}

    states: dict[tuple[str, int], Any] = {}
    roots = []
    for wf_id, wf in store._workflows.items():
        for step, data in wf.records.items():
            checkpoint = decode_checkpoint_v2(data, fetch, workflow_id=wf_id, step=step)
            states[wf_id, step] = checkpoint.state_snapshot.data
            refs = record_root_refs(data)
            assert wf.refs.get(step, ()) == refs
            roots.append(refs)
    reachable, counts = true_counts(roots, blobs.data)
    assert set(blobs.data) == reachable == set(blobs.counts), "leaked blobs"
    assert blobs.counts == dict(counts), "wrong counts"
    record_bytes = sum(len(r) for wf in store._workflows.values() for r in wf.records.values())
    assert store.stored_bytes == record_bytes + sum(map(len, blobs.data.values()))
    return states


async def test_reference_counts_free_exactly_the_unreferenced_blobs() -> None:
    """Saves, replacements, deletes, keep_last and version-1 overwrites: exact counts."""
    store = InMemoryCheckpointStorage(blob_params=PARAMS)
    most_blobs = 0

    async def check() -> dict[tuple[str, int], Any]:
        nonlocal most_blobs
        most_blobs = max(most_blobs, len(store._blobs.data))
        return _check(store)

    await random_history(store, check)
    assert most_blobs > 20
    assert store.stored_bytes == 0 and store._blobs.counts == {}


def _big(tag: str) -> dict[str, Any]:
    return {"docs": [f"{tag} doc {i} " + "lorem ipsum " * 40 for i in range(40)], "n": 1}


async def test_a_split_missing_a_blob_changes_nothing() -> None:
    """A save_tree whose split lacks a deeper blob is refused and every count taken back."""
    store = InMemoryCheckpointStorage(blob_params=PARAMS)
    first, first_split = encode_checkpoint_v2(_checkpoint("wf", 0, _big("a")), PARAMS)
    await store.save_tree("wf", 0, first, first_split)
    before = dict(store._blobs.counts), store.stored_bytes
    record, split = encode_checkpoint_v2(_checkpoint("wf", 1, _big("b")), PARAMS)
    deep = [h for h in split.blobs if h not in split.root_refs and h not in first_split.blobs]
    assert deep  # a blob below the root's: the walk's first level is stored before it fails
    stale = dataclasses.replace(split, blobs={h: b for h, b in split.blobs.items() if h != deep[0]})
    with pytest.raises(InvalidArgumentError):
        await store.save_tree("wf", 1, record, stale)
    assert (dict(store._blobs.counts), store.stored_bytes) == before
    assert not await store.exists("wf", 1)
    assert _check(store) == {("wf", 0): to_storable(_big("a"))}


async def test_a_record_not_matching_its_split_is_refused() -> None:
    """save_tree checks that the record references the split's root; nothing is stored."""
    store = InMemoryCheckpointStorage(blob_params=PARAMS)
    record, _ = encode_checkpoint_v2(_checkpoint("wf", 0, _big("a")), PARAMS)
    _, other = encode_checkpoint_v2(_checkpoint("wf", 0, _big("b")), PARAMS)
    with pytest.raises(InvalidArgumentError):
        await store.save_tree("wf", 0, record, other)
    with pytest.raises(InvalidArgumentError):
        await store.save_tree("wf", 0, b"not a record", other)
    with pytest.raises(InvalidArgumentError):
        await store.fetch_blobs(["not bytes"])  # type: ignore[list-item]
    assert store.stored_bytes == 0 and await store.list_workflows() == []
    assert await store.get_workflow("wf") is None


async def test_a_tree_record_saved_whole_holds_only_the_stored_blobs() -> None:
    """A version-2 record given to save counts the blobs it names that are stored, only."""
    store = InMemoryCheckpointStorage(blob_params=PARAMS)
    record, split = encode_checkpoint_v2(_checkpoint("wf", 0, _big("a")), PARAMS)
    await store.save_tree("wf", 0, record, split)
    copy, copy_split = encode_checkpoint_v2(_checkpoint("copy", 0, _big("a")), PARAMS)
    assert copy_split.blobs == split.blobs
    await store.save("copy", 0, copy)  # all its blobs are stored: it holds them too
    orphan, _ = encode_checkpoint_v2(_checkpoint("x", 0, _big("never stored")), PARAMS)
    await store.save("x", 0, orphan)  # none are: it holds nothing
    assert store._workflows["x"].refs == {}
    with pytest.raises(CheckpointCorruptedError):
        await CheckpointManager(store).get_checkpoint("x", 0)
    await store.delete("x")
    await store.delete("wf")
    assert _check(store) == {("copy", 0): to_storable(_big("a"))}
    await store.delete("copy")
    assert store._blobs.data == {} and store.stored_bytes == 0


async def test_one_changed_key_of_a_1mb_shared_state_stores_about_the_change() -> None:
    """The manager writes a large SharedState to the memory store as trees sharing blobs."""
    store = InMemoryCheckpointStorage()
    manager = CheckpointManager(store, max_checkpoints=3)
    assert manager.incremental
    state = SharedState({f"k{i}": f"value {i} " + "x" * 1000 for i in range(1000)})
    await manager.create_checkpoint("wf", 0, "a", "running", state)
    first = store.stored_bytes
    assert first > 1_000_000
    for step in range(1, 8):
        state.set("k5", f"changed {step}")
        await manager.create_checkpoint("wf", step, "a", "running", state)
        assert store.stored_bytes < first + 64 * 1024  # pruned steps give their blobs back
    got = await manager.get_checkpoint("wf", 7)
    assert got.state_snapshot.data == state.to_dict()
    await manager.delete_checkpoints("wf")
    assert store.stored_bytes == 0


async def test_incremental_false_keeps_whole_records() -> None:
    """incremental=False writes version-1 records to the memory store, no blobs."""
    store = InMemoryCheckpointStorage()
    manager = CheckpointManager(store, incremental=False)
    await manager.create_checkpoint("wf", 0, "a", "running", _big("a"))
    stored = await store.load("wf", 0)
    assert stored is not None and stored.data[4] == 1
    assert store._blobs.data == {}


def test_blob_params_must_be_tree_params() -> None:
    with pytest.raises(InvalidArgumentError):
        InMemoryCheckpointStorage(blob_params={"digest_size": 16})  # type: ignore[arg-type]
