"""The order the power-loss trials rely on, in their own configuration (no LazyFS needed).

The ``file-50-nosyncfs`` trials run 50 concurrent writers on a store with
``use_syncfs=False``: saves go through group commits whose barriers are fsyncs. Every file
renamed into place (a record, an effect record, a blob pack) must have been fsynced whole
before its rename, by inode, and its directory fsynced after the rename and before the save
returns; a record found 0 bytes after a cut can then only be the filesystem's doing.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.io import FileOps

from .workload import States, workflows


class OrderOps(FileOps):
    """Records fsyncs (inode, size), renames (inode, target directory) and directory fsyncs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.sizes: dict[int, int] = {}  # event index of a rename -> the size it renamed

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        info = os.fstat(fd)
        self.events.append(("fsync", info.st_ino, info.st_size))

    def fsync_dir(self, fd: int) -> None:
        super().fsync_dir(fd)
        self.events.append(("fsync_dir", os.fstat(fd).st_ino, 0))

    def rename(self, src: str, dst: str, *, src_dir_fd: int | None, dst_dir_fd: int | None) -> None:
        moved = os.stat(src, dir_fd=src_dir_fd, follow_symlinks=False)
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if dst_dir_fd is None:
            directory = os.stat(os.path.dirname(dst)).st_ino
        else:
            directory = os.fstat(dst_dir_fd).st_ino
        if stat.S_ISREG(moved.st_mode) and moved.st_size:  # a file with data
            self.sizes[len(self.events)] = moved.st_size
            self.events.append(("rename", moved.st_ino, directory))


async def test_a_group_commit_without_syncfs_fsyncs_each_file_before_its_rename(
    tmp_path: Path,
) -> None:
    store = FileCheckpointStorage(
        tmp_path / "s", use_syncfs=False, gc_interval=None, blob_grace_seconds=2.0
    )
    ops = OrderOps()
    store._os = ops
    flows = workflows(50)  # a fifth of them large (tree saves: packs, then records)
    managers = {keep: CheckpointManager(store, max_checkpoints=keep) for keep in (3, 4, None)}
    states = {wf.name: States(1, 0, wf) for wf in flows}

    async def task(step: int, name: str, keep: int | None) -> None:
        state = states[name].next(step)
        await managers[keep].create_checkpoint(name, step, "n", "completed", state)

    for step in range(3):
        await asyncio.gather(*(task(step, wf.name, wf.keep) for wf in flows))
    await store.close()

    renames = [(i, ino, d) for i, (kind, ino, d) in enumerate(ops.events) if kind == "rename"]
    assert len(renames) >= 150  # every record, and the large states' packs
    for at, ino, directory in renames:
        synced = [size for kind, i, size in ops.events[:at] if kind == "fsync" and i == ino]
        assert synced and synced[-1] == ops.sizes[at], (at, ino)  # fsynced whole, then renamed
        after = ops.events[at:]
        assert ("fsync_dir", directory, 0) in after, (at, ino)
