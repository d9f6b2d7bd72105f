"""The writer's check of LazyFS itself: after every fsync, its disk holds what was written.

LazyFS answers an ``fsync`` once it has written the file's cached data to its backing
directory (the "disk" the verifier reads after a cut). :class:`FsyncAudit` wraps the file
store's OS calls (its ``_os`` seam): after each ``fsync`` of a file the store wrote through
the descriptor (its position is the number of bytes written), it looks at that file on the
disk directly, not through FUSE, and reports a file shorter than what was fsynced: LazyFS
acknowledged an fsync whose data it did not write, a fault of the filesystem under test
that no store could survive. The report names the file's inode on the disk (a rename keeps
it), so the parent can tell a record lost that way from one the store lost.

It costs no FUSE call: the position and ``/proc/self/fd`` are the kernel's, the disk is a
tmpfs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from aiocheckpoint.storage.file.io import FileOps

#: The line a writer sends for each fsync LazyFS did not honour (see child.py).
KIND = "L"


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
