"""Incremental checkpoints through CheckpointManager + FileCheckpointStorage, end to end."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiocheckpoint
from aiocheckpoint import CheckpointManager
from aiocheckpoint.errors import (
    CheckpointCorruptedError,
    InvalidArgumentError,
    StorageSchemaError,
)
from aiocheckpoint.incremental import (
    TreeParams,
    record_format_version,
    referenced_hashes,
)
from aiocheckpoint.incremental import _open_v2 as open_v2
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage

from .reliability._support import same

CHILD = Path(__file__).with_name("_blob_child.py")
KILLS = int(os.environ.get("AIOCHECKPOINT_BLOB_KILLS", "8"))
#: Tiny nodes, so that even small random states become deep trees of blobs.
TINY = TreeParams(
    inline_limit=16,
    root_inline_limit=0,
    chunk_min=16,
    chunk_avg=32,
    chunk_max=128,
    fanout_min=2,
    fanout_avg=4,
    fanout_max=8,
)


def big_state(counter: int, docs: int = 200) -> dict[str, Any]:
    return {
        "counter": counter,
        "docs": [{"id": i, "body": f"doc {i} " + "lorem ipsum " * 80} for i in range(docs)],
    }


def blob_files(store: Path) -> set[str]:
    out = set()
    blobs = store / "blobs"
    if blobs.is_dir():
        for shard in blobs.iterdir():
            if shard.is_dir():
                out |= {p.name for p in shard.iterdir() if not p.name.startswith(".")}
    return out


def _fetch_files(store: Path) -> Any:
    def fetch(hashes: Any) -> dict[bytes, bytes]:
        found = {}
        for h in hashes:
            path = store / "blobs" / h.hex()[:2] / h.hex()
            if path.exists():
                found[h] = path.read_bytes()
        return found

    return fetch


def _reach(store: Path, record_files: Any) -> set[str]:
    roots = []
    for record_file in record_files:
        data = record_file.read_bytes()
        if record_format_version(data) == 2:
            roots.append(open_v2(data)[2])
    return {h.hex() for h in referenced_hashes([r for r in roots if r], _fetch_files(store))}


def referenced_by_records(store: Path) -> set[str]:
    """Hex names of every blob some record under ``store`` reaches."""
    return _reach(store, (store / "workflows").glob("*/*.ckpt"))


def spawn(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(aiocheckpoint.__file__).parents[1])
    return subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, env=env)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=12) | st.dictionaries(st.text(max_size=8), children, max_size=8)
    ),
    max_leaves=60,
)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(state=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_random_states_round_trip_through_file_blobs(tmp_path: Path, state: Any) -> None:
    """Random nested states stored as deep blob trees read back with identical types and order."""

    async def run() -> None:
        storage = FileCheckpointStorage(tmp_path / "store", blob_params=TINY)
        async with CheckpointManager(storage) as manager:
            step = random.randrange(2**40)
            await manager.create_checkpoint("wf", step, "a", "running", state)
            got = await manager.get_checkpoint("wf", step)
            assert same(got.state_snapshot.data, state)
            stored = await storage.load("wf", step)
            assert stored is not None and record_format_version(stored.data) == 2

    asyncio.run(run())


async def test_unchanged_parts_are_stored_once(tmp_path: Path) -> None:
    """Fifty checkpoints of a ~200 KB state with one changing key add only a few blobs each."""
    store = tmp_path / "store"
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", big_state(0))
        first = len(blob_files(store))
        assert first > 50
        for step in range(1, 51):
            await manager.create_checkpoint("wf", step, "a", "running", big_state(step))
        added = len(blob_files(store)) - first
        assert added <= 50 * 3, added
        for step in (0, 25, 50):
            got = await manager.get_checkpoint("wf", step)
            assert got.state_snapshot.data == big_state(step)


async def test_incremental_false_writes_whole_records(tmp_path: Path) -> None:
    """incremental=False keeps writing version-1 records and no blobs, even for large states."""
    store = tmp_path / "store"
    async with CheckpointManager(FileCheckpointStorage(store), incremental=False) as manager:
        assert not manager.incremental
        await manager.create_checkpoint("wf", 0, "a", "running", big_state(0))
        stored = await manager.storage.load("wf", 0)
        assert stored is not None and record_format_version(stored.data) == 1
    assert blob_files(store) == set()


def test_incremental_true_needs_a_blob_storage() -> None:
    """incremental=True with a storage that keeps no blobs is refused up front."""
    with pytest.raises(InvalidArgumentError):
        CheckpointManager(InMemoryCheckpointStorage(), incremental=True)
    assert not CheckpointManager(InMemoryCheckpointStorage()).incremental


async def test_store_written_before_blobs_opens_and_upgrades(tmp_path: Path) -> None:
    """A format-1 store of version-1 records reads as before and is marked format 2 once it
    holds blobs, with its old records still readable.
    """
    store = tmp_path / "store"
    old_state = big_state(0, docs=30)
    async with CheckpointManager(FileCheckpointStorage(store), incremental=False) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", old_state)
    assert json.loads((store / "aiocheckpoint.json").read_text()) == {"format": 1}
    assert not (store / "blobs").exists()
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == old_state
        await manager.create_checkpoint("wf", 1, "a", "running", big_state(1, docs=30))
        assert json.loads((store / "aiocheckpoint.json").read_text()) == {"format": 2}
        listed = await manager.list_checkpoints("wf")
        assert [c.state_snapshot.data for c in listed] == [old_state, big_state(1, docs=30)]


async def test_newer_format_is_refused(tmp_path: Path) -> None:
    """A store marked with a format newer than 2 is refused with StorageSchemaError."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "aiocheckpoint.json").write_text('{"format": 3}\n')
    async with FileCheckpointStorage(store) as storage:
        with pytest.raises(StorageSchemaError):
            await storage.load("wf")


async def _two_checkpoints(store: Path) -> CheckpointManager:
    manager = CheckpointManager(FileCheckpointStorage(store))
    await manager.create_checkpoint("wf", 0, "a", "completed", big_state(0, docs=20))
    await manager.create_checkpoint(
        "wf", 1, "a", "running", big_state(1, docs=20) | {"x": "mine " * 600}
    )
    return manager


def _blob_only_in_step_1(store: Path) -> Path:
    steps = store / "workflows" / "wf"
    only = sorted(
        _reach(store, [steps / f"{1:020d}.ckpt"]) - _reach(store, [steps / f"{0:020d}.ckpt"])
    )
    assert only
    return store / "blobs" / only[0][:2] / only[0]


async def test_missing_blob_is_corruption_and_resume_falls_back(tmp_path: Path) -> None:
    """Deleting a blob file makes its checkpoint raise CheckpointCorruptedError naming the
    workflow and step; the resume point falls back to the previous checkpoint.
    """
    store = tmp_path / "store"
    manager = await _two_checkpoints(store)
    _blob_only_in_step_1(store).unlink()
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_latest_checkpoint("wf")
    assert (info.value.workflow_id, info.value.step) == ("wf", 1)
    resume = await manager.get_resume_point("wf")
    assert resume is not None and resume[0] == 1 and resume[1].data == big_state(0, docs=20)
    await manager.close()


async def test_damaged_blob_is_corruption(tmp_path: Path) -> None:
    """A blob file whose bytes changed fails its hash check: CheckpointCorruptedError."""
    store = tmp_path / "store"
    manager = await _two_checkpoints(store)
    path = _blob_only_in_step_1(store)
    damaged = bytearray(path.read_bytes())
    damaged[-2] ^= 0x20
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_checkpoint("wf", 1)
    assert (info.value.workflow_id, info.value.step) == ("wf", 1)
    assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == big_state(0, docs=20)
    await manager.close()


async def test_gc_deletes_exactly_the_unreferenced_blobs(tmp_path: Path) -> None:
    """After deletes, a zero-grace collection leaves exactly the blobs remaining records reach."""
    store = tmp_path / "store"
    storage = FileCheckpointStorage(store, gc_interval=None)
    async with CheckpointManager(storage) as manager:
        for step in range(6):
            state = big_state(step, docs=30) | {"own": [f"{step}-{i}" * 50 for i in range(20)]}
            await manager.create_checkpoint("wf", step, "a", "running", state)
        before = blob_files(store)
        assert await storage.collect_garbage() == 0  # within the grace period: nothing goes
        for step in (0, 2, 3):
            await manager.delete_checkpoints("wf", step)
        freed = await storage.collect_garbage(grace=0)
        assert freed > 0
        assert blob_files(store) == referenced_by_records(store)
        assert len(blob_files(store)) == len(before) - freed
        for cp in await manager.list_checkpoints("wf"):
            assert cp.state_snapshot.data["counter"] == cp.step


async def test_retention_triggers_collection(tmp_path: Path) -> None:
    """With a short interval and grace, max_checkpoints retention frees old blobs by itself."""
    store = tmp_path / "store"
    storage = FileCheckpointStorage(store, gc_interval=1e-9, blob_grace_seconds=1e-9)
    async with CheckpointManager(storage, max_checkpoints=2) as manager:
        for step in range(8):
            state = {"step": step, "own": [f"{step}-{i}" * 50 for i in range(40)]}
            await manager.create_checkpoint("wf", step, "a", "running", state)
        assert blob_files(store) == referenced_by_records(store)
        assert [c.step for c in await manager.list_checkpoints("wf")] == [6, 7]


async def _all_load(store: Path) -> int:
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        count = 0
        for wf in await manager.list_workflows():
            for cp in await manager.list_checkpoints(wf):
                assert cp.state_snapshot.data["step"] == cp.step
                count += 1
        return count


async def test_sigkilled_writer_never_leaves_a_record_without_blobs(tmp_path: Path) -> None:
    """SIGKILL at random moments of big saves: every record on disk loads, every ack is there."""
    store = tmp_path / "store"
    rng = random.Random(9)
    acked: set[int] = set()
    for kill in range(KILLS):
        proc = spawn(str(store), "wf", str(kill), "1000000", "0", "0", "3600")
        await asyncio.sleep(0.3 + rng.random() * 0.7)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        acked |= {int(line) for line in out.split(b"\n")[:-1]}
        assert await _all_load(store) >= len(acked)  # _all_load checks every record loads
    assert acked
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        present = {cp.step for cp in await manager.list_checkpoints("wf")}
    assert acked <= present


async def test_gc_with_two_concurrent_writers_keeps_every_checkpoint_loadable(
    tmp_path: Path,
) -> None:
    """Two processes write sharing states with retention and collect garbage while the other
    writes; every remaining checkpoint loads, then a final sweep leaves only referenced blobs.
    """
    store = tmp_path / "store"
    procs = [spawn(str(store), f"wf-{n}", str(n), "40", "3", "5", "0.5") for n in range(2)]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0
        assert out.split(b"\n")[-2] == b"39"
    assert await _all_load(store) == 6
    storage = FileCheckpointStorage(store, gc_interval=None)
    await storage.collect_garbage(grace=0)
    await storage.close()
    assert blob_files(store) == referenced_by_records(store)
    assert await _all_load(store) == 6


def _big_state(n: int = 600) -> dict[str, Any]:
    return {"docs": [{"id": i, "text": f"document {i} " * 90} for i in range(n)], "n": 0.5}


async def test_the_state_is_the_one_at_call_time_although_encoding_yields(tmp_path: Path) -> None:
    """A large state is encoded on the event loop in slices, from the copy made at the call.

    Another task that changes the caller's dict while the save is in progress (it has
    yielded many times by then) changes nothing stored or returned.
    """
    state = _big_state()
    expected = copy.deepcopy(state)
    async with CheckpointManager(FileCheckpointStorage(tmp_path / "store")) as manager:
        changes = 0

        async def meddle() -> None:
            nonlocal changes
            while not save.done():
                state["docs"][changes % 600]["text"] = "changed"
                state["n"] = changes
                changes += 1
                await asyncio.sleep(0)

        save = asyncio.ensure_future(manager.create_checkpoint("wf", 1, "a", "running", state))
        await asyncio.gather(save, meddle())
        assert changes > 3  # the save did let the other task run, several times
        assert save.result().state_snapshot.data == expected
        assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == expected
        stored = await manager.storage.load("wf", 1)
        assert stored is not None and stored.data[4] == 2  # an incremental record


async def test_a_save_cancelled_while_encoding_writes_nothing(tmp_path: Path) -> None:
    """Cancelling create_checkpoint during the sliced encoding leaves the store unchanged."""
    async with CheckpointManager(FileCheckpointStorage(tmp_path / "store")) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", {"small": True})
        for slices in (1, 3, 10):
            task = asyncio.ensure_future(
                manager.create_checkpoint("wf", 1, "a", "running", _big_state())
            )
            for _ in range(slices):
                await asyncio.sleep(0)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not await manager.has_checkpoint("wf", 1)
        assert not blob_files(tmp_path / "store")
        assert (await manager.get_resume_point("wf")) is not None
