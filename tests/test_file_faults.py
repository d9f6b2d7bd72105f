"""I/O faults on the file store: injected at the FileOps seam, and a real full/read-only disk."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from aiocheckpoint import CheckpointManager, StorageBackendError
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.io import FileOps
from tests._tmpfs import tiny_tmpfs


class FaultyOps(FileOps):
    """Raises ``OSError(errno)`` from the named operation while a fault is set."""

    def __init__(self) -> None:
        self.faults: dict[str, int] = {}
        self.max_write = 0  # > 0: short writes of at most this many bytes

    def _check(self, op: str) -> None:
        if op in self.faults:
            code = self.faults[op]
            raise OSError(code, os.strerror(code))

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        if path.startswith(".tmp-"):
            self._check("open")
        return super().open(path, flags, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: memoryview) -> int:
        self._check("write")
        return super().write(fd, data[: self.max_write] if self.max_write else data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._check("pwrite")
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._check("fsync")
        super().fsync(fd)

    def fsync_dir(self, fd: int) -> None:
        self._check("fsync_dir")
        super().fsync_dir(fd)

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        self._check("rename")
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, path: str, *, dir_fd: int | None = None) -> None:
        self._check("unlink")
        super().unlink(path, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        super().close(fd)  # like the kernel: the descriptor is gone even when close fails
        self._check("close")


class RecordingOps(FileOps):
    """Records the durability-relevant calls, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.names: dict[int, str] = {}

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        fd = super().open(path, flags, mode, dir_fd=dir_fd)
        self.names[fd] = "temp" if path.startswith(".tmp-") else path
        return fd

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self.calls.append(f"write {self.names[fd]}")
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self.calls.append(f"fsync {self.names[fd]}")
        super().fsync(fd)

    def fsync_dir(self, fd: int) -> None:
        self.calls.append("fsync dir")
        super().fsync_dir(fd)

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        self.calls.append("rename")
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, path: str, *, dir_fd: int | None = None) -> None:
        self.calls.append("unlink")
        super().unlink(path, dir_fd=dir_fd)


async def test_durability_order_of_save_and_delete(tmp_path: Path) -> None:
    """Power-cut safety by order: record and raised hint are fsynced before the rename,
    the directory after it, and a delete's unlink is fsynced before the hint is lowered."""
    store = FileCheckpointStorage(tmp_path / "s")
    await store.save("wf", 0, b"zero")
    ops = RecordingOps()
    store._os = ops
    await store.save("wf", 1, b"one")
    assert ops.calls == ["fsync temp", "write latest", "fsync latest", "rename", "fsync dir"]
    ops.calls.clear()
    await store.save("wf", 0, b"lower step: hint unchanged")
    assert ops.calls == ["fsync temp", "rename", "fsync dir"]
    ops.calls.clear()
    await store.delete("wf", 1)
    assert ops.calls == ["unlink", "fsync dir", "write latest"]
    latest = await store.load("wf")
    assert latest is not None and latest.step == 0
    await store.close()


def litter(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.name.startswith((".tmp-", ".new-", ".del-"))]


@pytest.fixture
async def faulty(tmp_path: Path) -> AsyncIterator[tuple[FileCheckpointStorage, FaultyOps]]:
    store = FileCheckpointStorage(tmp_path / "s")
    ops = FaultyOps()
    store._os = ops
    yield store, ops
    await store.close()


@pytest.mark.parametrize(
    ("op", "code"),
    [
        ("open", errno.ENOSPC),
        ("write", errno.ENOSPC),
        ("write", errno.EIO),
        ("fsync", errno.EIO),
        ("close", errno.EIO),
        ("pwrite", errno.EIO),
        ("rename", errno.EIO),
        ("rename", errno.EXDEV),
    ],
)
async def test_failed_save_is_typed_and_harmless(
    faulty: tuple[FileCheckpointStorage, FaultyOps], op: str, code: int
) -> None:
    """A fault before the rename raises StorageBackendError, keeps old data, leaves no temp."""
    store, ops = faulty
    manager = CheckpointManager(store)
    await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 0})
    ops.faults[op] = code
    with pytest.raises(StorageBackendError) as info:
        await manager.create_checkpoint("wf", 1, "a", "completed", {"n": 1})
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == code
    assert "step 1" in str(info.value) and "'wf'" in str(info.value)
    ops.faults.clear()
    latest = await manager.get_latest_checkpoint("wf")
    assert latest is not None and latest.step == 0 and latest.state_snapshot.data == {"n": 0}
    assert not await store.exists("wf", 1)
    assert litter(Path(store.base_dir)) == []
    await manager.create_checkpoint("wf", 1, "a", "completed", {"n": 1})
    latest = await manager.get_latest_checkpoint("wf")
    assert latest is not None and latest.step == 1


async def test_failed_directory_fsync_is_reported(
    faulty: tuple[FileCheckpointStorage, FaultyOps],
) -> None:
    """EIO on the directory fsync fails the save (durability unknown) without damage."""
    store, ops = faulty
    await store.save("wf", 0, b"zero")
    ops.faults["fsync_dir"] = errno.EIO
    with pytest.raises(StorageBackendError):
        await store.save("wf", 1, b"one")
    ops.faults.clear()
    zero = await store.load("wf", 0)
    assert zero is not None and zero.data == b"zero"
    assert litter(Path(store.base_dir)) == []
    await store.save("wf", 2, b"two")
    latest = await store.load("wf")
    assert latest is not None and latest.data == b"two"


async def test_first_save_fault_leaves_no_workflow(
    faulty: tuple[FileCheckpointStorage, FaultyOps],
) -> None:
    """A workflow whose first save failed is not listed and has no latest."""
    store, ops = faulty
    ops.faults["fsync"] = errno.EIO
    with pytest.raises(StorageBackendError):
        await store.save("wf", 0, b"x")
    ops.faults.clear()
    assert await store.list_workflows() == []
    assert await store.load("wf") is None
    assert litter(Path(store.base_dir)) == []


async def test_short_writes_are_completed(faulty: tuple[FileCheckpointStorage, FaultyOps]) -> None:
    """os.write returning fewer bytes than asked still stores the whole record."""
    store, ops = faulty
    ops.max_write = 7
    data = os.urandom(1000)
    await store.save("wf", 0, data)
    got = await store.load("wf")
    assert got is not None and got.data == data


async def test_failed_delete_is_typed(faulty: tuple[FileCheckpointStorage, FaultyOps]) -> None:
    """EIO on unlink makes delete raise StorageBackendError and keeps the step."""
    store, ops = faulty
    await store.save("wf", 0, b"x")
    ops.faults["unlink"] = errno.EIO
    with pytest.raises(StorageBackendError):
        await store.delete("wf", 0)
    ops.faults.clear()
    assert await store.exists("wf", 0)


async def test_failed_retention_keeps_the_new_record(
    faulty: tuple[FileCheckpointStorage, FaultyOps], caplog: pytest.LogCaptureFixture
) -> None:
    """If pruning fails the save still succeeds, warns, and the next save prunes."""
    store, ops = faulty
    for step in range(3):
        await store.save("wf", step, b"%d" % step, keep_last=2)
    ops.faults["unlink"] = errno.EIO
    await store.save("wf", 3, b"3", keep_last=2)
    assert "retention" in caplog.text
    ops.faults.clear()
    await store.save("wf", 4, b"4", keep_last=2)
    assert [r.step for r in await store.scan("wf")] == [3, 4]


# --- a real small disk: tmpfs ----------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted at tmp_path/mnt (needs root)."""
    with tiny_tmpfs(tmp_path) as mnt:
        yield mnt


@pytest.mark.root  # mounts a tmpfs
async def test_real_disk_full(tiny_disk: Path) -> None:
    """On a full 256 KiB tmpfs a save raises StorageBackendError(ENOSPC) and harms nothing."""
    store = FileCheckpointStorage(tiny_disk / "s")
    record = os.urandom(40 * 1024)
    saved: list[int] = []
    error: StorageBackendError | None = None
    for step in range(100):
        try:
            await store.save("wf", step, record)
        except StorageBackendError as exc:
            error = exc
            break
        saved.append(step)
    assert error is not None
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
    assert saved and [r.step for r in await store.scan("wf")] == saved
    latest = await store.load("wf")
    assert latest is not None and latest.step == saved[-1] and latest.data == record
    assert litter(tiny_disk) == []
    for step in saved[:2]:
        await store.delete("wf", step)
    await store.save("wf", 1000, record)
    latest = await store.load("wf")
    assert latest is not None and latest.step == 1000
    await store.close()


@pytest.mark.root  # mounts a tmpfs
async def test_read_only_store_still_reads(tiny_disk: Path) -> None:
    """On a read-only mount saves raise StorageBackendError(EROFS) and loads still work."""
    store = FileCheckpointStorage(tiny_disk / "s")
    for step in range(3):
        await store.save("wf", step, b"%d" % step)
    (Path(store.workflow_dir("wf")) / "latest").write_bytes(b"torn")  # force a rebuild
    await store.close()
    await anyio.run_process(["mount", "-o", "remount,ro", str(tiny_disk)])
    reader = FileCheckpointStorage(tiny_disk / "s")
    latest = await reader.load("wf")
    assert latest is not None and latest.step == 2
    with pytest.raises(StorageBackendError) as info:
        await reader.save("wf", 3, b"3")
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.EROFS
    assert await reader.list_workflows() == ["wf"]
    await reader.close()
