"""Content-addressed blobs of the file store: write, touch, fetch, mark-and-sweep.

Layout: ``base_dir/blobs/<first 2 hex digits>/<hash hex>``, one file per blob holding the
stored blob bytes (see :mod:`aiocheckpoint.incremental`), ``blobs/tmp/`` (blobs being
written) and ``blobs/gc.lock`` (flock target of the sweeper; its mtime is the time of the
last collection). Every function here runs in a
worker thread: the store calls them inside its own one-hop-per-operation methods.

Safety argument (docs/file-storage.md, "Blobs and garbage collection"):

* A writer makes every blob of a checkpoint durable (file fsync, rename, directory fsync)
  before it writes the record, and makes sure each blob's mtime is at most ``grace / 2``
  old at that moment (touching old ones). A sweeper deletes only unmarked blobs whose
  mtime is older than ``t0 - grace``, where ``t0`` is taken before it lists the blobs and
  reads the records; so a record it could not see when marking was written after ``t0``
  and references only blobs younger than the cut-off, as long as a save takes less than
  ``grace / 2``.
* The sweeper renames a victim to ``.gc-<hex>``, looks at its mtime again (a writer may
  have touched it meanwhile) and either renames it back or unlinks it. Readers also look for
  ``.gc-<hex>``, and the next sweep renames back any it finds left by a crashed sweeper.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from collections.abc import Collection, Iterable, Iterator
from typing import Final

from ..incremental import SplitResult, _open_v2, node_children, record_format_version
from ..serde import HEADER_SIZE
from ._filefmt import FileOps, is_missing, parse_step_name, pid_is_dead, temp_name

__all__ = ["BlobStore"]

logger = logging.getLogger("aiocheckpoint")

GC_LOCK: Final = "gc.lock"
TMP: Final = "tmp"
_FIRST_READ: Final = 256 * 1024
_FRESH_MAX: Final = 200_000
_TRASH: Final = ".gc-"
_OPEN: Final = os.O_CLOEXEC | os.O_NOFOLLOW
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | _OPEN
_NEW: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN


class BlobStore:
    """The ``blobs/`` directory of one file store (one object per storage instance)."""

    def __init__(self, base: str, ops: FileOps, grace: float, max_bytes: int, stale: float):
        self.dir = os.path.join(base, "blobs")
        self._os = ops
        self.grace = grace
        self._max = max_bytes
        self._stale = stale
        # hash -> a time its file's mtime is known to be at least (set when this process
        # wrote, touched or saw it, after the shard directory was fsynced).
        self._fresh: dict[bytes, float] = {}

    # --- writing ------------------------------------------------------------------------

    def put(self, split: SplitResult) -> None:
        """Make every blob ``split`` references durable and recent enough (see module doc)."""
        now = time.time()
        half = self.grace / 2
        if len(self._fresh) > _FRESH_MAX:  # entries older than half the grace are useless
            self._fresh = {h: t for h, t in self._fresh.items() if now - t < half}
        shards: dict[str, int] = {}
        dirty: set[str] = set()
        shards[TMP] = tfd = self._open_shard(TMP)
        try:
            for h in split.children:  # children before parents: a parent never lands alone
                seen = self._fresh.get(h)
                if seen is not None and now - seen < half:
                    continue
                hexname = h.hex()
                shard = hexname[:2]
                sfd = shards.get(shard)
                if sfd is None:
                    sfd = shards[shard] = self._open_shard(shard)
                self._fresh[h] = self._place(sfd, tfd, hexname, split.blobs[h], now, half)
                dirty.add(shard)
            # One fsync per shard covers the renames above and also blobs we found already
            # in place, whose writer may have died before its own directory fsync.
            for shard in dirty:
                self._os.fsync_dir(shards[shard])
        finally:
            for fd in shards.values():
                os.close(fd)

    def _place(
        self, sfd: int, tfd: int, hexname: str, blob: bytes, now: float, half: float
    ) -> float:
        """Ensure ``hexname`` exists with an mtime younger than ``half``; return that mtime."""
        try:
            mtime = os.stat(hexname, dir_fd=sfd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            pass
        else:
            if now - mtime < half:
                return mtime
            try:
                os.utime(hexname, dir_fd=sfd, follow_symlinks=False)
                return now
            except FileNotFoundError:
                pass  # swept between the stat and the touch: write it again
        tmp = temp_name()
        fd = self._os.open(tmp, _NEW, 0o600, dir_fd=tfd)
        try:
            try:
                view = memoryview(blob)
                while view:
                    view = view[self._os.write(fd, view) :]
                self._os.fsync(fd)
            finally:
                self._os.close(fd)
            # Replacing an existing file is harmless: same name, same content.
            self._os.rename(tmp, hexname, src_dir_fd=tfd, dst_dir_fd=sfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=tfd)
            raise
        return now

    def _open_shard(self, shard: str) -> int:
        path = os.path.join(self.dir, shard)
        try:
            return os.open(path, _DIR)
        except FileNotFoundError:
            pass
        for new, parent in ((self.dir, os.path.dirname(self.dir)), (path, self.dir)):
            try:
                self._os.mkdir(new)
            except FileExistsError:
                continue
            pfd = os.open(parent, _DIR)
            try:
                self._os.fsync_dir(pfd)
            finally:
                os.close(pfd)
        return os.open(path, _DIR)

    def remove_stale_temps(self) -> None:
        """Delete temporary files in ``blobs/tmp/`` left by writers that are gone."""
        path = os.path.join(self.dir, TMP)
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return
        now = time.time()
        for name in names:
            full = os.path.join(path, name)
            with contextlib.suppress(FileNotFoundError):
                if pid_is_dead(name) or now - os.stat(full).st_mtime > self._stale:
                    os.unlink(full)

    # --- reading ------------------------------------------------------------------------

    def fetch(self, hashes: Collection[bytes]) -> dict[bytes, bytes]:
        """The stored blobs among ``hashes``; missing, oversized or odd files are left out."""
        out: dict[bytes, bytes] = {}
        for h in hashes:
            hexname = h.hex()
            shard = os.path.join(self.dir, hexname[:2])
            data = self._read(os.path.join(shard, hexname))
            if data is None:  # a sweeper may be deciding about it right now
                data = self._read(os.path.join(shard, _TRASH + hexname))
            if data is not None:
                out[h] = data
        return out

    def _read(self, path: str) -> bytes | None:
        try:
            # O_NONBLOCK: a FIFO planted in the store must not hang the reader.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _OPEN)
        except OSError as exc:
            if is_missing(exc) or exc.errno == errno.ELOOP:
                return None
            raise
        try:
            # Blobs are small: one read usually returns the whole file (a short read of a
            # regular file is its end), so the common case is open, read, close.
            try:
                first = os.read(fd, _FIRST_READ)
            except IsADirectoryError:
                return None
            if len(first) < _FIRST_READ:
                return first  # a non-regular file returns garbage at worst: the hash check
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > self._max:
                return None
            chunks = [first]
            total = len(first)
            while chunk := os.read(fd, max(info.st_size - total, 0) + 1):
                total += len(chunk)
                if total > self._max:
                    return None
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    # --- garbage collection ---------------------------------------------------------------

    def last_collection(self) -> float | None:
        """When a sweep last finished (the lock file's mtime), or None if never.

        The first call on a store without a lock file creates it, so that automatic sweeps
        start one interval after the store's first blob rather than at once.
        """
        path = os.path.join(self.dir, GC_LOCK)
        try:
            return os.stat(path).st_mtime
        except FileNotFoundError:
            pass
        with contextlib.suppress(FileNotFoundError):  # no blobs/ yet: nothing to collect
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | _OPEN, 0o600))
            return time.time()
        return None

    def collect(self, workflows_dir: str, grace: float, *, wait: bool) -> int | None:
        """Mark and sweep; return the number of blobs deleted (None: another sweep runs).

        ``workflows_dir`` is scanned for records. Only one process sweeps at a time
        (flock on ``blobs/gc.lock``); writers never take that lock.
        """
        if not os.path.isdir(self.dir):
            return 0
        fd = os.open(os.path.join(self.dir, GC_LOCK), os.O_RDWR | os.O_CREAT | _OPEN, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            t0 = time.time()
            cutoff = t0 - grace
            self.remove_stale_temps()
            old = [(h, shard) for h, (shard, mtime) in self._list(t0) if mtime < cutoff]
            marked = self._mark(_roots(workflows_dir))
            freed = self._sweep([(h, shard) for h, shard in old if h not in marked], cutoff)
            os.utime(fd)
            return freed
        finally:
            os.close(fd)

    def _list(self, now: float) -> Iterator[tuple[bytes, tuple[str, float]]]:
        """Every blob with its shard and mtime; restores ``.gc-`` leftovers, drops stale temps."""
        for shard in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, shard)
            if len(shard) != 2 or not os.path.isdir(path):
                continue
            with os.scandir(path) as entries:
                names = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
            for name, info in names:
                if name.startswith(_TRASH):
                    with contextlib.suppress(FileNotFoundError):
                        self._os.rename(
                            os.path.join(path, name),
                            os.path.join(path, name[len(_TRASH) :]),
                            src_dir_fd=None,
                            dst_dir_fd=None,
                        )
                    name = name[len(_TRASH) :]
                elif name.startswith(".tmp-"):
                    if pid_is_dead(name) or now - info.st_mtime > self._stale:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(path, name))
                    continue
                try:
                    h = bytes.fromhex(name)
                except ValueError:
                    continue
                if name.startswith(shard) and stat.S_ISREG(info.st_mode):
                    yield h, (shard, info.st_mtime)

    def _mark(self, roots: Iterable[tuple[int, bytes]]) -> set[bytes]:
        """Every hash reachable from ``roots``; missing or damaged blobs end their branch."""
        marked: set[bytes] = set()
        by_digest: dict[int, set[bytes]] = {}
        for digest, root in roots:
            try:
                by_digest.setdefault(digest, set()).update(node_children(root, digest))
            except Exception as exc:  # checksummed records make this unlikely; skip it
                logger.warning("GC: skipping a damaged root (%s)", exc)
        for digest, frontier in by_digest.items():
            while frontier:
                level = frontier - marked
                marked |= level
                frontier = set()
                for h, blob in self.fetch(level).items():
                    try:
                        frontier.update(node_children(blob, digest))
                    except Exception as exc:  # a damaged blob: its record is unreadable anyway
                        logger.warning("blob %s is damaged (%s); not descending", h.hex(), exc)
        return marked

    def _sweep(self, victims: Iterable[tuple[bytes, str]], cutoff: float) -> int:
        freed = 0
        for h, shard in victims:
            path = os.path.join(self.dir, shard)
            name = h.hex()
            trash = os.path.join(path, _TRASH + name)
            try:
                self._os.rename(os.path.join(path, name), trash, src_dir_fd=None, dst_dir_fd=None)
            except FileNotFoundError:
                continue
            # A writer may have touched it between the listing and the rename.
            if os.stat(trash, follow_symlinks=False).st_mtime >= cutoff:
                self._os.rename(trash, os.path.join(path, name), src_dir_fd=None, dst_dir_fd=None)
                continue
            os.unlink(trash)
            self._fresh.pop(h, None)
            freed += 1
        return freed


def _roots(workflows_dir: str) -> Iterator[tuple[int, bytes]]:
    """``(digest size, root)`` of every version-2 record under ``workflows_dir``."""
    try:
        names = os.listdir(workflows_dir)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith("."):
            continue  # being created or deleted
        path = os.path.join(workflows_dir, name)
        try:
            steps = [n for n in os.listdir(path) if parse_step_name(n) is not None]
        except OSError:
            continue
        for step in steps:
            record = _read_record(os.path.join(path, step))
            if record is None:
                continue
            try:
                if record_format_version(record) != 2:
                    continue
                _meta, digest, root = _open_v2(record)
            except Exception as exc:  # unreadable: nothing to keep alive for it
                logger.warning("GC: skipping unreadable record %s: %s", path, exc)
                continue
            if root:
                yield digest, root


def _read_record(path: str) -> bytes | None:
    """A version-2 record's bytes; None for version-1 records (read no further) or none."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE or head[4] != 2:
                return None
            return head + f.read()
    except OSError as exc:
        if is_missing(exc):
            return None
        raise
