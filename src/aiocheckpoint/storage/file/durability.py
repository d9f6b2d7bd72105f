"""Which call makes a group of writes durable here: ``syncfs(2)`` or an fsync of each file.

``syncfs`` returning 0 only says that the filesystem was asked to write back what it holds.
Local filesystems whose ``sync_fs`` commits the journal (or log, or transaction) and flushes
the device cache honour it; FUSE, network and layered filesystems need not pass it on (under
LazyFS, a FUSE filesystem, groups made durable by ``syncfs`` lost 12,707 acknowledged
checkpoints in 35 of 37 power cuts). So the file store uses ``syncfs`` only on a filesystem
whose type is on :data:`SYNCFS_DURABLE`, and fsyncs each file and directory everywhere else:
fsync is the one call every POSIX filesystem must make durable.

The type comes from ``fstatfs(2)``'s ``f_type`` of the very directory the store syncs, not
from ``/proc/self/mountinfo``: it names the filesystem that holds that descriptor whatever
the path, bind mounts, symlinks, chroots or mount namespaces in between, costs one system
call and needs no ``/proc``; matching a path or a device number against the mount table
can pick the wrong entry (btrfs subvolumes report device numbers the table does not list).
Its one ambiguity: ext2, ext3 and ext4 share one magic number (docs/file-storage.md,
"Filesystems").
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

__all__ = [
    "SYNCFS_DURABLE",
    "filesystem_name",
    "filesystem_type",
    "run_all",
    "syncfs_is_durable",
]

#: ``f_type`` magic numbers (``linux/magic.h``) of the filesystems on which ``syncfs`` is
#: durable: it commits the journal, log or transaction and flushes the device's cache, a
#: superset of an fsync of every file and directory. tmpfs keeps everything in memory, so
#: nothing on it survives a power cut whatever the store calls: ``syncfs`` is as good as
#: fsync there, and cheaper.
SYNCFS_DURABLE: Final[Mapping[int, str]] = {
    0xEF53: "ext4",  # also ext2 and ext3: see the module docstring
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
}
#: Names of some types the store meets, for messages (any other shows as hex).
_OTHER: Final[Mapping[int, str]] = {
    0x65735546: "fuse",
    0x794C7630: "overlayfs",
    0x6969: "nfs",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x2FC12FC1: "zfs",
    0xF2F52010: "f2fs",
    0x858458F6: "ramfs",
}
#: At most this many calls of one group run at once. On ext4, 100 fdatasyncs took 33 ms one
#: after another, 18-21 ms on 4 threads, 13-18 ms on 8 or more; whole groups of 100 saves
#: with fsync barriers ran at 660-700 saves/s on 8 threads, 400-490 on 16 or 32.
_FSYNC_THREADS: Final = 8
_STATFS_SIZE: Final = 512  # struct statfs is 120 bytes on 64-bit Linux: room to spare


def _find_fstatfs() -> Callable[[int, ctypes.Array[ctypes.c_char]], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).fstatfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p]
    function.restype = ctypes.c_int
    return function


_FSTATFS: Final = _find_fstatfs()
# f_type is the first field of struct statfs: a long (__fsword_t), but an unsigned int on
# s390x; only its low 32 bits carry the magic.
_F_TYPE: Final = ctypes.c_uint if platform.machine() == "s390x" else ctypes.c_long


def filesystem_type(fd: int) -> int | None:
    """The ``f_type`` magic number of the filesystem holding ``fd``; None if unknown.

    None off Linux, or when ``fstatfs`` is missing or fails.
    """
    if _FSTATFS is None:
        return None
    buffer = ctypes.create_string_buffer(_STATFS_SIZE)
    if _FSTATFS(fd, buffer) != 0:
        return None
    return int(_F_TYPE.from_buffer(buffer).value) & 0xFFFFFFFF


def filesystem_name(magic: int | None) -> str:
    """A readable name for an ``f_type`` (hex when it is not one the store knows)."""
    if magic is None:
        return "unknown"
    return SYNCFS_DURABLE.get(magic) or _OTHER.get(magic) or f"0x{magic:x}"


def syncfs_is_durable(fd: int) -> bool:
    """Whether ``syncfs`` on ``fd`` is known to make the whole filesystem durable."""
    return filesystem_type(fd) in SYNCFS_DURABLE


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def run_all(calls: Sequence[Callable[[], None]]) -> list[OSError | None]:
    """Run ``calls`` (file writes, fsyncs) at once, on up to 8 threads; each one's OSError.

    Filesystems merge concurrent fsyncs into fewer journal commits (and a FUSE or network
    filesystem overlaps their round trips), and a file created while the journal commits
    waits for it: so a group's writes and fsyncs are issued together.
    """
    global _pool
    if len(calls) < 2:
        return [_outcome(call) for call in calls]
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_FSYNC_THREADS, thread_name_prefix="aiocheckpoint-fsync")
        pool = _pool
    return list(pool.map(_outcome, calls))


def _outcome(call: Callable[[], None]) -> OSError | None:
    try:
        call()
    except OSError as exc:
        return exc
    return None


def fsync_in(ops_fsync: Callable[[int], None], dfd: int, name: str) -> None:
    """Open ``name`` in ``dfd`` read-only and fsync it with ``ops_fsync``.

    The file was written through another descriptor: fsync flushes the file, whichever
    descriptor it is called on, and a write-back error nobody has seen yet is reported to
    a descriptor opened after it.
    """
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        ops_fsync(fd)
    finally:
        os.close(fd)
