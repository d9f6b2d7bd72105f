"""I/O faults: the caller gets a typed error with the cause, and nothing already stored is lost.

Two sources of faults:

* the file backend's fault-injection seam (``storage._os``, a :class:`FileOps`): every call
  index of every OS call of every write path fails in turn, once or from then on, with EIO
  and ENOSPC;
* real kernels: a 256 KiB tmpfs that fills up, and a remount read-only (these run on every
  durable backend that keeps its data on the local disk; they need root, as in CI).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import CheckpointError, CheckpointManager, CheckpointStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.io import FileOps
from tests._tmpfs import tiny_tmpfs

from ._support import SOAK, TALLY, Dump, decode_stored, dump_store
from .conftest import BACKENDS, Backend

FILE = next(b for b in BACKENDS if b.name == "file")
#: (errno, persistent) pairs: a one-off EIO and a disk that stays full; all pairs under soak.
_ALL_CODES = (errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT)
PLANS = (
    [(code, sticky) for code in _ALL_CODES for sticky in (False, True)]
    if SOAK
    else [(errno.EIO, False), (errno.ENOSPC, True)]
)


class PlannedFault(FileOps):
    """Fails the ``nth`` call of ``method`` (and, if ``persistent``, every later one)."""

    def __init__(self, method: str, nth: int, code: int, persistent: bool) -> None:
        self.method, self.nth, self.code, self.persistent = method, nth, code, persistent
        self.calls = 0
        self.fired = 0

    def _hit(self, method: str) -> None:
        if method != self.method:
            return
        self.calls += 1
        if self.calls == self.nth or (self.persistent and self.calls > self.nth):
            self.fired += 1
            raise OSError(self.code, os.strerror(self.code))

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        self._hit("open")
        return super().open(path, flags, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: memoryview) -> int:
        self._hit("write")
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._hit("pwrite")
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._hit("fsync")
        super().fsync(fd)

    def fsync_dir(self, fd: int) -> None:
        self._hit("fsync_dir")
        super().fsync_dir(fd)

    def syncfs(self, fd: int) -> None:
        self._hit("syncfs")
        super().syncfs(fd)

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        self._hit("rename")
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, path: str, *, dir_fd: int | None = None) -> None:
        self._hit("unlink")
        super().unlink(path, dir_fd=dir_fd)

    def mkdir(self, path: str, mode: int = 0o700, *, dir_fd: int | None = None) -> None:
        self._hit("mkdir")
        super().mkdir(path, mode, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        super().close(fd)  # like the kernel: the descriptor is gone even when close fails
        self._hit("close")


def _caused_by(exc: BaseException, code: int) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == code:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


NEW = {"new": True}


async def _baseline(storage: CheckpointStorage) -> Dump:
    manager = CheckpointManager(storage)
    await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 0})
    await manager.create_checkpoint("wf", 1, "a", "completed", {"n": 1})
    await manager.create_checkpoint("other", 0, "a", "completed", {"o": 0})
    return await dump_store(storage)


async def _do(op: str, storage: CheckpointStorage) -> Any:
    """Run the operation under test; the affected keys are listed in ``AFFECTED``."""
    if op in ("first_save", "save_new_workflow"):
        wf = "wf" if op == "first_save" else "new"
        return await CheckpointManager(storage).create_checkpoint(wf, 0, "a", "completed", NEW)
    if op == "save_new_step":
        return await CheckpointManager(storage).create_checkpoint("wf", 2, "a", "completed", NEW)
    if op == "replace_step":
        return await CheckpointManager(storage).create_checkpoint("wf", 1, "a", "completed", NEW)
    if op == "save_with_retention":
        manager = CheckpointManager(storage, max_checkpoints=2)
        return await manager.create_checkpoint("wf", 2, "a", "completed", NEW)
    if op == "delete_step":
        return await storage.delete("wf", 1)
    return await storage.delete("wf")


#: What each operation may change; everything else must stay byte for byte.
AFFECTED: dict[str, set[tuple[str, int]]] = {
    "first_save": {("wf", 0)},
    "save_new_workflow": {("new", 0)},
    "save_new_step": {("wf", 2)},
    "replace_step": {("wf", 1)},
    "save_with_retention": {("wf", 2), ("wf", 0)},
    "delete_step": {("wf", 1)},
    "delete_workflow": {("wf", 0), ("wf", 1)},
}

#: The OS calls each write path makes (from a counting run of the file backend).
CALLS = {
    "first_save": ["mkdir", "open", "write", "fsync", "close", "rename", "fsync_dir", "pwrite"],
    "save_new_workflow": ["mkdir", "open", "close", "pwrite", "fsync_dir", "rename", "write"],
    "save_new_step": ["open", "write", "fsync", "close", "pwrite", "rename", "fsync_dir"],
    "replace_step": ["open", "write", "fsync", "close", "rename", "fsync_dir"],
    "save_with_retention": ["open", "write", "fsync", "pwrite", "rename", "unlink", "fsync_dir"],
    "delete_step": ["open", "unlink", "pwrite", "fsync_dir"],
    "delete_workflow": ["open", "rename", "fsync_dir"],
}
CASES = [(op, method) for op, methods in CALLS.items() for method in methods]


async def _check_affected(
    storage: FileCheckpointStorage, op: str, before: Dump, after: Dump
) -> None:
    """Untouched records are unchanged; affected ones are wholly old, wholly new or absent."""
    affected = AFFECTED[op]
    for key in set(before) | set(after):
        if key not in affected:
            assert after.get(key) == before.get(key), key
    for key in affected & set(after):
        data = (await decode_stored(storage, after[key], key[0], key[1])).state_snapshot.data
        assert after[key] == before.get(key) or data == NEW, key
    if op == "delete_workflow":
        assert {k for k in after if k[0] == "wf"} in (set(), {("wf", 0), ("wf", 1)})


async def _scenario(root: Path, op: str, method: str, nth: int, code: int, sticky: bool) -> int:
    """Run ``op`` with the planned fault; check the aftermath; return how many faults fired."""
    base = FileCheckpointStorage(root / "store")
    before = {} if op == "first_save" else await _baseline(base)
    storage = FileCheckpointStorage(root / "store")
    fault = PlannedFault(method, nth, code, sticky)
    storage._os = fault
    error: CheckpointError | None = None
    try:
        await _do(op, storage)
    except CheckpointError as exc:
        error = exc
    if error is not None:
        assert fault.fired, f"failed without a fault: {error!r}"
        assert _caused_by(error, code), f"{error!r} does not chain the OSError"
    if not fault.fired:
        await storage.close()
        await base.close()
        return 0
    storage._os = FileOps()  # the fault is gone
    await _check_affected(storage, op, before, await dump_store(storage))
    assert FILE.temp_files(root) == [], "temporary files left behind"
    await _do(op, storage)  # the same store object works again
    after = await dump_store(storage)
    if op.startswith("delete"):
        assert not AFFECTED[op] & set(after)
    else:
        got = [
            (await decode_stored(storage, after[k], k[0], k[1])).state_snapshot.data
            for k in AFFECTED[op] & set(after)
        ]
        assert NEW in got
    await storage.close()
    await base.close()
    async with FileCheckpointStorage(root / "store") as reopened:
        assert await dump_store(reopened) == after
    return fault.fired


@pytest.mark.parametrize(("op", "method"), CASES, ids=[f"{o}-{m}" for o, m in CASES])
async def test_every_injected_os_fault_is_typed_and_harmless(
    tmp_path: Path, op: str, method: str
) -> None:
    """Each call of this OS function in this write path, failed once (EIO) or from then on
    (ENOSPC), gives a CheckpointError chaining the OSError, keeps other records intact, leaves no
    temporary file, and the store works once the fault is gone.
    """
    fired = 0
    for code, sticky in PLANS:
        nth = 1
        while True:
            root = tmp_path / f"{errno.errorcode[code]}-{sticky}-{nth}"
            hits = await _scenario(root, op, method, nth, code, sticky)
            if not hits:
                break
            fired += hits
            TALLY["injected OS faults"] += hits
            nth += 1
    assert fired > 0


# --- real kernels: a full disk and a read-only mount ------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted at tmp_path/mnt (needs root)."""
    with tiny_tmpfs(tmp_path) as mnt:
        yield mnt


def _remount(mnt: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(mnt)], check=True)


@pytest.mark.root  # mounts a tmpfs
async def test_a_full_disk_fails_saves_cleanly_and_recovers(
    disk_backend: Backend, tiny_disk: Path
) -> None:
    """Filling a real 256 KiB tmpfs makes a save raise a CheckpointError with the cause chained;
    every earlier checkpoint still loads, nothing is left behind, and saving works once space is
    freed.
    """
    storage = disk_backend.open(tiny_disk)
    manager = CheckpointManager(storage)
    saved: dict[int, str] = {}
    error: CheckpointError | None = None
    for step in range(40):
        blob = f"{step:04d}" * 4096  # 16 KiB of text per checkpoint
        try:
            await manager.create_checkpoint("full", step, "a", "completed", {"blob": blob})
        except CheckpointError as exc:
            error = exc
            break
        saved[step] = blob
    assert error is not None, "the disk never filled up"
    TALLY["real full-disk faults"] += 1
    assert error.__cause__ is not None
    if disk_backend is FILE:
        assert _caused_by(error, errno.ENOSPC)
    assert saved
    for step, blob in saved.items():
        assert (await manager.get_checkpoint("full", step)).state_snapshot.data == {"blob": blob}
    assert disk_backend.temp_files(tiny_disk) == []
    _remount(tiny_disk, "size=8m")
    await manager.create_checkpoint("full", 99, "a", "completed", {"blob": "after"})
    assert (await manager.get_latest_checkpoint("full")).state_snapshot.data == {"blob": "after"}  # type: ignore[union-attr]
    await storage.close()
    async with disk_backend.open(tiny_disk) as again:
        assert {s.step for s in await again.scan("full")} == {*saved, 99}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: room for a new SQLite store's first write-ahead log (its schema's
    migrations) besides the database, which a 256 KiB one no longer holds at a checkpoint."""
    with tiny_tmpfs(tmp_path, size="1m") as mnt:
        yield mnt


@pytest.mark.root  # mounts a tmpfs
async def test_a_read_only_store_refuses_writes_and_keeps_reading(
    disk_backend: Backend, small_disk: Path
) -> None:
    """After a remount read-only, saves and deletes raise a CheckpointError with the cause chained,
    reads still return every checkpoint, and writes work again after a remount read-write.
    """
    storage = disk_backend.open(small_disk)
    manager = CheckpointManager(storage)
    for step in range(3):
        await manager.create_checkpoint("ro", step, "a", "completed", {"step": step})
    before = await dump_store(storage)
    await storage.close()
    _remount(small_disk, "ro")
    try:
        storage = disk_backend.open(small_disk)
        manager = CheckpointManager(storage)
        if disk_backend.reads_when_read_only:
            latest = await manager.get_latest_checkpoint("ro")
            assert latest is not None
            assert latest.state_snapshot.data == {"step": 2}
        for call in (
            manager.create_checkpoint("ro", 3, "a", "completed", {"step": 3}),
            manager.create_checkpoint("ro", 1, "a", "completed", {"step": 1}),
            manager.delete_checkpoints("ro", 0),
        ):
            with pytest.raises(CheckpointError) as info:
                await call
            TALLY["real read-only faults"] += 1
            assert info.value.__cause__ is not None
            if disk_backend is FILE:
                assert _caused_by(info.value, errno.EROFS)
        if disk_backend.reads_when_read_only:
            assert await dump_store(storage) == before
        await storage.close()
    finally:
        _remount(small_disk, "rw")
    async with disk_backend.open(small_disk) as storage:
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("ro", 3, "a", "completed", {"step": 3})
        assert [c.step for c in await manager.list_checkpoints("ro")] == [0, 1, 2, 3]
