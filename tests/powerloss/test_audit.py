"""The writer's audit of LazyFS (audit.py): an fsync whose data is not on the disk is reported.

No LazyFS needed: a "mount" directory and a "disk" directory stand for its two sides.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .audit import KIND, MISREAD, FsyncAudit, GCReadAudit
from .targets import Aiocheckpoint
from .workload import States, Workflow


def _write(path: Path, data: bytes) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    return fd


def test_an_fsync_the_disk_does_not_hold_is_reported_with_its_inode(tmp_path: Path) -> None:
    mount, disk = tmp_path / "mnt", tmp_path / "disk"
    (mount / "wf").mkdir(parents=True)
    (disk / "wf").mkdir(parents=True)
    (disk / "wf" / "short").write_bytes(b"abc")  # what "LazyFS" wrote of it
    (disk / "wf" / "whole").write_bytes(b"0123456789")
    reports: list[str] = []
    audit = FsyncAudit(str(mount), str(disk), reports.append)
    for name in ("short", "whole"):
        fd = _write(mount / "wf" / name, b"0123456789")
        try:
            audit.fsync(fd)
        finally:
            os.close(fd)
    ino = (disk / "wf" / "short").stat().st_ino
    assert reports == [f"{KIND}\t{ino}\t{mount}/wf/short\t10\t3"]


def test_descriptors_that_wrote_nothing_through_their_position_are_not_compared(
    tmp_path: Path,
) -> None:
    """A hint rewritten with pwrite, or a file opened only to fsync it: nothing to compare."""
    mount, disk = tmp_path / "mnt", tmp_path / "disk"
    mount.mkdir()
    disk.mkdir()
    (disk / "latest").write_bytes(b"")
    reports: list[str] = []
    audit = FsyncAudit(str(mount), str(disk), reports.append)
    fd = os.open(mount / "latest", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"hint", 0)
        audit.fsync(fd)
    finally:
        os.close(fd)
    assert reports == []


#: What the garbage collector logs for a record it cannot read (gc.py).
GC_LINE = "GC: unreadable record %s: %s (no blob is deleted)"


async def test_a_record_the_sweep_skipped_but_the_disk_holds_whole_is_reported(
    tmp_path: Path,
) -> None:
    """The garbage collector logs a record it could not read; if the disk's copy reads whole,
    the short read was the filesystem's: reported with the record's inode. A copy that is
    short on the disk too is the store's business: not reported."""
    disk = tmp_path / "disk"
    target = Aiocheckpoint(disk, {"backend": "file", "storage": {}})
    await target.open()
    big = Workflow("wf", 0, True, None)
    await target.save("wf", 7, States(1, 0, big).next(7), None)  # a tree record (format 2)
    await target.close()
    record = next((disk / "store" / "workflows" / "wf").glob("*.ckpt"))
    where, size, ino = f"wf/{record.name}", record.stat().st_size, record.stat().st_ino
    mount = tmp_path / "mnt"
    reports: list[str] = []
    workflows = str(mount / "store" / "workflows")
    handler = GCReadAudit(str(mount), str(disk), workflows, reports.append)
    logger = logging.getLogger("aiocheckpoint.storage.file.gc")
    logger.addHandler(handler)
    try:
        logger.warning(GC_LINE, where, "body is 0 bytes")
        record.write_bytes(record.read_bytes()[:30])  # short on the disk as well
        logger.warning(GC_LINE, where, "body is 0 bytes")
    finally:
        logger.removeHandler(handler)
    assert reports == [f"{MISREAD}\t{ino}\t{where}\t{size}\tbody is 0 bytes"]
