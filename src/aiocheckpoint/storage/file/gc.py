"""Garbage collection of the file store's blobs: mark-and-sweep with a grace period.

Safety argument (docs/file-storage.md, "Blobs and garbage collection"; for format-2 blob
files read "a blob's mtime" for "the mtime of the pack holding it"):

* A writer makes every blob of a checkpoint durable (new ones in one new pack: file fsync,
  rename, directory fsync) before it writes the record, and makes sure the mtime of every
  pack it relies on is at most ``grace / 2`` old at that moment (touching old ones). A
  sweeper retires only packs whose mtime is older than ``t0 - grace``, where ``t0`` is taken
  before it lists the packs and reads the records; so a record it could not see when
  marking was written after ``t0`` and relies only on packs younger than the cut-off, as
  long as a save takes less than ``grace / 2``.
* A pack none of whose blobs is marked is retired; a pack whose unmarked blobs are more
  than ``_COMPACT`` of its bytes is compacted (its marked blobs copied to a new durable pack
  first), then retired; so are small packs once a sweep finds ``_MERGE_MIN`` of them (merged
  into one). Retiring renames it to ``.gc-<name>``, looks at its mtime again (a
  writer may have touched it meanwhile) and either renames it back or unlinks it. Readers
  also look for ``.gc-<name>``, and the next sweep renames back any left by a crashed
  sweeper.
* A record whose references cannot be read (cut short, damaged, a sealed record naming a
  root blob the store lacks: its references carry no checksum the store can check) might
  name any blob, and a good copy of it (a backup, a repair) would need them: the sweep
  then deletes nothing and raises :class:`~aiocheckpoint.CheckpointCorruptedError` naming
  it. Anything that is not a record of ours at a step's path (not a regular file, over the
  size limit) is skipped, as ``load`` refuses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator
from typing import Final

from ...errors import CheckpointCorruptedError
from ...format import HEADER_SIZE, MAGIC, node_children, record_format_version
from ...format import open_record_v2 as _open_v2
from ...format.sealed import is_sealed_tree_record, tree_refs_end
from .blobs import BlobStore
from .io import DIR_FLAGS, OddEntry, open_regular, read_bounded
from .names import parse_step_name, pid_is_dead
from .packs import GC_LOCK, TRASH, Index, pack_base

__all__ = ["Collector"]

logger = logging.getLogger(__name__)

#: A pack whose unreferenced blobs exceed this fraction of its blob bytes is compacted.
_COMPACT: Final = 0.5
#: Packs with fewer blob bytes than this are merged by a sweep once it finds ``_MERGE_MIN``.
_SMALL_PACK: Final = 1 << 20
_MERGE_MIN: Final = 16
#: A sweep copies at most about this many bytes into one new pack.
_BATCH: Final = 64 << 20
_OPEN: Final = os.O_CLOEXEC | os.O_NOFOLLOW
_NONBLOCK: Final = _OPEN | os.O_NONBLOCK  # a FIFO planted as gc.lock cannot hang a sweep
#: A pack to rewrite: its name, its number of blobs, its marked ``(hash, offset, length)``.
_Rewrite = tuple[str, int, list[tuple[bytes, int, int]]]
#: A record's root: where it is, its digest size, its references, whether it is sealed.
_Root = tuple[str, int, tuple[bytes, ...], bool]


class _Unreadable(Exception):
    """A record whose blob references cannot be read (the reason is the message)."""


class Collector:
    """The sweeper of one store's ``blobs/`` (one object per storage instance)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.dir = blobs.dir
        self.packs_dir = blobs.packs_dir

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
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | _NONBLOCK, 0o600))
            return time.time()
        return None

    def collect(self, workflows_dir: str, grace: float, *, wait: bool) -> int | None:
        """Mark and sweep; return the number of blobs deleted (None: another sweep runs).

        ``workflows_dir`` is scanned for records. Only one process sweeps at a time
        (flock on ``blobs/gc.lock``); writers never take that lock.
        """
        if not os.path.isdir(self.dir):
            return 0
        fd = os.open(os.path.join(self.dir, GC_LOCK), os.O_RDWR | os.O_CREAT | _NONBLOCK, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            t0 = time.time()
            cutoff = t0 - grace
            self.blobs.remove_stale_temps()
            old = [(h, shard) for h, (shard, mtime) in self._list(t0) if mtime < cutoff]
            old_packs = self._list_packs(cutoff)
            unreadable: list[tuple[str, str]] = []
            roots = _roots(workflows_dir, self.blobs.max_bytes, unreadable)
            marked = self._mark(roots, unreadable)
            if unreadable:
                raise _held(unreadable)
            freed = self._sweep([(h, shard) for h, shard in old if h not in marked], cutoff)
            freed += self._sweep_packs(old_packs, marked, cutoff)
            os.utime(fd)
            return freed
        finally:
            os.close(fd)

    def _list_packs(self, cutoff: float) -> list[tuple[str, Index]]:
        """Packs older than ``cutoff`` with their indexes; restores ``.gc-`` leftovers.

        A pack whose index cannot be read is left alone (and logged when loaded).
        """
        try:
            names = os.listdir(self.packs_dir)
        except FileNotFoundError:
            return []
        for name in names:
            if name.startswith(TRASH) and pack_base(name) is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.blobs.ops.rename(
                        os.path.join(self.packs_dir, name),
                        os.path.join(self.packs_dir, name[len(TRASH) :]),
                        src_dir_fd=None,
                        dst_dir_fd=None,
                    )
        self.blobs.refresh()
        old = []
        for name, index in self.blobs.indexes().items():
            try:
                info = os.stat(os.path.join(self.packs_dir, name), follow_symlinks=False)
            except FileNotFoundError:
                continue
            if index and stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff:
                old.append((name, index))
        return old

    def _sweep_packs(
        self, packs: list[tuple[str, Index]], marked: set[bytes], cutoff: float
    ) -> int:
        """Retire, compact and merge old packs (see the module doc); return the blobs freed.

        Packs without marked blobs are retired; mostly unmarked packs, and small packs once
        there are ``_MERGE_MIN`` of them, are rewritten together as few new packs.
        """
        freed = 0
        rewrite: list[_Rewrite] = []
        small: list[_Rewrite] = []
        for name, index in packs:
            live = [(h, off, length) for h, (off, length) in index.items() if h in marked]
            if not live:
                if self._retire(name, cutoff):
                    freed += len(index)
                continue
            total = sum(length for _off, length in index.values())
            dead = total - sum(length for _h, _off, length in live)
            if dead > total * _COMPACT:
                rewrite.append((name, len(index), live))
            elif total < _SMALL_PACK:
                small.append((name, len(index), live))
        if len(small) >= _MERGE_MIN:
            rewrite += small
        by_length: dict[int, list[_Rewrite]] = {}
        for item in rewrite:  # a pack holds hashes of one length
            by_length.setdefault(len(item[2][0][0]), []).append(item)
        for group in by_length.values():
            while group:
                freed += self._rewrite(group, cutoff)
        return freed

    def _rewrite(self, group: list[_Rewrite], cutoff: float) -> int:
        """Rewrite packs taken from ``group`` (up to ``_BATCH`` bytes) as one new pack.

        The marked blobs are copied to a durable new pack first, then the old packs are
        retired; returns the number of unmarked blobs the retired ones held.
        """
        copied: dict[bytes, bytes] = {}
        size = 0
        done: list[tuple[str, int]] = []
        while group and (not done or size < _BATCH):
            name, count, live = group.pop()
            got = self.blobs.read_blobs(name, list(live))
            if len(got) != len(live):
                continue  # unreadable or damaged: leave the pack as it is
            for h, blob in got.items():
                if h not in copied:
                    copied[h] = blob
                    size += len(blob)
            done.append((name, count - len(live)))
        if not done:
            return 0
        self.blobs.write_pack(list(copied.items()), time.time())
        return sum(dead for name, dead in done if self._retire(name, cutoff))

    def _retire(self, name: str, cutoff: float) -> bool:
        """Delete pack ``name`` unless a writer touched it since ``cutoff``."""
        path = os.path.join(self.packs_dir, name)
        trash = os.path.join(self.packs_dir, TRASH + name)
        try:
            self.blobs.ops.rename(path, trash, src_dir_fd=None, dst_dir_fd=None)
        except FileNotFoundError:
            return False
        # A writer may have touched it between the listing and the rename.
        if os.stat(trash, follow_symlinks=False).st_mtime >= cutoff:
            self.blobs.ops.rename(trash, path, src_dir_fd=None, dst_dir_fd=None)
            return False
        os.unlink(trash)
        self.blobs.forget(name)
        return True

    def _list(self, now: float) -> Iterator[tuple[bytes, tuple[str, float]]]:
        """Every format-2 blob file with its shard and mtime (restores ``.gc-`` leftovers)."""
        for shard in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, shard)
            if len(shard) != 2 or not os.path.isdir(path):
                continue
            with os.scandir(path) as entries:
                names = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
            for name, info in names:
                if name.startswith(TRASH):
                    with contextlib.suppress(FileNotFoundError):
                        self.blobs.ops.rename(
                            os.path.join(path, name),
                            os.path.join(path, name[len(TRASH) :]),
                            src_dir_fd=None,
                            dst_dir_fd=None,
                        )
                    name = name[len(TRASH) :]
                elif name.startswith(".tmp-"):
                    if pid_is_dead(name) or now - info.st_mtime > self.blobs.stale:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(path, name))
                    continue
                try:
                    h = bytes.fromhex(name)
                except ValueError:
                    continue
                if name.startswith(shard) and stat.S_ISREG(info.st_mode):
                    yield h, (shard, info.st_mtime)

    def _mark(self, roots: Iterable[_Root], unreadable: list[tuple[str, str]]) -> set[bytes]:
        """Every hash reachable from ``roots``.

        Missing or damaged blobs end their branch. A sealed root naming a blob the store
        lacks is added to ``unreadable``: its references carry no checksum, and may be
        damaged.
        """
        marked: set[bytes] = set()
        by_digest: dict[int, set[bytes]] = {}
        sealed: list[tuple[str, tuple[bytes, ...]]] = []
        for where, digest, refs, is_sealed in roots:
            by_digest.setdefault(digest, set()).update(refs)
            if is_sealed:
                sealed.append((where, refs))
        found: set[bytes] = set()
        for digest, frontier in by_digest.items():
            first = True
            while frontier:
                level = frontier - marked
                marked |= level
                frontier = set()
                blobs = self.blobs.fetch(level)
                if first:
                    found.update(blobs)
                    first = False
                for h, blob in blobs.items():
                    try:
                        frontier.update(node_children(blob, digest))
                    except Exception as exc:  # a damaged blob: its record is unreadable anyway
                        logger.warning("blob %s is damaged (%s); not descending", h.hex(), exc)
        for where, refs in sealed:
            if not found.issuperset(refs):
                _note(unreadable, where, "a sealed record names a blob the store lacks")
        return marked

    def _sweep(self, victims: Iterable[tuple[bytes, str]], cutoff: float) -> int:
        freed = 0
        for h, shard in victims:
            path = os.path.join(self.dir, shard)
            name = h.hex()
            trash = os.path.join(path, TRASH + name)
            try:
                self.blobs.ops.rename(
                    os.path.join(path, name), trash, src_dir_fd=None, dst_dir_fd=None
                )
            except FileNotFoundError:
                continue
            # A writer may have touched it between the listing and the rename.
            if os.stat(trash, follow_symlinks=False).st_mtime >= cutoff:
                self.blobs.ops.rename(
                    trash, os.path.join(path, name), src_dir_fd=None, dst_dir_fd=None
                )
                continue
            os.unlink(trash)
            freed += 1
        return freed


def _roots(workflows_dir: str, limit: int, unreadable: list[tuple[str, str]]) -> Iterator[_Root]:
    """The root of every version-2 record under ``workflows_dir``.

    Records are read as ``load`` reads them (non-blocking, regular files of at most
    ``limit`` bytes); anything else at a step's path is reported and skipped. A record
    whose references cannot be read is added to ``unreadable``.
    """
    try:
        names = os.listdir(workflows_dir)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith("."):
            continue  # being created or deleted
        try:
            dfd = os.open(os.path.join(workflows_dir, name), DIR_FLAGS)
        except OSError:
            continue  # not a directory (or gone): no records of ours
        try:
            try:
                steps = [n for n in os.listdir(dfd) if parse_step_name(n) is not None]
            except OSError:
                continue
            for step in steps:
                where = f"{name}/{step}"
                try:
                    yield from _root_of(dfd, step, limit, where)
                except _Unreadable as exc:
                    _note(unreadable, where, str(exc))
        finally:
            os.close(dfd)


def _root_of(dfd: int, name: str, limit: int, where: str) -> Iterator[_Root]:
    """The root of the record ``name`` (none for a version-1 record or no record).

    Raises ``_Unreadable`` for a record whose references cannot be read.
    """
    try:
        record = _read_v2(dfd, name, limit)
    except OddEntry as exc:
        logger.warning("GC: skipping %s: %s", where, exc)
        return
    if record is None:
        return
    try:
        if record_format_version(record) != 2:
            raise _Unreadable(f"unknown format version {record[4]}")
        if is_sealed_tree_record(record):  # encrypted: its references are in the clear
            digest, refs, _end = tree_refs_end(record)
            yield where, digest, refs, True
            return
        _meta, digest, root = _open_v2(record)
        refs = node_children(root, digest) if root else ()
    except _Unreadable:
        raise
    except Exception as exc:
        raise _Unreadable(" ".join(str(exc).split()) or type(exc).__name__) from exc
    yield where, digest, refs, False


def _read_v2(dfd: int, name: str, limit: int) -> bytes | None:
    """A record's bytes; None for version-1 records (read no further) or none.

    A record too short for a header, or whose header is not ours, is read whole (to be
    found unreadable): it may be a version-2 record cut short or damaged.
    """
    fd = open_regular(name, dfd)
    if fd is None:
        return None
    try:
        head = os.read(fd, HEADER_SIZE)
        if len(head) == HEADER_SIZE and head[:4] == MAGIC and head[4] == 1:
            return None
        return read_bounded(fd, limit, head=head)
    finally:
        os.close(fd)


#: How many unreadable records a sweep's error names (it counts them all).
_NAMED = 3


def _note(unreadable: list[tuple[str, str]], where: str, reason: str) -> None:
    """Log an unreadable record and keep it for the error (the first ``_NAMED`` only)."""
    logger.warning("GC: unreadable record %s: %s (no blob is deleted)", where, reason)
    unreadable.append((where, reason) if len(unreadable) < _NAMED else ("", ""))


def _held(unreadable: list[tuple[str, str]]) -> CheckpointCorruptedError:
    """The error of a sweep that deleted nothing because of ``unreadable`` records."""
    named = "; ".join(f"{where}: {reason}" for where, reason in unreadable if where)
    more = len(unreadable) - min(len(unreadable), _NAMED)
    return CheckpointCorruptedError(
        f"garbage collection deleted no blob: {len(unreadable)} record(s) whose blob "
        f"references cannot be read might name any of them ({named}"
        f"{f'; {more} more' if more else ''}); repair or delete them"
    )
