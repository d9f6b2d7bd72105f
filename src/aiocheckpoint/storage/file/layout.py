"""The file store's own directory: its creation, its format marker, atomic small files.

``base_dir`` holds ``aiocheckpoint.json`` (the format marker), ``workflows/`` and, once the
store holds blobs, ``blobs/``. Nothing is created until the first write; reads of a missing
store find nothing.
"""

from __future__ import annotations

import contextlib
import os

from .format import FORMAT_PLAIN, MARKER, WORKFLOWS, encode_marker, parse_marker
from .io import DIR_FLAGS, FileOps, discard, fsync_path, write_temp

__all__ = ["StoreDir"]


class StoreDir:
    """``base_dir`` of one store: whether it exists, which format it is, making it."""

    def __init__(self, base: str, ops: FileOps) -> None:
        self.base = base
        self.root = os.path.join(base, WORKFLOWS)
        self.ops = ops
        #: The format the marker names (0 until it was read; 1 for a store without one).
        self.format = 0
        self._marker_ok = False
        self.ready = False  # set by the store once its first write set everything up

    def check_marker(self) -> None:
        """Read the format marker once; :class:`StorageSchemaError` for an unknown one."""
        if self._marker_ok:
            return
        path = os.path.join(self.base, MARKER)
        try:
            with open(path, "rb") as f:
                raw = f.read(4096)
        except FileNotFoundError:
            return
        self.format = parse_marker(raw, path, self.base)
        self._marker_ok = True

    def create(self) -> None:
        """Create ``base_dir`` and ``workflows/`` and write the marker, as needed (durably)."""
        self.check_marker()
        self.make_dirs(self.base)
        if not self._marker_ok:
            self.mark(FORMAT_PLAIN)
            self._marker_ok = True
        with contextlib.suppress(FileExistsError):
            self.ops.mkdir(self.root)
            fsync_path(self.ops, self.base)

    def mark(self, fmt: int) -> None:
        """Write the marker naming format ``fmt`` (atomically and durably)."""
        self.write_atomic(self.base, MARKER, encode_marker(fmt))
        self.format = fmt

    def make_dirs(self, path: str) -> None:
        """Create ``path`` (0700) and missing ancestors, fsyncing each new entry's parent."""
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        for new in reversed(missing):
            try:
                if new is missing[0]:
                    self.ops.mkdir(new)
                else:
                    os.mkdir(new)  # an ancestor: the umask decides, as for any directory
            except FileExistsError:
                continue
            fsync_path(self.ops, os.path.dirname(new))

    def write_atomic(self, directory: str, name: str, body: bytes) -> None:
        """Replace ``directory/name`` with ``body``: temp file, fsync, rename, fsync."""
        dfd = os.open(directory, DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            tmp = write_temp(self.ops, dfd, body)
            try:
                self.ops.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                discard(tmp, dfd)
                raise
            self.ops.fsync_dir(dfd)
        finally:
            os.close(dfd)
