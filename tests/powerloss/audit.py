"""The writer's checks of LazyFS itself: what it answers must match what its disk holds.

LazyFS answers an ``fsync`` once it has written the file's cached data to its backing
directory (the "disk" the verifier reads after a cut). :class:`FsyncAudit` wraps the file
store's OS calls (its ``_os`` seam): after each ``fsync`` of a file the store wrote through
the descriptor (its position is the number of bytes written), it looks at that file on the
disk directly, not through FUSE, and reports a file shorter than what was fsynced: LazyFS
acknowledged an fsync whose data it did not write, a fault of the filesystem under test
that no store could survive. It costs no FUSE call: the position and ``/proc/self/fd`` are
the kernel's, the disk is a tmpfs.

:class:`GCReadAudit` watches the garbage collector's log: a sweep that finds a record it
cannot read deletes no blob. When the record's copy on the disk reads whole, the short read
was LazyFS's (a record never changes once renamed into place), and it is reported.

Each report names the record's inode on the disk (a rename keeps it), so the parent can
tell a record lost that way from one the store lost.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from aiocheckpoint.storage.file import gc
from aiocheckpoint.storage.file.io import DIR_FLAGS, FileOps

#: The line a writer sends for each fsync LazyFS did not honour (see child.py).
KIND = "L"
#: The line a writer sends for each record its garbage collector read short through LazyFS.
MISREAD = "G"
#: What the garbage collector logs for a record it cannot read (gc.py).
_SKIPPED = "GC: unreadable record"


class FsyncAudit(FileOps):
    """:class:`FileOps` that checks the disk under ``mount`` after each fsync."""

    def __init__(self, mount: str, disk: str, report: Callable[[str], object]) -> None:
        self.mount = mount.rstrip("/") + "/"
        self.disk = disk.rstrip("/") + "/"
        self.report = report

    def fsync(self, fd: int) -> None:
        """Fsync, then check that the disk holds every byte written through ``fd``."""
        super().fsync(fd)
        self.check(fd)

    def on_disk(self, fd: int) -> tuple[str, int] | None:
        """The disk's path of the file open as ``fd`` and how much was written through it;
        None if nothing was (a hint rewritten with pwrite, a descriptor opened to fsync)."""
        written = os.lseek(fd, 0, os.SEEK_CUR)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if written == 0 or not path.startswith(self.mount):
            return None
        return self.disk + path[len(self.mount) :], written

    def check(self, fd: int) -> None:
        """Report the file open as ``fd`` if the disk holds less than was written to it."""
        found = self.on_disk(fd)
        if found is None:
            return
        disk_path, written = found
        try:
            info = os.stat(disk_path, follow_symlinks=False)
        except FileNotFoundError:
            return  # removed or renamed since (by another thread): nothing to compare
        if info.st_size < written:
            mount_path = self.mount + disk_path[len(self.disk) :]
            self.report(f"{KIND}\t{info.st_ino}\t{mount_path}\t{written}\t{info.st_size}")


class GCReadAudit(logging.Handler):
    """Reports the records a sweep skipped as unreadable whose disk copy reads whole.

    ``workflows`` is the store's ``workflows/`` as the writer sees it (under ``mount``).
    """

    def __init__(
        self, mount: str, disk: str, workflows: str, report: Callable[[str], object]
    ) -> None:
        super().__init__(logging.WARNING)
        self.disk_workflows = disk.rstrip("/") + "/" + os.path.relpath(workflows, mount)
        self.report = report
        self.checking = False  # the check reads as the sweep does, and may log the same

    def emit(self, record: logging.LogRecord) -> None:
        """Check the disk copy of a record the sweep skipped."""
        if self.checking or not str(record.msg).startswith(_SKIPPED) or not record.args:
            return
        where = str(record.args[0])  # "<workflow directory>/<step file>"
        directory, _, name = where.rpartition("/")
        self.checking = True
        try:
            dfd = os.open(os.path.join(self.disk_workflows, directory), DIR_FLAGS)
        except OSError:
            return
        finally:
            self.checking = False
        try:
            self.checking = True
            try:
                whole = any(True for _ in gc._root_of(dfd, name, 1 << 30, where))
            except gc._Unreadable:
                whole = False
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return
        finally:
            self.checking = False
            os.close(dfd)
        sys.stderr.write(self.format(record) + "\n")  # the writer's log keeps it too
        if whole:
            reason = str(record.args[1]) if len(record.args) > 1 else "unreadable"
            reason = " ".join(reason.split())
            self.report(f"{MISREAD}\t{info.st_ino}\t{where}\t{info.st_size}\t{reason}")
