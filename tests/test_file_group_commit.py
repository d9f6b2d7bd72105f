"""The file store's group commit: saves queued behind a busy writer are written together.

Faults are injected at the FileOps seam; a ``syncfs`` that waits on an event holds a group
in flight so that the tests can queue and cancel saves behind it deterministically.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aiocheckpoint import CheckpointManager, InvalidArgumentError, StorageBackendError
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.effects import EffectFiles
from aiocheckpoint.storage.file.io import FileOps
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage

from .reliability._support import dump_store
from .reliability.test_io_faults import PlannedFault, _caused_by
from .test_file_faults import litter


def test_this_kernel_has_syncfs() -> None:
    """The tests below need syncfs (Linux 5.8 or later); without it saves never group."""
    assert FileOps.has_syncfs


class GroupOps(FileOps):
    """Records syncfs and renames; fails writes of chosen data; can hold syncfs."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.poison: set[bytes] = set()  # a write of these bytes fails with EIO
        self.syncfs_error: int | None = None
        self.entered = threading.Event()  # a syncfs started
        self.release = threading.Event()
        self.release.set()

    def write(self, fd: int, data: memoryview) -> int:
        if bytes(data) in self.poison:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self.calls.append("write hint")
        return super().pwrite(fd, data, offset)

    def syncfs(self, fd: int) -> None:
        self.calls.append("syncfs")
        self.entered.set()
        self.release.wait(10)
        if self.syncfs_error is not None:
            raise OSError(self.syncfs_error, os.strerror(self.syncfs_error))
        super().syncfs(fd)

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        self.calls.append("rename")
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


@pytest.fixture
async def grouped(tmp_path: Path) -> AsyncIterator[tuple[FileCheckpointStorage, GroupOps]]:
    store = FileCheckpointStorage(tmp_path / "s")
    for i in range(8):  # the directories exist: groups below only write records
        await store.save(f"wf-{i}", 0, b"zero")
    ops = GroupOps()
    store._os = ops
    yield store, ops
    ops.release.set()
    await store.close()


async def hold_a_group(
    store: FileCheckpointStorage, ops: GroupOps, workflow_id: str
) -> asyncio.Task[None]:
    """Start a save of two records whose group waits in its first syncfs until released."""
    ops.release.clear()
    ops.entered.clear()
    first = asyncio.create_task(store.save(workflow_id, 1, b"held"))
    second = asyncio.create_task(store.save(workflow_id + "-b", 1, b"held"))
    await asyncio.to_thread(ops.entered.wait, 10)
    assert ops.entered.is_set()
    return asyncio.create_task(_both(first, second))


async def _both(a: asyncio.Task[None], b: asyncio.Task[None]) -> None:
    await a
    await b


async def test_concurrent_saves_share_two_syncfs(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """Eight concurrent saves: the hints, one syncfs, eight renames, one syncfs."""
    store, ops = grouped
    await asyncio.gather(*(store.save(f"wf-{i}", 1, b"one %d" % i) for i in range(8)))
    assert ops.calls == ["write hint"] * 8 + ["syncfs"] + ["rename"] * 8 + ["syncfs"]
    for i in range(8):
        got = await store.load(f"wf-{i}")
        assert got is not None and got.step == 1 and got.data == b"one %d" % i


async def test_tree_saves_queued_behind_a_busy_writer_share_its_next_group(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """Large states' saves (records with blobs) join the group commit, as plain saves do:
    four of them queued behind a held group are written by one group and its two syncfs."""
    from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2

    store, ops = grouped
    source = CheckpointManager(InMemoryCheckpointStorage())
    trees = []
    for i in range(4):
        state = {"i": i, "docs": [f"{i} {d} " + "lorem ipsum " * 80 for d in range(50)]}
        checkpoint = await source.create_checkpoint(f"wf-{i}", 1, "a", "running", state)
        trees.append(encode_checkpoint_v2(checkpoint, store.blob_params))
    held = await hold_a_group(store, ops, "held")
    saves = [store.save_tree(f"wf-{i}", 1, *tree) for i, tree in enumerate(trees)]
    tasks = [asyncio.create_task(save) for save in saves]
    with anyio.fail_after(10):  # their blobs written, each record waits for the next group
        while len(store._group._queue) < 4:  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.01)
    ops.calls.clear()
    ops.release.set()
    await held
    await asyncio.gather(*tasks)
    held_rest = ["rename"] * 2 + ["syncfs"]
    assert ops.calls == held_rest + ["write hint"] * 4 + ["syncfs"] + ["rename"] * 4 + ["syncfs"]
    for i, (_record, split) in enumerate(trees):
        got = await store.load(f"wf-{i}")
        assert got is not None and got.step == 1
        assert set(await store.fetch_blobs(list(split.blobs))) == set(split.blobs)


async def test_effect_records_and_saves_share_two_syncfs(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """Four saves and four effect records at once: one group, its two syncfs."""
    store, ops = grouped
    await asyncio.gather(
        *(store.save(f"wf-{i}", 1, b"one %d" % i) for i in range(4)),
        *(store.put_effect(f"wf-{i}", 1, f"k{i}", b"fx", in_doubt=True) for i in range(8)),
    )
    assert ops.calls == ["write hint"] * 4 + ["syncfs"] + ["rename"] * 12 + ["syncfs"]
    for i in range(8):
        assert [e.key for e in await store.load_effects(f"wf-{i}", 1)] == [f"k{i}"]


async def test_a_failing_effect_record_does_not_fail_the_group(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """An effect record whose write fails raises a typed error; the rest of its group lands."""
    store, ops = grouped
    poisoned = EffectFiles.op("wf-1", 1, "bad", b"poison", False).data
    ops.poison.add(poisoned)
    results = await asyncio.gather(
        store.save("wf-0", 1, b"one"),
        store.put_effect("wf-1", 1, "bad", b"poison", in_doubt=False),
        store.put_effect("wf-1", 1, "good", b"fine", in_doubt=False),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], StorageBackendError) and "effect" in str(results[1])
    assert [e.key for e in await store.load_effects("wf-1", 1)] == ["good"]
    assert (await store.load("wf-0", 1)) is not None


async def test_one_failing_save_does_not_fail_the_others(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """EIO while writing one record fails that save only; the rest of the group lands."""
    store, ops = grouped
    ops.poison.add(b"bad")
    results = await asyncio.gather(
        *(store.save(f"wf-{i}", 1, b"bad" if i == 3 else b"good") for i in range(8)),
        return_exceptions=True,
    )
    assert ops.calls.count("syncfs") == 2  # one group
    failed = results[3]
    assert isinstance(failed, StorageBackendError)
    assert isinstance(failed.__cause__, OSError) and failed.__cause__.errno == errno.EIO
    assert "step 1" in str(failed) and "'wf-3'" in str(failed)
    assert [r for i, r in enumerate(results) if i != 3] == [None] * 7
    for i in range(8):
        got = await store.load(f"wf-{i}")
        assert got is not None
        assert (got.step, got.data) == ((0, b"zero") if i == 3 else (1, b"good"))
    assert litter(Path(store.base_dir)) == []


async def test_failed_syncfs_fails_the_group_and_keeps_old_records(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """EIO from the first syncfs fails every save of the group before any rename."""
    store, ops = grouped
    ops.syncfs_error = errno.EIO
    results = await asyncio.gather(
        *(store.save(f"wf-{i}", 1, b"new") for i in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, StorageBackendError) for r in results)
    assert "rename" not in ops.calls
    ops.syncfs_error = None
    for i in range(4):
        got = await store.load(f"wf-{i}")  # the raised hint names a missing step: rescanned
        assert got is not None and (got.step, got.data) == (0, b"zero")
    assert litter(Path(store.base_dir)) == []
    await asyncio.gather(*(store.save(f"wf-{i}", 1, b"new") for i in range(4)))
    got = await store.load("wf-2")
    assert got is not None and got.data == b"new"


async def test_same_workflow_twice_in_one_group_keeps_submission_order(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """Two saves of one step in a group: the later one wins; the hint names the highest."""
    store, ops = grouped
    await asyncio.gather(
        store.save("wf-0", 5, b"first"),
        store.save("wf-0", 5, b"second"),
        store.save("wf-0", 3, b"three"),
        store.save("wf-1", 1, b"x", keep_last=1),
    )
    assert ops.calls.count("syncfs") == 2
    got = await store.load("wf-0")
    assert got is not None and (got.step, got.data) == (5, b"second")
    assert [r.step for r in await store.scan("wf-0")] == [0, 3, 5]
    assert [r.step for r in await store.scan("wf-1")] == [1]


async def test_cancelled_while_queued_is_not_written(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """A save cancelled while it waits behind a busy writer is never written."""
    store, ops = grouped
    held = await hold_a_group(store, ops, "wf-0")
    queued = asyncio.create_task(store.save("wf-5", 7, b"never"))
    kept = asyncio.create_task(store.save("wf-6", 7, b"kept"))
    await asyncio.sleep(0.01)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    ops.release.set()
    await held
    await kept
    assert not await store.exists("wf-5", 7)
    got = await store.load("wf-6")
    assert got is not None and got.data == b"kept"
    assert litter(Path(store.base_dir)) == []


async def test_cancelled_while_written_waits_and_lands_whole(
    grouped: tuple[FileCheckpointStorage, GroupOps],
) -> None:
    """A save cancelled while its group is being written waits for it, then is cancelled."""
    store, ops = grouped
    ops.release.clear()
    ops.entered.clear()
    saving = asyncio.create_task(store.save("wf-1", 9, b"in flight"))
    other = asyncio.create_task(store.save("wf-2", 9, b"in flight too"))
    await asyncio.to_thread(ops.entered.wait, 10)
    assert ops.entered.is_set()  # the two saves are one group, held in its first syncfs
    saving.cancel()
    await asyncio.sleep(0.05)
    assert not saving.done()  # it waits for its group: no half-done write behind its back
    ops.release.set()
    with pytest.raises(asyncio.CancelledError):
        await saving
    await other
    got = await store.load("wf-1")
    assert got is not None and (got.step, got.data) == (9, b"in flight")
    assert litter(Path(store.base_dir)) == []


async def test_cancel_scope_while_written_waits_without_spinning(
    grouped: tuple[FileCheckpointStorage, GroupOps], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under an anyio cancel scope (which delivers its cancellation again at every await) a
    save whose group is being written waits for it once: it does not spin on the loop,
    which would starve the group's thread of the GIL.
    """
    store, ops = grouped
    waits = 0
    real_wait = asyncio.wait

    async def counting_wait(*args: Any, **kwargs: Any) -> Any:
        nonlocal waits
        waits += 1
        return await real_wait(*args, **kwargs)

    ops.release.clear()
    ops.entered.clear()

    async def save_under_a_scope() -> None:
        with anyio.move_on_after(0.01):
            await store.save("wf-3", 9, b"in flight")

    saving = asyncio.create_task(save_under_a_scope())
    other = asyncio.create_task(store.save("wf-4", 9, b"in flight too"))
    await asyncio.to_thread(ops.entered.wait, 10)
    assert ops.entered.is_set()
    monkeypatch.setattr(asyncio, "wait", counting_wait)
    await asyncio.sleep(0.1)  # the scope's deadline passed long ago: the save is waiting
    assert not saving.done()
    ops.release.set()
    await saving
    await other
    monkeypatch.undo()
    assert waits <= 2, f"the cancelled save waited {waits} times (spinning)"
    got = await store.load("wf-3")
    assert got is not None and (got.step, got.data) == (9, b"in flight")


async def test_close_finishes_queued_saves(tmp_path: Path) -> None:
    """close() waits for the saves already queued; later calls raise."""
    store = FileCheckpointStorage(tmp_path / "s")
    tasks = [asyncio.create_task(store.save(f"w{i}", 1, b"x")) for i in range(20)]
    await asyncio.sleep(0)
    await store.close()
    await asyncio.gather(*tasks)
    async with FileCheckpointStorage(tmp_path / "s") as reopened:
        assert len(await reopened.list_workflows()) == 20


async def test_manager_saves_under_heavy_concurrency(tmp_path: Path) -> None:
    """100 workflows x 5 checkpoints through the manager: every one is stored and decodes."""
    async with CheckpointManager(FileCheckpointStorage(tmp_path / "s")) as manager:

        async def run(wf: str) -> None:
            for step in range(5):
                await manager.create_checkpoint(wf, step, "a", "completed", {"n": step})

        await asyncio.gather(*(run(f"wf-{i}") for i in range(100)))
        for i in range(0, 100, 7):
            stored = await manager.list_checkpoints(f"wf-{i}")
            assert [c.state_snapshot.data["n"] for c in stored] == list(range(5))


async def test_without_syncfs_each_save_fsyncs_its_own_files(tmp_path: Path) -> None:
    """use_syncfs=False: no syncfs; every save fsyncs its file and directory as before."""
    store = FileCheckpointStorage(tmp_path / "s", use_syncfs=False)
    ops = GroupOps()
    store._os = ops
    await asyncio.gather(*(store.save(f"wf-{i}", 0, b"x") for i in range(6)))
    assert "syncfs" not in ops.calls
    assert len(await store.list_workflows()) == 6
    await store.close()
    with pytest.raises(InvalidArgumentError):
        FileCheckpointStorage(tmp_path / "t", use_syncfs=1)  # type: ignore[arg-type]


#: The OS calls a group makes (new steps, a replaced step, retention, a new workflow).
GROUP_CALLS = ["mkdir", "open", "write", "close", "pwrite", "fsync", "fsync_dir", "syncfs"]
GROUP_CALLS += ["rename", "unlink"]
GROUP_SAVES = [("a", 2, None), ("a", 1, None), ("b", 2, 2), ("c", 0, None)]


@pytest.mark.parametrize("sticky", [False, True], ids=["once", "from-then-on"])
@pytest.mark.parametrize("method", GROUP_CALLS)
async def test_every_fault_in_a_group_is_typed_and_harmless(
    tmp_path: Path, method: str, sticky: bool
) -> None:
    """Each call of each OS function in a group of four saves, failed with EIO: the saves it
    hits raise a StorageBackendError chaining it, the others land, records outside the group
    are unchanged, no temporary file remains, and the store works once the fault is gone."""
    await group_fault_scenario(tmp_path, method, sticky)


@pytest.mark.parametrize("sticky", [False, True], ids=["once", "from-then-on"])
@pytest.mark.parametrize("method", [m for m in GROUP_CALLS if m != "syncfs"])
async def test_every_fault_in_a_group_with_fsync_barriers_is_typed_and_harmless(
    tmp_path: Path, method: str, sticky: bool
) -> None:
    """The same with ``use_syncfs=False``: the group's barriers are fsyncs of every temp file
    and raised hint, then of every directory, issued together from several threads."""
    await group_fault_scenario(tmp_path, method, sticky, use_syncfs=False)


async def group_fault_scenario(
    tmp_path: Path, method: str, sticky: bool, *, use_syncfs: bool = True
) -> None:
    """Fail each call of ``method`` in turn (once, or from then on) in a group of four saves."""
    fired = 0
    nth = 1
    while True:
        root = tmp_path / f"run-{nth}"
        async with FileCheckpointStorage(root) as setup:
            for wf in ("a", "b"):
                for step in (0, 1):
                    await setup.save(wf, step, b"old %s %d" % (wf.encode(), step))
            before = await dump_store(setup)
        store = FileCheckpointStorage(root, use_syncfs=use_syncfs)
        fault = PlannedFault(method, nth, errno.EIO, sticky)
        store._os = fault
        new = {(wf, s): b"new %s %d" % (wf.encode(), s) for wf, s, _ in GROUP_SAVES}
        results = await asyncio.gather(
            *(store.save(wf, s, new[wf, s], keep_last=k) for wf, s, k in GROUP_SAVES),
            return_exceptions=True,
        )
        store._os = FileOps()
        after = await dump_store(store)
        for (wf, s, _), result in zip(GROUP_SAVES, results, strict=True):
            if result is None:
                assert after[wf, s] == new[wf, s]
            else:
                assert isinstance(result, StorageBackendError), result
                assert _caused_by(result, errno.EIO)
                assert after.get((wf, s)) in (before.get((wf, s)), new[wf, s])
        for key in ("a", 0), ("b", 1):
            assert after[key] == before[key]
        assert after.get(("b", 0)) in (
            None if ("b", 2) in after else before["b", 0],
            before["b", 0],
        )
        assert litter(root) == []
        await asyncio.gather(*(store.save(wf, s, new[wf, s]) for wf, s, _ in GROUP_SAVES))
        for wf, top in (("a", 2), ("b", 2), ("c", 0)):
            latest = await store.load(wf)
            assert latest is not None and (latest.step, latest.data) == (top, new[wf, top])
        await store.close()
        if not fault.fired:
            break
        fired += fault.fired
        nth += 1
    assert fired > 0


#: A group's effect records: an existing key replaced, a new key, a workflow's first one.
GROUP_EFFECTS = [("a", 1, "k"), ("a", 2, "new"), ("d", 0, "first")]


@pytest.mark.parametrize("use_syncfs", [True, False], ids=["syncfs", "fsync"])
@pytest.mark.parametrize("method", GROUP_CALLS)
async def test_every_fault_in_a_group_with_effects_is_typed_and_harmless(
    tmp_path: Path, method: str, use_syncfs: bool
) -> None:
    """Each call of each OS function in a group of two saves and three effect records,
    failed once with EIO: what it hits raises a StorageBackendError chaining it and keeps
    its old record or the new one, the rest land, no temporary file remains."""
    if method == "syncfs" and not use_syncfs:
        return  # never called: covered by the fsync barriers' own calls
    nth, fired = 1, 0
    while True:
        root = tmp_path / f"run-{nth}"
        async with FileCheckpointStorage(root) as setup:
            await setup.save("a", 0, b"old")
            await setup.put_effect("a", 1, "k", b"old", in_doubt=True)
        store = FileCheckpointStorage(root, use_syncfs=use_syncfs)
        fault = PlannedFault(method, nth, errno.EIO, False)
        store._os = fault
        results = await asyncio.gather(
            store.save("a", 1, b"new a 1", keep_last=1),
            store.save("b", 0, b"new b 0"),
            *(store.put_effect(wf, s, k, b"new", in_doubt=False) for wf, s, k in GROUP_EFFECTS),
            return_exceptions=True,
        )
        store._os = FileOps()
        for (wf, s, k), result in zip(GROUP_EFFECTS, results[2:], strict=True):
            got = [(e.key, e.data) for e in await store.load_effects(wf, s) if e.key == k]
            if result is None:
                assert got == [(k, b"new")]
            else:
                assert isinstance(result, StorageBackendError) and _caused_by(result, errno.EIO)
                assert got in ([(k, b"new")], [(k, b"old")] if k == "k" else [])
        for (wf, s), result in zip([("a", 1), ("b", 0)], results[:2], strict=True):
            loaded = await store.load(wf, s)
            assert result is not None or (loaded is not None and loaded.data.startswith(b"new"))
        assert litter(root) == []
        await store.close()
        if not fault.fired:
            break
        fired += fault.fired
        nth += 1
    assert fired > 0


async def test_a_tree_save_that_waited_for_its_group_stores_its_blobs_again(
    tmp_path: Path,
) -> None:
    """A save whose record waits past the grace period: a sweep may retire the pack its
    blobs were found in meanwhile; the writer puts them again before the record."""
    store = FileCheckpointStorage(tmp_path / "store", blob_grace_seconds=0.4)
    state = {"docs": [f"{i:05d}" + "x" * 2000 for i in range(400)]}
    async with CheckpointManager(store) as manager:
        await manager.create_checkpoint("a", 1, "x", "completed", state)
        await manager.delete_checkpoints("a")  # nothing references its pack now
        commit = store._group.commit

        async def late(op: Any) -> None:
            await asyncio.sleep(0.6)  # past the grace period, its record not yet written
            assert await store.collect_garbage() > 0  # the pack is retired
            await commit(op)

        store._group.commit = late  # type: ignore[method-assign]
        await manager.create_checkpoint("b", 1, "x", "completed", state)
        store._group.commit = commit  # type: ignore[method-assign]
        assert (await manager.get_checkpoint("b", 1)).state_snapshot.data == state
