"""Content-addressed blobs of the file store: pack files, write, touch, fetch, mark-and-sweep.

Layout under ``base_dir/blobs/`` (format 3, docs/file-storage.md "Blobs and garbage
collection")::

    packs/<24 hex>.pack     the new blobs of one save (or of one compaction), then an index
    tmp/                    packs being written
    packs.midx              a cache of many packs' indexes (``encode_midx``), no fsync
    gc.lock                 flock target of the sweeper; its mtime: the last collection
    <hh>/<hash hex>         one blob per file, written by format-2 stores: still read and
                            collected, never written any more

A pack is ``_MAGIC``, the stored blobs back to back, an index of fixed-size ``(hash,
offset, length)`` entries and a fixed trailer (index offset, entry count, CRC-32 of the
index, hash length, ``_TRAILER_MAGIC``). A pack is written whole to ``tmp/``, fsynced and
renamed into ``packs/``; it never changes afterwards, except its mtime. Every function here
runs in a worker thread: the store calls them inside its own one-hop-per-operation methods.

Safety argument (the same as for blob files, with "the mtime of the pack holding it" for
"a blob's mtime"):

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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import operator
import os
import stat
import struct
import threading
import time
import zlib
from collections.abc import Collection, Iterable, Iterator
from operator import itemgetter
from typing import Final

from ..format import HEADER_SIZE, SplitResult, node_children, record_format_version
from ..format import open_record_v2 as _open_v2
from ._filefmt import FileOps, is_missing, parse_step_name, pid_is_dead, temp_name

__all__ = [
    "MIDX",
    "PACKS",
    "BlobStore",
    "PackDamagedError",
    "decode_midx",
    "encode_midx",
    "encode_pack",
    "read_pack_index",
]

logger = logging.getLogger("aiocheckpoint")

GC_LOCK: Final = "gc.lock"
TMP: Final = "tmp"
PACKS: Final = "packs"
PACK_SUFFIX: Final = ".pack"
_MAGIC: Final = b"ACKPACK\x01"
# index offset, entries, CRC-32 of the index, hash length, magic
_TRAILER: Final = struct.Struct(">QIIB7s")
_TRAILER_MAGIC: Final = b"ACKPIX1"
#: Ranges of one pack closer than this are read with one ``pread`` (the gap is discarded).
_GAP: Final = 64 * 1024
#: A pack whose unreferenced blobs exceed this fraction of its blob bytes is compacted.
_COMPACT: Final = 0.5
#: Packs with fewer blob bytes than this are merged by a sweep once it finds ``_MERGE_MIN``.
_SMALL_PACK: Final = 1 << 20
_MERGE_MIN: Final = 16
#: The combined index (a cache of every pack's index, see ``encode_midx``) is rewritten by a
#: writer once this many packs (or a quarter of those it covers) are not in it.
MIDX: Final = "packs.midx"
_MIDX_MAGIC: Final = b"ACKMIDX1"
_MIDX_EVERY: Final = 32
_MIDX_MAX: Final = 256 << 20  # ~9 million blobs; a larger file is not read (nor written)
#: A sweep copies at most about this many bytes into one new pack.
_BATCH: Final = 64 << 20
_FIRST_READ: Final = 256 * 1024
_OFFSET: Final = itemgetter(1)
_AT: Final = itemgetter(0)  # of an index entry (offset, length)
_LENGTH: Final = itemgetter(1)
_TRASH: Final = ".gc-"
_OPEN: Final = os.O_CLOEXEC | os.O_NOFOLLOW
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | _OPEN
_NEW: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN
# O_NONBLOCK: a FIFO planted in the store must not hang the reader.
_READ: Final = os.O_RDONLY | os.O_NONBLOCK | _OPEN

#: Where each blob of a pack lies: hash -> (offset, length).
Index = dict[bytes, tuple[int, int]]
#: A pack to rewrite: its name, its number of blobs, its marked ``(hash, offset, length)``.
_Rewrite = tuple[str, int, list[tuple[bytes, int, int]]]


class PackDamagedError(ValueError):
    """A pack's trailer or index is malformed (its blobs count as missing)."""


def encode_pack(blobs: Collection[tuple[bytes, bytes]]) -> bytes:
    """The bytes of a pack of ``blobs``: ``(hash, stored blob)`` pairs, hashes of one length."""
    hlen = len(next(iter(blobs))[0]) if blobs else 0
    entry = _entry(hlen)
    index = bytearray(entry.size * len(blobs))
    parts: list[bytes | bytearray] = [_MAGIC]
    offset = len(_MAGIC)
    for i, (h, blob) in enumerate(blobs):
        if len(h) != hlen:
            raise ValueError("hashes of one pack must have one length")
        entry.pack_into(index, i * entry.size, h, offset, len(blob))
        parts.append(blob)
        offset += len(blob)
    parts.append(index)
    parts.append(_TRAILER.pack(offset, len(blobs), zlib.crc32(index), hlen, _TRAILER_MAGIC))
    return b"".join(parts)


def read_pack_index(fd: int, size: int, max_blob: int) -> Index:
    """Parse the index of the pack open as ``fd`` (``size`` bytes long).

    Raises :class:`PackDamagedError` unless the trailer, the index checksum and every
    entry's bounds are right.
    """
    if size < len(_MAGIC) + _TRAILER.size:
        raise PackDamagedError("too short for a pack")
    trailer = os.pread(fd, _TRAILER.size, size - _TRAILER.size)
    if len(trailer) != _TRAILER.size:
        raise PackDamagedError("short read of the trailer")
    start, count, crc, hlen, magic = _TRAILER.unpack(trailer)
    end = size - _TRAILER.size
    entry = _entry(hlen)
    if magic != _TRAILER_MAGIC or not len(_MAGIC) <= start <= end:
        raise PackDamagedError("bad trailer")
    if end - start != count * entry.size:
        raise PackDamagedError("index size does not match its entry count")
    raw = os.pread(fd, end - start, start) if end > start else b""
    if len(raw) != end - start or zlib.crc32(raw) != crc:
        raise PackDamagedError("index checksum mismatch")
    return _parse_entries(entry, raw, start, max_blob)


def _entry(hlen: int) -> struct.Struct:
    """An index entry: a hash of ``hlen`` bytes, then its blob's offset and length."""
    return struct.Struct(f">{hlen}sQI")


def _parse_entries(entry: struct.Struct, raw: bytes, blob_end: int, max_blob: int) -> Index:
    """Index entries packed in ``raw``; each blob must lie in ``[len(_MAGIC), blob_end)``."""
    index: Index = {}
    for h, offset, length in entry.iter_unpack(raw):
        if offset < len(_MAGIC) or offset + length > blob_end or length > max_blob:
            raise PackDamagedError("index entry out of bounds")
        index[h] = (offset, length)
    return index


def _read_run(
    fd: int, run: list[tuple[bytes, int, int]], start: int, end: int, out: dict[bytes, bytes]
) -> None:
    """Read bytes ``start:end`` of ``fd`` with one ``pread`` and cut ``run``'s blobs out."""
    chunk = os.pread(fd, end - start, start)
    size = len(chunk)  # a short read (a truncated pack): the blobs past it are missing
    out.update({h: chunk[o - start : o - start + n] for h, o, n in run if o - start + n <= size})


def encode_midx(indexes: dict[str, Index]) -> bytes:
    """The bytes of a combined index of the packs ``indexes`` describes.

    ``_MIDX_MAGIC``, then per pack its name (u8 length, ASCII), entry count (u32), hash
    length (u8) and its entries as in the pack's own index; then a CRC-32 of all that.
    """
    parts = [_MIDX_MAGIC]
    for name, index in indexes.items():
        if not index:
            continue
        hlen = len(next(iter(index)))
        entry = _entry(hlen)
        raw = name.encode("ascii")
        parts.append(bytes((len(raw),)) + raw + struct.pack(">IB", len(index), hlen))
        parts.append(b"".join([entry.pack(h, o, n) for h, (o, n) in index.items()]))
    body = b"".join(parts)
    return body + struct.pack(">I", zlib.crc32(body))


def decode_midx(data: bytes, max_blob: int) -> dict[str, Index]:
    """Parse a combined index; :class:`PackDamagedError` unless it is whole and plausible."""
    end = len(data) - 4
    if end < len(_MIDX_MAGIC) or not data.startswith(_MIDX_MAGIC):
        raise PackDamagedError("not a combined pack index")
    if zlib.crc32(memoryview(data)[:end]) != int.from_bytes(data[end:], "big"):
        raise PackDamagedError("combined index checksum mismatch")
    out: dict[str, Index] = {}
    pos = len(_MIDX_MAGIC)
    try:
        while pos < end:
            nlen = data[pos]
            name = data[pos + 1 : pos + 1 + nlen].decode("ascii")
            count, hlen = struct.unpack_from(">IB", data, pos + 1 + nlen)
            pos += 1 + nlen + 5
            entry = _entry(hlen)
            size = count * entry.size
            if pos + size > end:
                raise PackDamagedError("truncated combined index")
            # The pack's size is unknown here: a read past its end comes back short.
            out[name] = _parse_entries(entry, data[pos : pos + size], 2**64, max_blob)
            pos += size
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise PackDamagedError(f"malformed combined index ({exc})") from exc
    return out


def _open_read(path: str, flags: int) -> int:
    return os.open(path, _READ)


def _open_new(path: str, flags: int) -> int:
    return os.open(path, _NEW, 0o600)


def _pack_base(name: str) -> str | None:
    """The pack name ``name`` stands for (``.gc-`` prefix removed), or None if not a pack."""
    if name.startswith(_TRASH):
        name = name[len(_TRASH) :]
    stem = name[: -len(PACK_SUFFIX)]
    if not name.endswith(PACK_SUFFIX) or not stem or name.startswith("."):
        return None
    return name


class BlobStore:
    """The ``blobs/`` directory of one file store (one object per storage instance).

    It caches the index of every pack it has seen (hash -> pack) and lists ``packs/``
    again only when a hash is not in the cache, or before a save.
    """

    def __init__(self, base: str, ops: FileOps, grace: float, max_bytes: int, stale: float):
        self.dir = os.path.join(base, "blobs")
        self.packs_dir = os.path.join(self.dir, PACKS)
        self._os = ops
        self.grace = grace
        self._max = max_bytes
        self._stale = stale
        self._lock = threading.Lock()
        self._indexes: dict[str, Index] = {}  # pack name -> its index ({} if unreadable)
        self._where: dict[bytes, str] = {}  # hash -> a pack holding it
        # pack name -> a time its mtime is known to be at least (written, touched or seen).
        self._seen: dict[str, float] = {}
        self._synced: set[str] = set()  # packs whose directory entry is known durable
        self._midx_read = False  # whether the combined index was read (at the first listing)
        self._midx_covers: set[str] = set()  # the packs the combined index on disk covers

    # --- the pack cache ----------------------------------------------------------------

    def _refresh(self) -> None:
        """List ``packs/`` again: load new packs' indexes, forget packs that are gone."""
        # The listing is taken under the lock: a pack this process registers after writing
        # it is in any listing taken later, so a concurrent refresh never forgets it.
        with self._lock:
            try:
                names = os.listdir(self.packs_dir)
            except FileNotFoundError:
                names = []
            current = {base for n in names if (base := _pack_base(n)) is not None}
            cached: dict[str, Index] = {}
            if not self._midx_read:
                self._midx_read = True
                cached = self._read_midx()
                self._midx_covers = set(cached)
            gone = self._indexes.keys() - current
            for name in gone:
                del self._indexes[name]
                self._seen.pop(name, None)
                self._synced.discard(name)
            if gone:  # a hash may also sit in a pack that remains: rebuild the map
                self._where = {h: n for n, index in self._indexes.items() for h in index}
            for name in current - self._indexes.keys():
                index = cached.get(name)
                if index is None:
                    index = self._load_index(name)
                self._indexes[name] = index
                for h in index:
                    self._where.setdefault(h, name)

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
            uncovered = len(self._indexes.keys() - self._midx_covers)
            if uncovered < max(_MIDX_EVERY, len(self._midx_covers) // 4):
                return
            indexes = dict(self._indexes)
            self._midx_covers = set(indexes)
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
        for candidate in (name, _TRASH + name):
            try:
                return os.open(os.path.join(self.packs_dir, candidate), _READ)
            except OSError as exc:
                if not (is_missing(exc) or exc.errno == errno.ELOOP):
                    raise
        return None

    def _register(self, name: str, index: Index, now: float) -> None:
        with self._lock:
            self._indexes[name] = index
            for h in index:
                self._where[h] = name
            self._seen[name] = now
            self._synced.add(name)

    # --- writing ------------------------------------------------------------------------

    def put(self, split: SplitResult) -> None:
        """Make every blob ``split`` references durable and recent enough (see module doc)."""
        now = time.time()
        half = self.grace / 2
        self._refresh()
        wanted = list(split.children)
        new: list[bytes] = []
        relied: dict[str, list[bytes]] = {}
        for h in wanted:
            name = self._where.get(h)
            if name is None:
                new.append(h)
            else:
                relied.setdefault(name, []).append(h)
        unsynced = False
        for name, hashes in relied.items():
            seen = self._seen.get(name)
            if seen is not None and now - seen < half:
                unsynced = unsynced or name not in self._synced
                continue
            if self._touch(name, now, half):
                unsynced = unsynced or name not in self._synced
            else:  # retired by a sweeper meanwhile: store these blobs again
                new.extend(hashes)
        if new:
            self.write_pack([(h, split.blobs[h]) for h in dict.fromkeys(new)], now)
        if unsynced:
            # Packs of other writers we rely on: they may have died before their own
            # directory fsync (ours above, if any, covered them too).
            if not new:
                self._fsync_packs_dir()
            with self._lock:
                self._synced.update(relied)
        self._update_midx()

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
            self._seen[name] = mtime
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
                fd = self._os.open(tmp, _NEW, 0o600, dir_fd=tfd)
                try:
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[self._os.write(fd, view) :]
                        self._os.fsync(fd)
                    finally:
                        self._os.close(fd)
                    self._os.rename(tmp, name, src_dir_fd=tfd, dst_dir_fd=pfd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=tfd)
                    raise
                self._os.fsync_dir(pfd)
            finally:
                os.close(pfd)
        finally:
            os.close(tfd)
        index: Index = {}
        offset = len(_MAGIC)
        for h, blob in blobs:
            index[h] = (offset, len(blob))
            offset += len(blob)
        self._register(name, index, now)
        return name

    def _fsync_packs_dir(self) -> None:
        fd = self._open_dir(PACKS)
        try:
            self._os.fsync_dir(fd)
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
        """The stored blobs among ``hashes``; missing or unreadable ones are left out.

        Blobs are read pack by pack, nearby ranges with one ``pread``; a hash the cached
        indexes do not know makes one new listing of ``packs/``, then a look for a
        format-2 blob file.
        """
        out: dict[bytes, bytes] = {}
        missing = self._read_packs(hashes, out)
        if missing:
            self._refresh()
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
            data = self._read(os.path.join(shard, _TRASH + hexname))
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
            old_packs = self._list_packs(cutoff)
            marked = self._mark(_roots(workflows_dir))
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
            if name.startswith(_TRASH) and _pack_base(name) is not None:
                with contextlib.suppress(FileNotFoundError):
                    self._os.rename(
                        os.path.join(self.packs_dir, name),
                        os.path.join(self.packs_dir, name[len(_TRASH) :]),
                        src_dir_fd=None,
                        dst_dir_fd=None,
                    )
        self._refresh()
        old = []
        for name, index in list(self._indexes.items()):
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
            got = self.read_blobs(name, list(live))
            if len(got) != len(live):
                continue  # unreadable or damaged: leave the pack as it is
            for h, blob in got.items():
                if h not in copied:
                    copied[h] = blob
                    size += len(blob)
            done.append((name, count - len(live)))
        if not done:
            return 0
        self.write_pack(list(copied.items()), time.time())
        return sum(dead for name, dead in done if self._retire(name, cutoff))

    def _retire(self, name: str, cutoff: float) -> bool:
        """Delete pack ``name`` unless a writer touched it since ``cutoff``."""
        path = os.path.join(self.packs_dir, name)
        trash = os.path.join(self.packs_dir, _TRASH + name)
        try:
            self._os.rename(path, trash, src_dir_fd=None, dst_dir_fd=None)
        except FileNotFoundError:
            return False
        # A writer may have touched it between the listing and the rename.
        if os.stat(trash, follow_symlinks=False).st_mtime >= cutoff:
            self._os.rename(trash, path, src_dir_fd=None, dst_dir_fd=None)
            return False
        os.unlink(trash)
        with self._lock:
            self._indexes.pop(name, None)
            self._seen.pop(name, None)
            self._synced.discard(name)
            self._where = {h: n for n, idx in self._indexes.items() for h in idx}
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
