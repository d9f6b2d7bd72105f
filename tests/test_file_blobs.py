"""Incremental checkpoints through CheckpointManager + FileCheckpointStorage, end to end."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiocheckpoint
from aiocheckpoint import CheckpointManager
from aiocheckpoint.codec.tree.join import referenced_hashes
from aiocheckpoint.errors import (
    CheckpointCorruptedError,
    InvalidArgumentError,
    StorageSchemaError,
)
from aiocheckpoint.format import open_record_v2 as open_v2
from aiocheckpoint.format.header import record_format_version
from aiocheckpoint.format.tree import TreeParams
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.packs import (
    MIDX,
    PACKS,
    PackDamagedError,
    decode_midx,
    read_pack_index,
)
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage

from .backend_support import RecordsOnly
from .reliability._support import same
from .tiered import examples

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


def pack_indexes(store: Path) -> dict[Path, dict[bytes, tuple[int, int]]]:
    """Every pack under ``store`` with its index (read with the pack format's parser)."""
    out = {}
    packs = store / "blobs" / PACKS
    if packs.is_dir():
        for path in sorted(packs.glob("*.pack")):
            with path.open("rb") as f:
                out[path] = read_pack_index(f.fileno(), path.stat().st_size, 2**30)
    return out


def blob_files(store: Path) -> set[str]:
    """Hex names of every stored blob: in packs and in format-2 blob files."""
    out = {h.hex() for index in pack_indexes(store).values() for h in index}
    blobs = store / "blobs"
    if blobs.is_dir():
        for shard in blobs.iterdir():
            if shard.is_dir() and len(shard.name) == 2:
                out |= {p.name for p in shard.iterdir() if not p.name.startswith(".")}
    return out


def stored_blobs(store: Path) -> dict[bytes, bytes]:
    found = {}
    for path, index in pack_indexes(store).items():
        data = path.read_bytes()
        found |= {h: data[off : off + length] for h, (off, length) in index.items()}
    blobs = store / "blobs"
    for shard in blobs.iterdir() if blobs.is_dir() else ():
        if shard.is_dir() and len(shard.name) == 2:
            found |= {bytes.fromhex(p.name): p.read_bytes() for p in shard.iterdir()}
    return found


def _fetch_files(store: Path) -> Any:
    stored = stored_blobs(store)

    def fetch(hashes: Any) -> dict[bytes, bytes]:
        return {h: stored[h] for h in hashes if h in stored}

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


async def _first_ack(proc: subprocess.Popen[bytes]) -> bytes:
    """The writer's first acknowledgement line. The first writer of a kill loop is killed
    only after it, so that a loaded machine (a slow start) still leaves steps to check."""
    assert proc.stdout is not None
    return await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 300)


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


@examples(fast=10, full=60)
def test_random_states_round_trip_through_file_blobs(examples: int, tmp_path: Path) -> None:
    """Random nested states stored as deep blob trees read back with identical types and order."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(state=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
    def check(state: Any) -> None:
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

    check()


async def test_unchanged_parts_are_stored_once(tmp_path: Path) -> None:
    """Fifty checkpoints of a ~200 KB state with one changing key add only a few blobs each."""
    store = tmp_path / "store"
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", big_state(0))
        first = len(blob_files(store))
        assert first > 8  # ~200 KB in regions of ~16 KB
        for step in range(1, 51):
            await manager.create_checkpoint("wf", step, "a", "running", big_state(step))
        added = len(blob_files(store)) - first
        assert added <= 50 * 3, added
        for step in (0, 25, 50):
            got = await manager.get_checkpoint("wf", step)
            assert got.state_snapshot.data == big_state(step)


def stored_bytes(store: Path) -> int:
    return sum(map(len, stored_blobs(store).values()))


async def test_the_manager_remembers_splits_so_appends_stay_small(tmp_path: Path) -> None:
    """Through the manager, a growing list adds about one message per save, not a region.

    A large state saved at once is stored in few region-sized blobs (cheap to resume); a
    new manager (no memory) finds the cut regions in the store and keeps saves small.
    """
    store = tmp_path / "store"
    rng = random.Random(3)
    messages = [
        {"id": i, "text": " ".join(str(rng.random()) for _ in range(50))} for i in range(300)
    ]
    message = len(json.dumps(messages[0]))
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", {"messages": messages})
        # ~300 KB in blobs of up to 32 KiB, not ~300 of ~1 KB.
        assert len(blob_files(store)) < 60
        sizes = [stored_bytes(store)]
        for step in range(1, 31):
            messages.append({"id": 300 + step, "text": f"message {step} " * 80})
            await manager.create_checkpoint("wf", step, "a", "running", {"messages": messages})
            sizes.append(stored_bytes(store))
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    # About one new chunk per append (plus index nodes), after at most one region rewrite
    # when the first append cuts the region it lands in.
    assert sorted(growth)[len(growth) // 2] < message + 1024, growth
    assert sum(growth) < 30 * (message + 1024) + 32 * 1024, growth
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        before = stored_bytes(store)
        for step in range(31, 36):
            messages.append({"id": 300 + step, "text": f"message {step} " * 80})
            await manager.create_checkpoint("wf", step, "a", "running", {"messages": messages})
        later = stored_bytes(store)
        got = await manager.get_checkpoint("wf", 35)
        assert got.state_snapshot.data == {"messages": messages}
    # The new manager has no memory, but finds the regions the appends had cut in the
    # store and cuts them again: five small saves, no region rewritten.
    assert later - before < 5 * (message + 1024) + 4 * 1024, later - before


async def test_a_workflow_saved_by_a_new_manager_each_time_stays_cut(tmp_path: Path) -> None:
    """Without a memory, the store's blobs tell which regions were cut: appends stay small.

    Every save comes from a new manager (a new process, say): the regions a growing list
    was cut into are found in the store (their first chunks) and cut again, instead of
    each save rewriting the list's last region as one blob.
    """
    store = tmp_path / "store"
    rng = random.Random(8)
    messages: list[dict[str, Any]] = []
    sizes = []
    for step in range(120):
        messages.append({"id": step, "text": " ".join(str(rng.random()) for _ in range(50))})
        async with CheckpointManager(FileCheckpointStorage(store)) as manager:
            await manager.create_checkpoint("wf", step, "a", "running", {"messages": messages})
        sizes.append(stored_bytes(store))
    message = len(json.dumps(messages[-1]))
    growth = [b - a for a, b in itertools.pairwise(sizes[60:])]
    assert sorted(growth)[len(growth) // 2] < message + 1024, growth
    assert sum(growth) < len(growth) * (message + 1024) + 32 * 1024, growth
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        got = await manager.get_checkpoint("wf", 119)
    assert got.state_snapshot.data == {"messages": messages}


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
        CheckpointManager(RecordsOnly(), incremental=True)
    assert not CheckpointManager(RecordsOnly()).incremental
    assert CheckpointManager(InMemoryCheckpointStorage()).incremental


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
        assert json.loads((store / "aiocheckpoint.json").read_text()) == {"format": 3}
        listed = await manager.list_checkpoints("wf")
        assert [c.state_snapshot.data for c in listed] == [old_state, big_state(1, docs=30)]


async def test_newer_format_is_refused(tmp_path: Path) -> None:
    """A store marked with a format newer than 3 is refused with StorageSchemaError."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "aiocheckpoint.json").write_text('{"format": 4}\n')
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


def _blob_only_in_step_1(store: Path) -> tuple[Path, int, int]:
    """The pack, offset and length of a blob that step 1 reaches and step 0 does not."""
    steps = store / "workflows" / "wf"
    only = _reach(store, [steps / f"{1:020d}.ckpt"]) - _reach(store, [steps / f"{0:020d}.ckpt"])
    assert only
    for path, index in pack_indexes(store).items():
        for h, (offset, length) in index.items():
            if h.hex() in only:
                return path, offset, length
    raise AssertionError("no pack holds the blobs of step 1")


async def _step_1_is_corrupted_and_resume_falls_back(store: Path) -> None:
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        with pytest.raises(CheckpointCorruptedError) as info:
            await manager.get_latest_checkpoint("wf")
        assert (info.value.workflow_id, info.value.step) == ("wf", 1)
        resume = await manager.get_resume_point("wf")
        assert resume is not None and resume[0] == 1 and resume[1].data == big_state(0, docs=20)


async def test_missing_pack_is_corruption_and_resume_falls_back(tmp_path: Path) -> None:
    """Deleting the pack holding a blob makes its checkpoint raise CheckpointCorruptedError
    naming the workflow and step, in the process that cached the pack's index and in a new
    one; the resume point falls back to the previous checkpoint.
    """
    store = tmp_path / "store"
    manager = await _two_checkpoints(store)
    _blob_only_in_step_1(store)[0].unlink()
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_latest_checkpoint("wf")
    assert (info.value.workflow_id, info.value.step) == ("wf", 1)
    await manager.close()
    await _step_1_is_corrupted_and_resume_falls_back(store)


async def test_damaged_blob_is_corruption(tmp_path: Path) -> None:
    """A blob whose bytes changed inside its pack fails its hash check: corruption."""
    store = tmp_path / "store"
    manager = await _two_checkpoints(store)
    path, offset, length = _blob_only_in_step_1(store)
    damaged = bytearray(path.read_bytes())
    damaged[offset + length - 2] ^= 0x20
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_checkpoint("wf", 1)
    assert (info.value.workflow_id, info.value.step) == ("wf", 1)
    assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == big_state(0, docs=20)
    await manager.close()


@pytest.mark.parametrize("damage", ["index byte", "trailer byte", "truncated", "emptied"])
async def test_damaged_pack_index_is_corruption(tmp_path: Path, damage: str) -> None:
    """A pack whose index or trailer is damaged, or which was cut short, counts as missing:
    its checkpoint is corrupted, resume falls back, and a sweep leaves the pack alone.
    """
    store = tmp_path / "store"
    await (await _two_checkpoints(store)).close()
    path, _offset, _length = _blob_only_in_step_1(store)
    data = bytearray(path.read_bytes())
    index_at = int.from_bytes(data[-24:-16], "big")
    if damage == "index byte":
        data[index_at + 3] ^= 0x01
    elif damage == "trailer byte":
        data[-3] ^= 0x01
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(PackDamagedError):
        with path.open("rb") as f:
            read_pack_index(f.fileno(), len(data), 2**30)
    await _step_1_is_corrupted_and_resume_falls_back(store)
    storage = FileCheckpointStorage(store, gc_interval=None)
    await storage.collect_garbage(grace=0)
    await storage.close()
    assert path.read_bytes() == data


def entries(store: Path) -> int:
    return sum(len(index) for index in pack_indexes(store).values())


def assert_swept(store: Path) -> None:
    """What a zero-grace sweep leaves: every referenced blob; no pack without one; in every
    pack, unreferenced blobs at most half of its blob bytes; no format-2 file unreferenced.
    """
    referenced = referenced_by_records(store)
    assert referenced <= blob_files(store)
    for path, index in pack_indexes(store).items():
        live = sum(length for h, (_o, length) in index.items() if h.hex() in referenced)
        total = sum(length for _o, length in index.values())
        assert live > 0, f"{path.name} holds no referenced blob"
        assert total - live <= total * 0.5, f"{path.name} should have been compacted"
    legacy = blob_files(store) - {h.hex() for i in pack_indexes(store).values() for h in i}
    assert legacy <= referenced


async def test_gc_deletes_exactly_the_unreferenced_blobs(tmp_path: Path) -> None:
    """After deletes, a zero-grace collection retires the packs no remaining record uses and
    compacts mostly unused ones; the count it returns is the blobs it removed.
    """
    store = tmp_path / "store"
    storage = FileCheckpointStorage(store, gc_interval=None)
    async with CheckpointManager(storage) as manager:
        for step in range(6):
            state = big_state(step, docs=30) | {"own": [f"{step}-{i}" * 50 for i in range(20)]}
            await manager.create_checkpoint("wf", step, "a", "running", state)
        before = entries(store)
        packs_before = set(pack_indexes(store))
        assert await storage.collect_garbage() == 0  # within the grace period: nothing goes
        for step in (0, 2, 3):
            await manager.delete_checkpoints("wf", step)
        freed = await storage.collect_garbage(grace=0)
        assert freed > 0
        assert_swept(store)
        assert entries(store) == before - freed
        assert len(packs_before - set(pack_indexes(store))) >= 2  # steps 2 and 3: all theirs
        for cp in await manager.list_checkpoints("wf"):
            assert cp.state_snapshot.data["counter"] == cp.step


async def test_gc_compacts_a_mostly_unreferenced_pack(tmp_path: Path) -> None:
    """A pack whose blobs are mostly unreferenced is rewritten with only the referenced ones
    (durably, before the old one goes); the checkpoints using them still load.
    """
    store = tmp_path / "store"
    storage = FileCheckpointStorage(store, gc_interval=None)
    shared = {"docs": [f"shared {i} " * 40 for i in range(10)]}
    first = shared | {"own": [f"only in 0: {i} " * 60 for i in range(60)]}
    reader = CheckpointManager(FileCheckpointStorage(store, gc_interval=None))
    async with CheckpointManager(storage) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", first)
        (pack0,) = pack_indexes(store)
        index0 = pack_indexes(store)[pack0]
        await manager.create_checkpoint("wf", 1, "a", "running", shared | {"x": "y" * 9000})
        await reader.get_checkpoint("wf", 1)  # caches where the blobs were
        await manager.delete_checkpoints("wf", 0)
        freed = await storage.collect_garbage(grace=0)
        assert freed > 0 and not pack0.exists()
        still = {bytes.fromhex(h) for h in referenced_by_records(store)} & index0.keys()
        assert still, "step 1 shares blobs of step 0's pack"
        assert freed == len(index0) - len(still)
        assert still <= {h for index in pack_indexes(store).values() for h in index}
        assert_swept(store)
        got = await manager.get_checkpoint("wf", 1)
        assert got.state_snapshot.data == shared | {"x": "y" * 9000}
    async with CheckpointManager(FileCheckpointStorage(store)) as fresh:  # no cached index
        got = await fresh.get_checkpoint("wf", 1)
        assert got.state_snapshot.data == shared | {"x": "y" * 9000}
    # A reader whose cached index still points at the retired pack finds the copies.
    got = await reader.get_checkpoint("wf", 1)
    assert got.state_snapshot.data == shared | {"x": "y" * 9000}
    await reader.close()


async def test_pack_being_retired_is_still_read_and_restored(tmp_path: Path) -> None:
    """A pack left renamed to .gc-<name> (a sweeper deciding about it, or one that crashed)
    is still read; the next sweep renames it back, as the record still needs it.
    """
    store = tmp_path / "store"
    await (await _two_checkpoints(store)).close()
    path = _blob_only_in_step_1(store)[0]
    trash = path.with_name(".gc-" + path.name)
    path.rename(trash)
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        got = await manager.get_checkpoint("wf", 1)
        assert got.state_snapshot.data["counter"] == 1
        assert await manager.storage.collect_garbage(grace=0) >= 0  # type: ignore[attr-defined]
        assert path.exists() and not trash.exists()
        got = await manager.get_checkpoint("wf", 1)
        assert got.state_snapshot.data["counter"] == 1


async def test_concurrent_large_saves_in_one_process(tmp_path: Path) -> None:
    """Eight large saves at once through one storage object (eight worker threads sharing
    its pack cache) all land; they read back through it and through a new one.
    """
    store = tmp_path / "store"
    states = [
        big_state(n, docs=40) | {"own": [f"{n}/{i} " * 30 for i in range(30)]} for n in range(8)
    ]
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        await asyncio.gather(
            *(
                manager.create_checkpoint(f"wf-{n}", 0, "a", "running", st)
                for n, st in enumerate(states)
            )
        )
        for n, state in enumerate(states):
            assert (await manager.get_checkpoint(f"wf-{n}", 0)).state_snapshot.data == state
    async with CheckpointManager(FileCheckpointStorage(store)) as fresh:
        for n, state in enumerate(states):
            assert (await fresh.get_checkpoint(f"wf-{n}", 0)).state_snapshot.data == state
    assert referenced_by_records(store) <= blob_files(store)


async def test_gc_merges_many_small_packs(tmp_path: Path) -> None:
    """Twenty small packs, all still referenced, are merged by a sweep into one pack holding
    each blob once; nothing is freed and every checkpoint loads, also in a new process.
    """
    store = tmp_path / "store"
    storage = FileCheckpointStorage(store, gc_interval=None)
    states = [{"step": n, "own": [f"{n}-{i} " * 40 for i in range(80)]} for n in range(20)]
    async with CheckpointManager(storage) as manager:
        for step, state in enumerate(states):
            await manager.create_checkpoint("wf", step, "a", "running", state)
        before = pack_indexes(store)
        assert len(before) == 20
        hashes = {h for index in before.values() for h in index}
        assert await storage.collect_garbage(grace=0) == 0
        (merged,) = pack_indexes(store).values()
        assert set(merged) == hashes and len(merged) == len(hashes)
        got = [c.state_snapshot.data for c in await manager.list_checkpoints("wf")]
        assert got == states
    async with CheckpointManager(FileCheckpointStorage(store)) as fresh:
        got = [c.state_snapshot.data for c in await fresh.list_checkpoints("wf")]
        assert got == states


async def test_retention_triggers_collection(tmp_path: Path) -> None:
    """With a short interval and grace, max_checkpoints retention frees old blobs by itself."""
    store = tmp_path / "store"
    storage = FileCheckpointStorage(store, gc_interval=1e-9, blob_grace_seconds=1e-9)
    async with CheckpointManager(storage, max_checkpoints=2) as manager:
        for step in range(8):
            state = {"step": step, "own": [f"{step}-{i}" * 50 for i in range(40)]}
            await manager.create_checkpoint("wf", step, "a", "running", state)
        assert_swept(store)
        assert len(pack_indexes(store)) <= 3
        assert [c.step for c in await manager.list_checkpoints("wf")] == [6, 7]


async def _all_load(store: Path) -> int:
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        count = 0
        for wf in await manager.list_workflows():
            for cp in await manager.list_checkpoints(wf):
                assert cp.state_snapshot.data["step"] == cp.step
                count += 1
        return count


@pytest.mark.slow
async def test_sigkilled_writer_never_leaves_a_record_without_blobs(tmp_path: Path) -> None:
    """SIGKILL at random moments of big saves: every record on disk loads, every ack is there."""
    store = tmp_path / "store"
    rng = random.Random(9)
    acked: set[int] = set()
    for kill in range(KILLS):
        proc = spawn(str(store), "wf", str(kill), "1000000", "0", "0", "3600")
        first = await _first_ack(proc) if kill == 0 else b""
        # The child needs ~1-1.5 s to import and finish its first save on a loaded machine.
        await asyncio.sleep(0.3 + rng.random() * 1.7)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        acked |= {int(line) for line in (first + out).split(b"\n")[:-1]}
        assert await _all_load(store) >= len(acked)  # _all_load checks every record loads
    assert acked
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        present = {cp.step for cp in await manager.list_checkpoints("wf")}
    assert acked <= present


@pytest.mark.slow  # a kill loop or a decoding bomb: the slow tier
async def test_sigkilled_writer_of_1_mb_states_never_leaves_a_record_without_blobs(
    tmp_path: Path,
) -> None:
    """SIGKILL during saves of ~1 MB states whose packs are ~300 KB each: every record on
    disk loads, every acknowledged step is there, no pack is left half written.
    """
    store = tmp_path / "store"
    rng = random.Random(10)
    acked: set[int] = set()
    for kill in range(max(KILLS // 2, 2)):
        proc = spawn(str(store), "wf", str(kill), "1000000", "0", "0", "3600", "700")
        first = await _first_ack(proc) if kill == 0 else b""
        await asyncio.sleep(0.5 + rng.random() * 1.5)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        acked |= {int(line) for line in (first + out).split(b"\n")[:-1]}
        assert await _all_load(store) >= len(acked)
    assert acked
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        present = {cp.step for cp in await manager.list_checkpoints("wf")}
    assert acked <= present
    assert pack_indexes(store)  # parses every pack in place: none is half written


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
    assert_swept(store)
    assert await _all_load(store) == 6


def _to_format_2(store: Path) -> None:
    """Rewrite ``store``'s packs as a format-2 store: one file per blob, no packs."""
    for h, blob in stored_blobs(store).items():
        shard = store / "blobs" / h.hex()[:2]
        shard.mkdir(exist_ok=True)
        (shard / h.hex()).write_bytes(blob)
    for path in pack_indexes(store):
        path.unlink()
    (store / "blobs" / PACKS).rmdir()
    (store / "aiocheckpoint.json").write_text('{"format": 2}\n')


async def test_format_2_store_of_blob_files_reads_collects_and_upgrades(tmp_path: Path) -> None:
    """A store whose blobs are one file each (format 2) reads as before; a sweep deletes the
    files no record uses; the next large save writes a pack and marks the store format 3.
    """
    store = tmp_path / "store"
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        for step in range(3):
            state = big_state(step, docs=30) | {"own": [f"{step}-{i}" * 50 for i in range(20)]}
            await manager.create_checkpoint("wf", step, "a", "running", state)
    _to_format_2(store)
    files = blob_files(store)
    assert files and not pack_indexes(store)
    storage = FileCheckpointStorage(store, gc_interval=None)
    async with CheckpointManager(storage) as manager:
        for step in range(3):
            got = await manager.get_checkpoint("wf", step)
            assert got.state_snapshot.data["counter"] == step
        await manager.delete_checkpoints("wf", 0)
        assert await storage.collect_garbage(grace=0) > 0
        assert blob_files(store) == referenced_by_records(store) < files
        await manager.create_checkpoint("wf", 3, "a", "running", big_state(3, docs=30))
        assert json.loads((store / "aiocheckpoint.json").read_text()) == {"format": 3}
        assert len(pack_indexes(store)) == 1
        listed = [c.state_snapshot.data["counter"] for c in await manager.list_checkpoints("wf")]
        assert listed == [1, 2, 3]
    await _all_load_counters(store, [1, 2, 3])


async def _all_load_counters(store: Path, counters: list[int]) -> None:
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        got = [c.state_snapshot.data["counter"] for c in await manager.list_checkpoints("wf")]
        assert got == counters


@pytest.mark.parametrize("damage", [None, "flipped byte", "truncated", "garbage", "stale"])
async def test_combined_index_is_a_cache(tmp_path: Path, damage: str | None) -> None:
    """A writer keeps blobs/packs.midx covering its packs; a new process reads through it,
    and reads the same through a damaged or stale one (which it ignores or only partly uses).
    """
    store = tmp_path / "store"
    states = [{"step": n, "own": [f"{n}-{i} " * 40 for i in range(80)]} for n in range(40)]
    storage = FileCheckpointStorage(store, gc_interval=None)
    async with CheckpointManager(storage) as manager:
        for step, state in enumerate(states):
            await manager.create_checkpoint("wf", step, "a", "running", state)
    midx = store / "blobs" / MIDX
    covered = decode_midx(midx.read_bytes(), 2**30)
    packs = pack_indexes(store)
    assert len(covered) >= 32
    assert all(covered[p.name] == index for p, index in packs.items() if p.name in covered)
    if damage == "flipped byte":
        data = bytearray(midx.read_bytes())
        data[len(data) // 2] ^= 0x10
        midx.write_bytes(bytes(data))
    elif damage == "truncated":
        midx.write_bytes(midx.read_bytes()[:100])
    elif damage == "garbage":
        midx.write_bytes(b"\x00" * 64)
    elif damage == "stale":  # packs merged away since it was written, and a new pack
        async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as m:
            await m.storage.collect_garbage(grace=0)  # type: ignore[attr-defined]
        assert not set(covered) & {p.name for p in pack_indexes(store)}
    if damage not in (None, "stale"):
        with pytest.raises(PackDamagedError):
            decode_midx(midx.read_bytes(), 2**30)
    async with CheckpointManager(FileCheckpointStorage(store, gc_interval=None)) as manager:
        got = [c.state_snapshot.data for c in await manager.list_checkpoints("wf")]
        assert got == states


async def test_planted_fifo_and_directories_do_not_hang_or_break_reads(tmp_path: Path) -> None:
    """A FIFO and a directory named like packs, and a FIFO as the combined index, are
    skipped: checkpoints read as before and a sweep leaves them alone.
    """
    store = tmp_path / "store"
    await (await _two_checkpoints(store)).close()
    packs = store / "blobs" / PACKS
    os.mkfifo(packs / ("f" * 24 + ".pack"))
    (packs / ("d" * 24 + ".pack")).mkdir()
    (store / "blobs" / MIDX).unlink(missing_ok=True)
    os.mkfifo(store / "blobs" / MIDX)
    storage = FileCheckpointStorage(store, gc_interval=None)
    async with CheckpointManager(storage) as manager:
        for step in (0, 1):
            got = await asyncio.wait_for(manager.get_checkpoint("wf", step), 30)
            assert got.state_snapshot.data["counter"] == step
        await asyncio.wait_for(storage.collect_garbage(grace=0), 30)
    assert (packs / ("f" * 24 + ".pack")).exists() and (packs / ("d" * 24 + ".pack")).is_dir()


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


async def test_blobs_are_read_whole_whatever_their_spread_in_a_pack(tmp_path: Path) -> None:
    """A fetch of neighbouring blobs (one read of their span) and of blobs far apart in a
    large pack (read in runs) both return each blob's exact stored bytes."""
    storage = FileCheckpointStorage(tmp_path)
    state = {"docs": [{"i": i, "body": random.Random(i).randbytes(3000).hex()} for i in range(300)]}
    async with CheckpointManager(storage) as manager:
        await manager.create_checkpoint("wf", 0, "agent", "running", state)
        ((path, index),) = pack_indexes(tmp_path).items()
        raw = path.read_bytes()
        by_offset = sorted(index, key=lambda h: index[h][0])
        for wanted in (by_offset[10:20], by_offset[:2] + by_offset[-2:], by_offset):
            got = await storage.fetch_blobs(wanted)
            assert got == {h: raw[index[h][0] : index[h][0] + index[h][1]] for h in wanted}


async def test_a_pack_cut_short_after_its_index_was_read_loses_the_blobs_past_the_cut(
    tmp_path: Path,
) -> None:
    """A pack truncated under a warm cache: the blobs before the cut still read, the rest
    are missing, and a resume reports corruption instead of a wrong state."""
    storage = FileCheckpointStorage(tmp_path)
    async with CheckpointManager(storage) as manager:
        await manager.create_checkpoint("wf", 0, "agent", "running", big_state(1))
        ((path, index),) = pack_indexes(tmp_path).items()
        by_offset = sorted(index, key=lambda h: index[h][0])
        cut = index[by_offset[len(by_offset) // 2]][0]
        os.truncate(path, cut)
        got = await storage.fetch_blobs(by_offset)
        assert set(got) == {h for h in by_offset if sum(index[h]) <= cut}
        with pytest.raises(CheckpointCorruptedError):
            await manager.get_resume_point("wf")


async def test_a_blob_over_max_record_bytes_is_refused_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    """save_tree checks every blob's size (the largest one) before it writes anything."""
    from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2

    manager = CheckpointManager(InMemoryCheckpointStorage())
    checkpoint = await manager.create_checkpoint(
        "wf", 1, "a", "running", {"small": "x" * 3000, "big": "y" * 100_000}
    )
    storage = FileCheckpointStorage(tmp_path / "store", max_record_bytes=64 * 1024)
    async with storage:
        record, split = encode_checkpoint_v2(checkpoint, storage.blob_params)
        assert len(record) < 64 * 1024
        assert sorted(map(len, split.blobs.values()))[-2] < 64 * 1024  # only one is over
        assert split.blob_max == max(map(len, split.blobs.values()))
        # Counted by the split, or (a split built without the count) found among its blobs.
        for given in (split, dataclasses.replace(split, blob_max=None)):
            with pytest.raises(InvalidArgumentError, match="max_record_bytes"):
                await storage.save_tree("wf", 1, record, given)
        assert await storage.load("wf", 1) is None
        assert await storage.fetch_blobs(list(split.blobs)) == {}


async def test_a_store_object_sees_packs_another_one_wrote_since_its_last_save(
    tmp_path: Path,
) -> None:
    """A save lists packs/ again when it changed (here: another object's pack), so blobs
    another writer stored are shared, not written again."""
    from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2

    source = CheckpointManager(InMemoryCheckpointStorage())
    store = tmp_path / "store"
    async with FileCheckpointStorage(store) as a, FileCheckpointStorage(store) as b:

        def state(counter: int) -> dict[str, Any]:  # no blob shared between counters
            return {"docs": [f"{counter} {i} " + "lorem ipsum " * 80 for i in range(100)]}

        async def save(storage: FileCheckpointStorage, wf: str, counter: int) -> None:
            checkpoint = await source.create_checkpoint(wf, 0, "a", "running", state(counter))
            await storage.save_tree(wf, 0, *encode_checkpoint_v2(checkpoint, storage.blob_params))

        for counter in (0, 2):  # b has listed packs/ and written to it since
            await save(b, f"wf-b{counter}", counter)
        await save(a, "wf-a", 1)
        packs, blobs = set(pack_indexes(store)), blob_files(store)
        assert len(packs) == 3
        await save(b, "wf-c", 1)
        assert set(pack_indexes(store)) == packs  # every blob found in a's pack: no new one
        assert blob_files(store) == blobs
        got = await CheckpointManager(b).get_checkpoint("wf-c", 0)
        assert got.state_snapshot.data == state(1)


async def test_a_save_touches_a_pack_it_relies_on_once_the_pack_aged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack this object wrote counts as recent for half the grace period only: a save
    after that looks at it again and touches it (the collector's safety argument)."""
    from aiocheckpoint.storage.file import blobs as blob_module

    later = 0.0
    clock = time.time
    monkeypatch.setattr(blob_module, "time", SimpleNamespace(time=lambda: clock() + later))
    store = tmp_path / "store"
    async with CheckpointManager(FileCheckpointStorage(store, blob_grace_seconds=100)) as m:
        await m.create_checkpoint("wf", 0, "a", "running", big_state(0))
        (first,) = pack_indexes(store)
        os.utime(first, (clock() - 3600, clock() - 3600))
        await m.create_checkpoint("wf", 1, "a", "running", big_state(1))
        assert first.stat().st_mtime < clock() - 3000  # seen within grace/2: not looked at
        later = 51.0  # past grace/2 since this object wrote it
        await m.create_checkpoint("wf", 2, "a", "running", big_state(2))
        assert first.stat().st_mtime > clock() - 60  # relied on, so touched
        assert (await m.get_checkpoint("wf", 2)).state_snapshot.data == big_state(2)


async def test_a_save_relying_on_another_writers_pack_makes_its_entry_durable_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack another object wrote may lack its directory fsync: a save relying on it (and
    writing no pack of its own) fsyncs ``packs/``, again after a failed fsync, and once it
    succeeded the next save does not."""
    from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2
    from aiocheckpoint.errors import StorageBackendError

    source = CheckpointManager(InMemoryCheckpointStorage())
    checkpoint = await source.create_checkpoint("wf", 0, "a", "running", big_state(0))
    store = tmp_path / "store"
    async with FileCheckpointStorage(store) as a, FileCheckpointStorage(store) as b:
        await b.save_tree("wf-b", 0, *encode_checkpoint_v2(checkpoint, b.blob_params))
        fsyncs: list[int] = []
        real = a._blobs._fsync_packs_dir

        def fsync() -> None:
            fsyncs.append(1)
            if len(fsyncs) == 1:
                raise OSError(5, "injected")
            real()

        monkeypatch.setattr(a._blobs, "_fsync_packs_dir", fsync)
        with pytest.raises(StorageBackendError):
            await a.save_tree("wf-a", 0, *encode_checkpoint_v2(checkpoint, a.blob_params))
        for step in (0, 1):
            await a.save_tree("wf-a", step, *encode_checkpoint_v2(checkpoint, a.blob_params))
        assert len(pack_indexes(store)) == 1  # every blob found in b's pack
        assert fsyncs == [1, 1]


async def test_a_growing_chat_does_not_walk_the_packs_its_tree_relies_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save whose packs are all recent and durable finds its new blobs in one pass over
    the tree's nodes and does not walk the packs they sit in (one per earlier save)."""
    from aiocheckpoint import SharedState
    from aiocheckpoint.storage.file.blobs import BlobStore

    walks: list[int] = []
    stale = BlobStore._stale
    monkeypatch.setattr(
        BlobStore, "_stale", lambda self, packs, cut: (walks.append(1), stale(self, packs, cut))[1]
    )
    store = tmp_path / "store"
    shared = SharedState()
    async with CheckpointManager(FileCheckpointStorage(store)) as manager:
        for step in range(40):
            shared.append("messages", {"role": "user", "content": f"{step} " + "lorem " * 150})
            await manager.create_checkpoint("wf", step, "a", "running", shared)
        assert len(pack_indexes(store)) >= 30
        got = await manager.get_checkpoint("wf", 39)
        assert len(got.state_snapshot.data["messages"]) == 40
    assert walks == []


async def test_a_pack_listed_while_a_save_looks_up_its_blobs_is_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing (another save's) that adds a pack after a save found no pack to look at
    sends that save the long way: the pack it now relies on is stat'ed and fsynced."""
    from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2

    source = CheckpointManager(InMemoryCheckpointStorage())
    other = await source.create_checkpoint("wf", 0, "a", "running", big_state(0))
    shared = await source.create_checkpoint("wf", 1, "a", "running", big_state(1, docs=150))
    store = tmp_path / "store"
    async with FileCheckpointStorage(store) as a, FileCheckpointStorage(store) as b:
        await a.save_tree("wf-a", 0, *encode_checkpoint_v2(other, a.blob_params))
        await b.save_tree("wf-b", 0, *encode_checkpoint_v2(shared, b.blob_params))
        blobs = a._blobs
        age = blobs._age

        def age_then_list(cut: float) -> tuple[bool, int]:
            got = age(cut)
            blobs.refresh()  # as a concurrent save's listing would, right after the check
            return got

        fsyncs: list[int] = []
        real = blobs._fsync_packs_dir
        monkeypatch.setattr(blobs, "refresh_changed", lambda: None)
        monkeypatch.setattr(blobs, "_age", age_then_list)
        monkeypatch.setattr(blobs, "_fsync_packs_dir", lambda: (fsyncs.append(1), real())[1])
        await a.save_tree("wf-a", 1, *encode_checkpoint_v2(shared, a.blob_params))
        assert len(pack_indexes(store)) == 2  # the shared blobs found in b's pack
        assert fsyncs == [1]


async def test_a_pack_dropped_while_a_save_looks_at_its_packs_is_stored_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing (another save's) that finds an aged pack gone, after a save looked its
    blobs up there, still makes that save store them again (the pack was retired)."""
    from aiocheckpoint.storage.file import blobs as blob_module

    later = 0.0
    clock = time.time
    monkeypatch.setattr(blob_module, "time", SimpleNamespace(time=lambda: clock() + later))
    store = tmp_path / "store"
    storage = FileCheckpointStorage(store, blob_grace_seconds=100)
    async with CheckpointManager(storage) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", big_state(0))
        (first,) = pack_indexes(store)
        blobs = storage._blobs
        relies = blobs._relies_on_suspect

        def retire_then_check(names: list[str | None], epoch: int) -> bool:
            first.rename(tmp_path / "retired")  # as a sweeper would, then a listing
            blobs.refresh()
            return relies(names, epoch)

        later = 51.0  # the pack aged: the save looks at the packs it relies on
        monkeypatch.setattr(blobs, "refresh_changed", lambda: None)
        monkeypatch.setattr(blobs, "_relies_on_suspect", retire_then_check)
        await manager.create_checkpoint("wf", 1, "a", "running", big_state(1))
        monkeypatch.undo()
        assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == big_state(1)
