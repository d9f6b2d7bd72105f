"""Which barrier the file store's group commit uses, on real filesystems (issue #23).

``syncfs`` only where the filesystem's type (``fstatfs``) is on the store's list; fsyncs of
every file and directory everywhere else. The filesystems are real mounts made here (the
``root`` tier): tmpfs, a loop-mounted ext4 image, overlayfs (a layered
filesystem, like FUSE and network filesystems not on the list), and /proc.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager
from aiocheckpoint.format import record_root_refs
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.durability import (
    SYNCFS_DURABLE,
    filesystem_name,
    filesystem_type,
    syncfs_is_durable,
)
from aiocheckpoint.storage.file.io import FileOps
from aiocheckpoint.storage.file.names import step_name

pytestmark = pytest.mark.root  # every test mounts filesystems


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A tmpfs, a loop-mounted ext4 image and an overlayfs, each empty, under tmp_path."""
    points = {name: tmp_path / name for name in ("tmpfs", "ext4", "overlay")}
    for point in points.values():
        point.mkdir()
    layers = {name: tmp_path / name for name in ("lower", "upper", "work")}
    for layer in layers.values():
        layer.mkdir()
    image = tmp_path / "ext4.img"
    with image.open("wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mounted: list[Path] = []
    try:
        mount("-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(points["tmpfs"]))
        mounted.append(points["tmpfs"])
        mount("-o", "loop", str(image), str(points["ext4"]))
        mounted.append(points["ext4"])
        lower, upper, work = (layers[n] for n in ("lower", "upper", "work"))
        options = f"lowerdir={lower},upperdir={upper},workdir={work}"
        mount("-t", "overlay", "overlay", "-o", options, str(points["overlay"]))
        mounted.append(points["overlay"])
        yield points
    finally:
        for point in reversed(mounted):
            umount(point)


def statfs_type(path: Path) -> int:
    """``f_type`` as coreutils' ``stat -f`` reads it from statfs(2)."""
    out = subprocess.run(["stat", "-f", "-c", "%t", str(path)], check=True, capture_output=True)
    return int(out.stdout.decode().strip(), 16)


def type_of(path: Path) -> int | None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return filesystem_type(fd)
    finally:
        os.close(fd)


def durable_here(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return syncfs_is_durable(fd)
    finally:
        os.close(fd)


def test_the_filesystem_type_is_what_statfs_reports(
    mounts: dict[str, Path], tmp_path: Path
) -> None:
    """The store reads the same f_type as stat(1) on every kind of mount here."""
    paths = [*mounts.values(), tmp_path, Path("/proc")]
    for path in paths:
        assert type_of(path) == statfs_type(path), path
    assert {filesystem_name(type_of(p)) for p in mounts.values()} == {"tmpfs", "ext4", "overlayfs"}


def test_syncfs_is_trusted_on_listed_filesystems_only(mounts: dict[str, Path]) -> None:
    """tmpfs and ext4 are on the list; overlayfs and procfs are not (nor FUSE, 0x65735546)."""
    assert durable_here(mounts["tmpfs"])
    assert durable_here(mounts["ext4"])
    assert not durable_here(mounts["overlay"])
    assert not durable_here(Path("/proc"))
    assert 0x65735546 not in SYNCFS_DURABLE  # FUSE: LazyFS lost syncfs'd groups


class CallLog(FileOps):
    """Records the durability-relevant calls (from every thread) and makes them."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def _log(self, name: str) -> None:
        with self._lock:
            self.calls.append(name)

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._log("fsync")

    def fsync_dir(self, fd: int) -> None:
        super().fsync_dir(fd)
        self._log("fsync_dir")

    def syncfs(self, fd: int) -> None:
        super().syncfs(fd)
        self._log("syncfs")

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        self._log("rename")


async def group_of_eight(base: Path, **options: bool) -> list[str]:
    """Eight workflows saved at once (one group, directories made beforehand): its calls."""
    store = FileCheckpointStorage(base, **options)
    for i in range(8):
        await store.save(f"wf-{i}", 0, b"zero")
    log = CallLog()
    store._os = log
    await asyncio.gather(*(store.save(f"wf-{i}", 1, b"one %d" % i) for i in range(8)))
    for i in range(8):
        got = await store.load(f"wf-{i}")
        assert got is not None and (got.step, got.data) == (1, b"one %d" % i)
    await store.close()
    return log.calls


def assert_fsync_barriers(calls: list[str]) -> None:
    """Every temp file and hint fsynced, then the renames, then every directory fsynced."""
    assert "syncfs" not in calls
    first_rename = calls.index("rename")
    assert calls[:first_rename] == ["fsync"] * 16  # 8 temp files and 8 raised hints
    assert calls[first_rename:] == ["rename"] * 8 + ["fsync_dir"] * 8


async def mixed_group(base: Path, **options: bool) -> list[str]:
    """Four saves and four effect records at once (one group; directories made first)."""
    store = FileCheckpointStorage(base, **options)
    for i in range(8):
        await store.save(f"wf-{i}", 0, b"zero")
        await store.put_effect(f"wf-{i}", 0, "k", b"made effects/", in_doubt=True)
    log = CallLog()
    store._os = log
    await asyncio.gather(
        *(store.save(f"wf-{i}", 1, b"one %d" % i) for i in range(4)),
        *(store.put_effect(f"wf-{i}", 1, "k", b"fx %d" % i, in_doubt=False) for i in range(4, 8)),
    )
    for i in range(4, 8):
        [effect] = await store.load_effects(f"wf-{i}", 1)
        assert (effect.in_doubt, effect.data) == (False, b"fx %d" % i)
    await store.close()
    return log.calls


async def test_effect_records_share_the_groups_barriers(mounts: dict[str, Path]) -> None:
    """Effect records join the saves' group: on overlayfs every temp file (and raised hint)
    is fsynced before any rename, every directory (effects/ too) after the last; on ext4
    the whole group costs two syncfs."""
    calls = await mixed_group(mounts["overlay"] / "store")
    first_rename = calls.index("rename")
    assert calls[:first_rename] == ["fsync"] * 12  # 8 temp files, 4 raised hints
    assert calls[first_rename:] == ["rename"] * 8 + ["fsync_dir"] * 8
    calls = await mixed_group(mounts["ext4"] / "store")
    assert calls == ["syncfs"] + ["rename"] * 8 + ["syncfs"]


async def test_a_group_on_overlayfs_fsyncs_every_file_then_every_directory(
    mounts: dict[str, Path],
) -> None:
    """On a filesystem not on the list, a group's barriers are fsyncs, in the safe order."""
    assert_fsync_barriers(await group_of_eight(mounts["overlay"] / "store"))


async def test_a_group_on_a_listed_filesystem_uses_two_syncfs(mounts: dict[str, Path]) -> None:
    """On a listed filesystem (a loop-mounted ext4, a tmpfs) a group costs two syncfs."""
    for kind in ("ext4", "tmpfs"):
        calls = await group_of_eight(mounts[kind] / "store")
        assert calls == ["syncfs"] + ["rename"] * 8 + ["syncfs"], kind


async def test_use_syncfs_false_groups_with_fsync_barriers(tmp_path: Path) -> None:
    """use_syncfs=False forbids syncfs even on ext4; saves still group, with fsyncs."""
    assert_fsync_barriers(await group_of_eight(tmp_path / "store", use_syncfs=False))


async def test_a_workflow_directory_on_another_filesystem_makes_its_group_fsync(
    mounts: dict[str, Path],
) -> None:
    """syncfs covers one filesystem: a group touching a workflow directory that is a mount
    point inside the store (here a tmpfs over one workflow's directory) fsyncs instead."""
    base = mounts["ext4"] / "store"
    store = FileCheckpointStorage(base)
    await store.save("wf-3", 0, b"zero")
    inner = Path(store.workflow_dir("wf-3"))
    saved = base / "saved"
    shutil.copytree(inner, saved)
    mount("-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(inner))
    try:
        for entry in saved.iterdir():
            shutil.copy2(entry, inner / entry.name)
        assert_fsync_barriers(await group_of_eight(base))
    finally:
        umount(inner)
    await store.close()


def fd_path(fd: int) -> str:
    """The path a descriptor is open on (as the kernel names it)."""
    return os.readlink(f"/proc/self/fd/{fd}")


class PathLog(FileOps):
    """Records fsyncs, directory fsyncs, syncfs and renames (from every thread) with the
    path each one touches: a rename's destination, an fsync's file or directory."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.sources: dict[str, str] = {}  # a rename's destination -> its source
        self._lock = threading.Lock()

    def _log(self, name: str, path: str) -> None:
        with self._lock:
            self.calls.append((name, path))

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._log("fsync", fd_path(fd))

    def fsync_dir(self, fd: int) -> None:
        super().fsync_dir(fd)
        self._log("fsync_dir", fd_path(fd))

    def syncfs(self, fd: int) -> None:
        super().syncfs(fd)
        self._log("syncfs", fd_path(fd))

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        where = dst if dst_dir_fd is None else os.path.join(fd_path(dst_dir_fd), dst)
        with self._lock:
            self.sources[where] = (
                src if src_dir_fd is None else os.path.join(fd_path(src_dir_fd), src)
            )
        self._log("rename", where)


def tree_state(tag: str) -> dict[str, object]:
    """A state well over the inline limit whose every chunk is new for each ``tag``."""
    return {"docs": [{"id": i, "body": f"{tag} doc {i} " + "lorem ipsum " * 80} for i in range(60)]}


def pack_holding(store: Path, blob: bytes) -> str:
    """The path of the one pack under ``store`` that holds ``blob`` (its stored bytes)."""
    found = [p for p in (store / "blobs" / "packs").glob("*.pack") if blob in p.read_bytes()]
    assert len(found) == 1, found
    return os.path.realpath(found[0])


def assert_pack_durable_before_record(log: PathLog, pack: str, record: str) -> None:
    """The pack's data is fsynced before its rename into ``packs/``, and ``packs/`` is
    fsynced after that rename and before the record's rename (no syncfs anywhere)."""
    calls = log.calls
    pack_at = calls.index(("rename", pack))
    record_at = calls.index(("rename", record))
    assert pack_at < record_at, calls
    assert ("fsync", log.sources[pack]) in calls[:pack_at], calls
    assert ("fsync_dir", os.path.dirname(pack)) in calls[pack_at + 1 : record_at], calls
    assert all(name != "syncfs" for name, _path in calls), calls


def record_path(store: FileCheckpointStorage, workflow_id: str, step: int) -> str:
    """Where the file store keeps a step's record (as the kernel names the path)."""
    return os.path.realpath(os.path.join(store.workflow_dir(workflow_id), step_name(step)))


async def saved_trees(
    base: Path, count: int, **options: bool
) -> tuple[PathLog, list[tuple[str, str]]]:
    """``count`` workflows (directories made first) each save a new tree at once: the calls,
    and each save's (pack holding its root's first child, record file) paths."""
    store = FileCheckpointStorage(base, **options)
    manager = CheckpointManager(store)
    for i in range(count):
        await store.save(f"wf-{i}", 0, b"zero")
    log = PathLog()
    store._os = log
    states = [tree_state(f"t{i}") for i in range(count)]
    await asyncio.gather(
        *(manager.create_checkpoint(f"wf-{i}", 1, "a", "running", states[i]) for i in range(count))
    )
    pairs = []
    for i in range(count):
        assert (await manager.get_checkpoint(f"wf-{i}", 1)).state_snapshot.data == states[i]
        stored = await store.load(f"wf-{i}", 1)
        assert stored is not None
        first = record_root_refs(stored.data)[0]
        pack = pack_holding(base, (await store.fetch_blobs([first]))[first])
        pairs.append((pack, record_path(store, f"wf-{i}", 1)))
    await store.close()
    return log, pairs


@pytest.mark.parametrize("count", [1, 8], ids=["alone", "eight-at-once"])
async def test_a_new_pack_is_durable_in_packs_before_the_record_is_renamed(
    tmp_path: Path, count: int
) -> None:
    """On the fsync path (``use_syncfs=False``), a tree save fsyncs its new pack, renames
    it into ``packs/`` and fsyncs ``packs/`` before its record is renamed: else a power cut
    could keep the record and lose the pack's directory entry, and with it the blobs."""
    log, pairs = await saved_trees(tmp_path / "store", count, use_syncfs=False)
    assert len({pack for pack, _record in pairs}) == count
    for pack, record in pairs:
        assert_pack_durable_before_record(log, pack, record)


async def test_on_overlayfs_a_pack_is_durable_before_its_record(mounts: dict[str, Path]) -> None:
    """A filesystem not on the syncfs list takes the same fsync path by itself."""
    log, [(pack, record)] = await saved_trees(mounts["overlay"] / "store", 1)
    assert_pack_durable_before_record(log, pack, record)
