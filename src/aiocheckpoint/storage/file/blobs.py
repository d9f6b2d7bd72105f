"""Content-addressed blobs of the file store: the pack cache, writing packs, reading blobs.

Layout under ``base_dir/blobs/`` (format 3, docs/file-storage.md "Blobs and garbage
collection")::

    packs/<24 hex>.pack     the new blobs of one save (or of one compaction), then an index
    tmp/                    packs being written
    packs.midx              a cache of many packs' indexes (``encode_midx``), no fsync
    gc.lock                 flock target of the sweeper; its mtime: the last collection
    <hh>/<hash hex>         one blob per file, written by format-2 stores: still read and
                            collected, never written any more

A pack is written whole to ``tmp/``, fsynced and renamed into ``packs/``; it never changes
afterwards, except its mtime (:mod:`.packs` holds its bytes). A writer makes every blob of a
checkpoint durable before it writes the record, and makes sure the mtime of every pack it
relies on is at most ``grace / 2`` old at that moment (touching old ones): the garbage
collector (:mod:`.gc`, with the safety argument) relies on that. Every function here runs in
a worker thread: the store calls them inside its own one-hop-per-operation methods.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import math
import operator
import os
import stat
import threading
import time
from collections.abc import Collection, Iterable
from operator import itemgetter
from typing import Final, cast

from ...format import SplitResult
from .io import FileOps, is_missing
from .names import pid_is_dead, temp_name
from .packs import (
    MAGIC,
    MIDX,
    PACK_SUFFIX,
    PACKS,
    TMP,
    TRASH,
    Index,
    PackDamagedError,
    decode_midx,
    encode_midx,
    encode_pack,
    pack_base,
    read_pack_index,
)

__all__ = ["BlobStore"]

logger = logging.getLogger(__name__)

#: Ranges of one pack closer than this are read with one ``pread`` (the gap is discarded).
_GAP: Final = 64 * 1024
#: The combined index is rewritten by a writer once this many packs (or a quarter of those
#: it covers) are not in it.
_MIDX_EVERY: Final = 32
_MIDX_MAX: Final = 256 << 20  # ~9 million blobs; a larger file is not read (nor written)
_FIRST_READ: Final = 256 * 1024
_OFFSET: Final = itemgetter(1)
_AT: Final = itemgetter(0)  # of an index entry (offset, length)
_LENGTH: Final = itemgetter(1)
_OPEN: Final = os.O_CLOEXEC | os.O_NOFOLLOW
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | _OPEN
_NEW: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN
# O_NONBLOCK: a FIFO planted in the store must not hang the reader.
_READ: Final = os.O_RDONLY | os.O_NONBLOCK | _OPEN


def _read_run(
    fd: int, run: list[tuple[bytes, int, int]], start: int, end: int, out: dict[bytes, bytes]
) -> None:
    """Read bytes ``start:end`` of ``fd`` with one ``pread`` and cut ``run``'s blobs out."""
    if len(run) == 1 and run[0][2] >= _OWN_READ:
        # A large blob alone: its own read, not a copy cut out of one (pread releases the
        # GIL, a slice of bytes holds it: ~30-100 ms for 50 MB on a busy machine).
        h, offset, length = run[0]
        data = os.pread(fd, length, offset)
        if len(data) == length:
            out[h] = data
        return
    chunk = os.pread(fd, end - start, start)
    size = len(chunk)  # a short read (a truncated pack): the blobs past it are missing
    out.update({h: chunk[o - start : o - start + n] for h, o, n in run if o - start + n <= size})


#: Blobs from this size on are read by a pread of their own (see _read_run).
_OWN_READ: Final = 1024 * 1024


#: What tells whether a directory changed: its inode, mtime and ctime (ns).
_Stamp = tuple[int, int, int]


def _stamp(info: os.stat_result) -> _Stamp:
    return info.st_ino, info.st_mtime_ns, info.st_ctime_ns


def _open_read(path: str, flags: int) -> int:
    return os.open(path, _READ)


def _open_new(path: str, flags: int) -> int:
    return os.open(path, _NEW, 0o600)


class BlobStore:
    """The ``blobs/`` directory of one file store (one object per storage instance).

    It caches the index of every pack it has seen (hash -> pack) and lists ``packs/``
    again only when a hash is not in the cache, or before a save.
    """

    def __init__(self, base: str, ops: FileOps, grace: float, max_bytes: int, stale: float):
        self.dir = os.path.join(base, "blobs")
        self.packs_dir = os.path.join(self.dir, PACKS)
        self.ops = ops
        self.grace = grace
        self._max = max_bytes
        self.stale = stale
        self._lock = threading.Lock()
        self._indexes: dict[str, Index] = {}  # pack name -> its index ({} if unreadable)
        self._where: dict[bytes, str] = {}  # hash -> a pack holding it
        # pack name -> a time its mtime is known to be at least (written, touched or seen).
        self._seen: dict[str, float] = {}
        self._synced: set[str] = set()  # packs whose directory entry is known durable
        # The packs a save relying on one must look at (:meth:`_age`): cached but not in
        # _synced; not in _seen, or aged (their last mark in _aging is past the cut).
        self._unsynced: set[str] = set()
        self._old: set[str] = set()
        self._aging: list[tuple[float, str]] = []  # (the time put in _seen, the pack), a heap
        self._epoch = 0  # counts the listings that added packs, and the packs dropped
        self._midx_read = False  # whether the combined index was read (at the first listing)
        self._midx_covers: set[str] = set()  # the packs the combined index on disk covers
        self._bases: dict[str, str] = {}  # the last listing's names -> their packs
        self._uncovered: set[str] = set()  # packs cached here that it does not cover
        # What ``packs/`` looked like (inode, mtime, ctime) when this object last listed it
        # or renamed a pack into it with nothing else changed there before: see
        # :meth:`refresh_changed`. None: unknown, list it.
        self._stamp: _Stamp | None = None

    # --- the pack cache ----------------------------------------------------------------

    def refresh(self) -> None:
        """List ``packs/`` again: load new packs' indexes, forget packs that are gone."""
        # The listing is taken under the lock: a pack this process registers after writing
        # it is in any listing taken later, so a concurrent refresh never forgets it.
        with self._lock:
            try:
                self._stamp = _stamp(os.stat(self.packs_dir))  # before the listing: no gap
                names = os.listdir(self.packs_dir)
            except FileNotFoundError:
                self._stamp, names = None, []
            current = self._listed(names)
            cached: dict[str, Index] = {}
            if not self._midx_read:
                self._midx_read = True
                cached = self._read_midx()
                self._midx_covers = set(cached)
            gone = self._indexes.keys() - current
            for name in gone:
                del self._indexes[name]
                self._drop(name)
            if gone:  # a hash may also sit in a pack that remains: rebuild the map
                self._where = {h: n for n, index in self._indexes.items() for h in index}
            added = current - self._indexes.keys()
            if added:
                self._epoch += 1
            for name in added:
                index = cached.get(name)
                if index is None:
                    index = self._load_index(name)
                self._indexes[name] = index
                if name not in self._midx_covers:
                    self._uncovered.add(name)
                if name not in self._synced:
                    self._unsynced.add(name)
                if name not in self._seen:
                    self._old.add(name)
                for h in index:
                    self._where.setdefault(h, name)

    def refresh_changed(self) -> None:
        """:meth:`refresh`, unless ``packs/`` is as this object last listed or wrote it.

        A listing costs ~1 ms per 1,000 packs, a ``stat`` microseconds. A change another
        process makes within the timestamp granularity of the one seen may go unnoticed
        until the next change: that only costs sharing (its new blobs are written again),
        never a save's durability, which rests on the ``stat`` of the packs relied on (a
        pack retired meanwhile was last seen more than ``grace/2`` ago, so it is looked at).
        """
        try:
            stamp = _stamp(os.stat(self.packs_dir))
        except FileNotFoundError:
            stamp = None
        if stamp is None or stamp != self._stamp:
            self.refresh()

    def _listed(self, names: list[str]) -> set[str]:
        """The packs a listing of ``packs/`` names; only names new since the last are parsed.

        A save lists the directory, which grows by a pack per save: set operations keep
        the Python per listing to the names that changed (a writer thread holding the GIL
        for a loop over every pack delays the event loop).
        """
        bases = self._bases
        listing = set(names)
        for name in listing - bases.keys():
            bases[name] = pack_base(name) or ""  # "": not a pack
        for name in bases.keys() - listing:
            del bases[name]
        current = set(bases.values())
        current.discard("")
        return current

    def _read_midx(self) -> dict[str, Index]:
        """The combined index on disk ({} if there is none or it is damaged: a cache)."""
        try:
            with open(os.path.join(self.dir, MIDX), "rb", opener=_open_read) as f:
                data = f.read(_MIDX_MAX + 1)
            if len(data) > _MIDX_MAX:
                raise PackDamagedError("combined index too large")
            return decode_midx(data, self._max)
        except (OSError, PackDamagedError) as exc:
            if not (isinstance(exc, OSError) and is_missing(exc)):
                logger.warning("ignoring the combined pack index: %s", exc)
            return {}

    def _update_midx(self) -> None:
        """Rewrite the combined index if enough packs are missing from it (best effort).

        It is only a cache (a reader adopts an entry only for a pack it lists), so it is
        written without fsync, and a failure to write it is no failure of the save.
        """
        with self._lock:
            # Counted as packs come and go: a difference of the two sets walks them all.
            if len(self._uncovered) < max(_MIDX_EVERY, len(self._midx_covers) // 4):
                return
            indexes = dict(self._indexes)
            self._midx_covers = set(indexes)
            self._uncovered.clear()
        data = encode_midx(indexes)
        if len(data) > _MIDX_MAX:
            return
        tmp = os.path.join(self.dir, TMP, temp_name())
        try:
            with open(tmp, "xb", opener=_open_new) as f:
                f.write(data)
            os.rename(tmp, os.path.join(self.dir, MIDX))
        except OSError as exc:
            logger.debug("could not write the combined pack index: %s", exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _load_index(self, name: str) -> Index:
        fd = self._open_pack(name)
        if fd is None:
            return {}
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise PackDamagedError("not a regular file")
            return read_pack_index(fd, info.st_size, self._max)
        except PackDamagedError as exc:
            logger.warning("blob pack %s is damaged (%s); its blobs count as missing", name, exc)
            return {}
        finally:
            os.close(fd)

    def _open_pack(self, name: str) -> int | None:
        """Open pack ``name`` (or its ``.gc-`` name: a sweeper may be deciding about it)."""
        for candidate in (name, TRASH + name):
            try:
                return os.open(os.path.join(self.packs_dir, candidate), _READ)
            except OSError as exc:
                if not (is_missing(exc) or exc.errno == errno.ELOOP):
                    raise
        return None

    @property
    def max_bytes(self) -> int:
        """The largest blob (and record) this store reads."""
        return self._max

    def indexes(self) -> dict[str, Index]:
        """The cached index of every pack known (a copy; {} for an unreadable pack)."""
        with self._lock:
            return dict(self._indexes)

    def forget(self, name: str) -> None:
        """Drop pack ``name`` from the cache (a sweeper deleted it)."""
        with self._lock:
            self._indexes.pop(name, None)
            self._drop(name)
            self._where = {h: n for n, idx in self._indexes.items() for h in idx}

    def _drop(self, name: str) -> None:
        """Forget what is known of pack ``name`` but its index (under the lock)."""
        self._epoch += 1
        self._uncovered.discard(name)
        self._seen.pop(name, None)
        self._synced.discard(name)
        self._unsynced.discard(name)
        self._old.discard(name)

    def _mark_seen(self, name: str, when: float) -> None:
        """Note that pack ``name``'s mtime is at least ``when`` (under the lock)."""
        self._seen[name] = when
        self._old.discard(name)
        heapq.heappush(self._aging, (when, name))

    def _age(self, cut: float) -> tuple[bool, int]:
        """Whether a known pack is a suspect (for ``cut``), and the epoch it holds for.

        The suspects (``_old``, ``_unsynced``) are a superset of what a save's walk over
        the packs it relies on (:meth:`_stale`, the check against ``_synced``) could find,
        kept as packs are seen and age: a save that relies on none of them has nothing to
        touch or fsync, and skips the walk over every pack its tree relies on (one per
        earlier save in a chat). The answer holds while the epoch does: a concurrent
        listing may add packs (not yet looked at) or drop one (gone: look again).
        """
        with self._lock:
            aging, seen = self._aging, self._seen
            while aging and aging[0][0] <= cut:
                when, name = heapq.heappop(aging)
                if seen.get(name) == when:  # its last mark: the pack aged
                    self._old.add(name)
            return bool(self._old or self._unsynced), self._epoch

    def _relies_on_suspect(self, names: list[str | None], epoch: int) -> bool:
        """Whether ``names`` (packs a save relies on) may hold a suspect (see above)."""
        with self._lock:
            if self._epoch != epoch:
                return True
            return not (self._old.isdisjoint(names) and self._unsynced.isdisjoint(names))

    def _register(
        self, name: str, index: Index, now: float, stamps: tuple[_Stamp, _Stamp] | None = None
    ) -> None:
        """Add a pack this object wrote; ``stamps``: ``packs/`` before and after its rename."""
        with self._lock:
            if stamps is not None and stamps[0] == self._stamp:
                self._stamp = stamps[1]  # nothing new there but this pack
            self._indexes[name] = index
            if name not in self._midx_covers:
                self._uncovered.add(name)
            for h in index:
                self._where[h] = name
            self._mark_seen(name, now)
            self._synced.add(name)
            self._unsynced.discard(name)

    # --- writing ------------------------------------------------------------------------

    def put(self, split: SplitResult) -> None:
        """Make every blob ``split`` references durable and recent enough (see module doc).

        The work per node is one or two C-level passes (a chat's tree names every node at
        every save, ~1,000 of them, while ~20 are new); the packs relied on are walked only
        when one of them may need a look (:meth:`_age`), and Python runs per pack that
        needs one.
        """
        now = time.time()
        half = self.grace / 2
        self.refresh_changed()
        wanted = split.children
        suspect, epoch = self._age(now - half)
        if not suspect:  # no pack to look at: only the new blobs to find
            new = list(itertools.filterfalse(self._where.__contains__, wanted))
            if self._epoch == epoch:
                if new:
                    self.write_pack([(h, split.blobs[h]) for h in dict.fromkeys(new)], now)
                self._update_midx()
                return
        names = list(map(self._where.get, wanted))
        new = []
        if None in names:
            new = list(itertools.compress(wanted, map(operator.not_, names)))
        relied: set[str] = set()
        if self._relies_on_suspect(names, epoch):
            relied = cast("set[str]", set(names))
            relied.discard(None)
        retired = set()
        for name in self._stale(relied, now - half):
            if not self._touch(name, now, half):  # retired by a sweeper: store these again
                new.extend(itertools.compress(wanted, map(name.__eq__, names)))
                retired.add(name)
        unsynced = not relied - retired <= self._synced
        if new:
            self.write_pack([(h, split.blobs[h]) for h in dict.fromkeys(new)], now)
        if unsynced:
            # Packs of other writers we rely on: they may have died before their own
            # directory fsync (ours above, if any, covered them too).
            if not new:
                self._fsync_packs_dir()
            with self._lock:
                self._synced.update(relied)
                self._unsynced.difference_update(relied)
        self._update_midx()

    def _stale(self, packs: set[str], cut: float) -> list[str]:
        """The packs among ``packs`` not seen with an mtime after ``cut`` (to be touched)."""
        order = list(packs)
        seen = list(map(self._seen.get, order, itertools.repeat(-math.inf)))
        if not seen or min(seen) > cut:
            return []
        return list(itertools.compress(order, map(operator.le, seen, itertools.repeat(cut))))

    def _touch(self, name: str, now: float, half: float) -> bool:
        """Make pack ``name``'s mtime younger than ``half``; False if it is gone."""
        path = os.path.join(self.packs_dir, name)
        try:
            mtime = os.stat(path, follow_symlinks=False).st_mtime
            if now - mtime >= half:
                os.utime(path, follow_symlinks=False)
                mtime = now
        except FileNotFoundError:
            return False
        with self._lock:
            if name in self._indexes:  # not forgotten meanwhile
                self._mark_seen(name, mtime)
        return True

    def write_pack(self, blobs: list[tuple[bytes, bytes]], now: float) -> str:
        """Durably write a new pack of ``blobs`` (fsync, rename, directory fsync); its name."""
        data = encode_pack(blobs)
        name = os.urandom(12).hex() + PACK_SUFFIX
        tfd = self._open_dir(TMP)
        try:
            pfd = self._open_dir(PACKS)
            try:
                tmp = temp_name()
                fd = self.ops.open(tmp, _NEW, 0o600, dir_fd=tfd)
                try:
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[self.ops.write(fd, view) :]
                        self.ops.fsync(fd)
                    finally:
                        self.ops.close(fd)
                    before = _stamp(os.fstat(pfd))
                    self.ops.rename(tmp, name, src_dir_fd=tfd, dst_dir_fd=pfd)
                    stamps = before, _stamp(os.fstat(pfd))
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=tfd)
                    raise
                self.ops.fsync_dir(pfd)
            finally:
                os.close(pfd)
        finally:
            os.close(tfd)
        index: Index = {}
        offset = len(MAGIC)
        for h, blob in blobs:
            index[h] = (offset, len(blob))
            offset += len(blob)
        self._register(name, index, now, stamps)
        return name

    def _fsync_packs_dir(self) -> None:
        fd = self._open_dir(PACKS)
        try:
            self.ops.fsync_dir(fd)
        finally:
            os.close(fd)

    def _open_dir(self, sub: str) -> int:
        path = os.path.join(self.dir, sub)
        try:
            return os.open(path, _DIR)
        except FileNotFoundError:
            pass
        for new, parent in ((self.dir, os.path.dirname(self.dir)), (path, self.dir)):
            try:
                self.ops.mkdir(new)
            except FileExistsError:
                continue
            pfd = os.open(parent, _DIR)
            try:
                self.ops.fsync_dir(pfd)
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
                if pid_is_dead(name) or now - os.stat(full).st_mtime > self.stale:
                    os.unlink(full)

    # --- reading ------------------------------------------------------------------------

    def fetch(self, hashes: Collection[bytes]) -> dict[bytes, bytes]:
        """The stored blobs among ``hashes``; missing or unreadable ones are left out.

        Blobs are read pack by pack, nearby ranges with one ``pread``; a hash the cached
        indexes do not know makes one new listing of ``packs/``, then a look for a
        format-2 blob file.
        """
        out: dict[bytes, bytes] = {}
        missing = self._read_packs(hashes, out)
        if missing:
            self.refresh()
            missing = self._read_packs(missing, out)
        if missing and self._has_blob_files():
            for h in missing:
                data = self._read_file(h)
                if data is not None:
                    out[h] = data
        return out

    def _read_packs(self, hashes: Iterable[bytes], out: dict[bytes, bytes]) -> list[bytes]:
        """Read the blobs among ``hashes`` that the cache places into ``out``; the rest."""
        missing: list[bytes] = []
        by_pack: dict[str, list[bytes]] = {}
        hashes = list(hashes)
        names = list(map(self._where.get, hashes))
        if len(set(names)) == 1 and names[0] is not None:  # a level saved at once: one pack
            by_pack[names[0]] = hashes
        else:
            for h, name in zip(hashes, names, strict=True):
                if name is None:
                    missing.append(h)
                else:
                    by_pack.setdefault(name, []).append(h)
        for name, wanted in by_pack.items():
            index = self._indexes.get(name, {})
            places = list(map(index.get, wanted))
            known = wanted
            if None in places:
                known = [h for h, at in zip(wanted, places, strict=True) if at is not None]
            locs = [at for at in places if at is not None] if known is not wanted else places
            got = self._read_span(name, known, locs)  # type: ignore[arg-type]
            if got is None:
                entries = [(h, *at) for h, at in zip(known, locs, strict=True) if at is not None]
                got = self.read_blobs(name, entries)
            out.update(got)
            if len(got) != len(wanted):
                missing.extend(h for h in wanted if h not in got)
        return missing

    def _read_span(
        self, name: str, hashes: list[bytes], locs: list[tuple[int, int]]
    ) -> dict[bytes, bytes] | None:
        """Read ``hashes`` (at ``locs``: offset, length) from pack ``name`` with one ``pread``.

        The blobs of one tree level sit close together in a pack (a save writes them in
        tree order), so one read of their span, cut by a few ``map`` calls rather than
        Python work per blob, is the common case of a resume. None if the span is sparse
        (more than half of it unwanted) or the read comes up short: then
        :meth:`read_blobs` reads in runs.
        """
        if not locs:
            return {}
        offsets = list(map(_AT, locs))
        lengths = list(map(_LENGTH, locs))
        start = min(offsets)
        end = max(map(operator.add, offsets, lengths))
        if end - start > 2 * sum(lengths) + _GAP:
            return None
        fd = self._open_pack(name)
        if fd is None:
            return {}
        try:
            chunk = os.pread(fd, end - start, start)
        except IsADirectoryError:
            return {}
        finally:
            os.close(fd)
        if len(chunk) != end - start:
            return None
        firsts = list(map(operator.sub, offsets, itertools.repeat(start, len(offsets))))
        cuts = map(slice, firsts, map(operator.add, firsts, lengths))
        return dict(zip(hashes, map(chunk.__getitem__, cuts), strict=True))

    def read_blobs(self, name: str, entries: list[tuple[bytes, int, int]]) -> dict[bytes, bytes]:
        """Read ``(hash, offset, length)`` entries of pack ``name`` (nothing if it is gone).

        Entries closer than ``_GAP`` to each other are read with one ``pread``.
        """
        fd = self._open_pack(name)
        if fd is None:
            return {}
        out: dict[bytes, bytes] = {}
        try:
            entries.sort(key=_OFFSET)
            run: list[tuple[bytes, int, int]] = []
            start = end = 0
            for entry in entries:
                offset = entry[1]
                if run and offset - end >= _GAP:
                    _read_run(fd, run, start, end, out)
                    run = []
                if not run:
                    start = end = offset
                run.append(entry)
                end = max(end, offset + entry[2])
            if run:
                _read_run(fd, run, start, end, out)
        except IsADirectoryError:
            return {}
        finally:
            os.close(fd)
        return out

    def _has_blob_files(self) -> bool:
        """Whether ``blobs/`` holds format-2 shard directories."""
        try:
            return any(len(n) == 2 for n in os.listdir(self.dir))
        except FileNotFoundError:
            return False

    def _read_file(self, h: bytes) -> bytes | None:
        hexname = h.hex()
        shard = os.path.join(self.dir, hexname[:2])
        data = self._read(os.path.join(shard, hexname))
        if data is None:  # a sweeper may be deciding about it right now
            data = self._read(os.path.join(shard, TRASH + hexname))
        return data

    def _read(self, path: str) -> bytes | None:
        """A format-2 blob file's bytes (None if missing, oversized or not a file)."""
        try:
            fd = os.open(path, _READ)
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
