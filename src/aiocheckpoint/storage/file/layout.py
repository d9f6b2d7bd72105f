"""The file store's own directory: its creation, its format marker, atomic small files.

``base_dir`` holds ``aiocheckpoint.json`` (the format marker), ``workflows/``, once the
store holds blobs, ``blobs/``, and once an integration's writer took a lock, ``locks/``.
Nothing is created until the first write; reads of a missing store find nothing.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

from ...errors import StorageSchemaError
from ..private import refuse_unless_private
from .io import DIR_FLAGS, FileOps, OddEntry, discard, fsync_path, open_regular, write_temp
from .names import FORMAT_PLAIN, LOCKS, MARKER, WORKFLOWS, encode_marker, parse_marker

__all__ = ["StoreDir"]

#: The store's own directories, checked for their owner and mode before first use.
_CHECKED: Final = ("", WORKFLOWS, "blobs", LOCKS)


class StoreDir:
    """``base_dir`` of one store: whether it exists, which format it is, making it.

    Before its first use, ``base_dir`` (and its ``workflows/``, ``blobs/`` and ``locks/``, if
    present) must belong to this process's user and be writable by no one else, unless
    ``allow_shared`` (see :class:`~aiocheckpoint.errors.StoragePermissionError`).
    """

    def __init__(self, base: str, ops: FileOps, *, allow_shared: bool = False) -> None:
        self.base = base
        self.root = os.path.join(base, WORKFLOWS)
        self.ops = ops
        self._trusted = allow_shared
        #: The format the marker names (0 until it was read; 1 for a store without one).
        self.format = 0
        self._marker_ok = False
        self.ready = False  # set by the store once its first write set everything up

    def check_marker(self) -> None:
        """Read the format marker once; :class:`StorageSchemaError` for an unknown one.

        Checks the directories' owner first (:meth:`check_owner`).
        """
        if self._marker_ok:
            return
        self.check_owner()
        path = os.path.join(self.base, MARKER)
        try:
            fd = open_regular(path, None)
        except OddEntry as exc:
            raise StorageSchemaError(
                f"{path} is not an aiocheckpoint format marker: {exc}"
            ) from None
        if fd is None:
            return
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        self.format = parse_marker(raw, path, self.base)
        self._marker_ok = True

    def create(self) -> None:
        """Create ``base_dir`` and ``workflows/`` and write the marker, as needed (durably)."""
        self.check_marker()
        self.make_dirs(self.base)
        self.check_owner()  # it may have appeared since check_marker found nothing
        if not self._marker_ok:
            self.mark(FORMAT_PLAIN)
            self._marker_ok = True
        with contextlib.suppress(FileExistsError):
            self.ops.mkdir(self.root)
            fsync_path(self.ops, self.base)

    def check_owner(self) -> None:
        """Refuse a directory another user controls (``StoragePermissionError``).

        Done once per storage object, as soon as ``base_dir`` exists: its owner is this
        process's effective user and it is not writable by group or others; the same for
        ``workflows/``, ``blobs/`` and ``locks/`` where they exist.
        """
        if self._trusted:
            return
        for sub in _CHECKED:
            path = os.path.join(self.base, sub) if sub else self.base
            try:
                info = os.stat(path)
            except FileNotFoundError:
                if not sub:
                    return  # nothing yet: checked again once it exists
                continue
            refuse_unless_private(path, info, "file store directory")
        self._trusted = True

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
