"""Incremental checkpoints: a state stored as a tree of content-addressed blobs.

This module is backend-independent. It turns a storable state (the output of
:func:`~aiocheckpoint.serde.to_storable`) into a small *root* plus *blobs* keyed by the
(truncated) SHA-256 hash of their encoded bytes, and back. Unchanged sub-trees hash to the
same blobs, so a store that keeps each blob once pays only for what changed between
checkpoints. Long lists and dicts are cut at content-defined boundaries and indexed
hierarchically, so that appending to a list rewrites its last chunk and O(log n) small
index nodes.

Node format (the bytes that are hashed)::

    b"V" | n: u32 BE | n child hashes | n offsets: u32 BE | UTF-8 JSON text
    b"L" | child hashes            a list: the concatenation of its children's lists
    b"D" | child hashes            a dict: its children's entries, in order

In a ``V`` node every reference sits *out of band*: the JSON text holds the placeholder
``null`` where child ``i`` goes, and offset ``i`` (in bytes) says where that is, so no
user value can ever be mistaken for a reference and nothing needs escaping. A reader splices
the children's texts in at the offsets and parses the whole state with one ``json.loads``.
A *stored* blob is one flags byte (bit 0: the rest is a zstd frame) and the node bytes.

The version-2 record (see :func:`encode_checkpoint_v2`) keeps the version-1 header and
carries the checkpoint's fields plus the root node (and, when the fast encoder cut the
state, the CRC-32 of its whole text, which a reader checks instead of hashing every leaf);
:func:`decode_checkpoint_v2` reads records of both versions. ``docs/incremental.md``
describes the format, the garbage collection scheme and the write ordering backends must
follow.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import operator
import struct
import zlib
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import orjson

from .errors import CheckpointCorruptedError, CheckpointSerializationError, InvalidArgumentError
from .models import Checkpoint
from .serde import (
    _BIG_INT_BITS,
    HEADER_SIZE,
    MAGIC,
    _build,
    _dumps,
    _int_to_decimal,
    _loads,
    check_owner,
    decode_checkpoint,
)
from .storage.base import DEFAULT_MAX_RECORD_BYTES

__all__ = [
    "FORMAT_VERSION_2",
    "AsyncFetch",
    "Fetch",
    "SplitMemory",
    "SplitResult",
    "TreeParams",
    "adecode_checkpoint_v2",
    "ajoin_state",
    "areferenced_hashes",
    "decode_checkpoint_v2",
    "encode_checkpoint_v2",
    "join_state",
    "node_children",
    "record_format_version",
    "record_root_refs",
    "recovered_memory",
    "referenced_hashes",
    "split_state",
]

FORMAT_VERSION_2: Final = 2

#: ``fetch(hashes) -> {hash: stored blob}``; called once per tree level. Missing keys mean
#: missing blobs.
Fetch = Callable[[Collection[bytes]], Mapping[bytes, bytes]]
#: The async form of :data:`Fetch`.
AsyncFetch = Callable[[Collection[bytes]], Awaitable[Mapping[bytes, bytes]]]

_T = TypeVar("_T")
_Steps = Generator[list[bytes], Mapping[bytes, bytes], _T]
_Refs = list[tuple[int, bytes]]
_NO_REFS: Final[_Refs] = []
_NO_HASHES: Final[list[bytes]] = []
_LEAF: Final = b"V\x00\x00\x00\x00"  # the head of a value node without references
_PLAIN_LEAF: Final = b"\x00" + _LEAF  # ... and of its stored form, uncompressed

_HEADER = struct.Struct(">4sBBHQI")
_V2_PREFIX = struct.Struct(">IB")  # meta JSON length, digest size
_COUNT = struct.Struct(">I")
_FLAG_ZSTD: Final = 0x01
_KIND_VALUE: Final = 0x56  # "V"
_KIND_LIST: Final = 0x4C  # "L"
_KIND_DICT: Final = 0x44  # "D"
_REF_WEIGHT: Final = 20  # what one reference adds to a node: hash and offset, roughly
_MIX: Final = 0x9E3779B1

# SHA-256 rather than BLAKE2b: with SHA-NI it hashes ~1.2 GB/s here against ~180 MB/s for
# hashlib's BLAKE2b, and every node is hashed on every write (and on reads of records
# without a text checksum: docs/incremental.md).
_sha256 = hashlib.sha256
_encode_str: Callable[[str], str] = json.encoder.encode_basestring


@dataclass(frozen=True, slots=True)
class TreeParams:
    """How states are cut into blobs. Only ``digest_size`` matters to readers.

    The other values decide where boundaries fall; changing them keeps every store readable
    but shares fewer blobs with what was written before the change.
    """

    #: A value whose JSON encoding is longer than this (in characters) becomes its own node.
    inline_limit: int = 2048
    #: A state whose whole encoding fits in this many bytes is kept in the root, no blobs.
    root_inline_limit: int = 8192
    #: Content-defined chunking of long containers: minimum, average and maximum chunk size.
    #: Containers up to ``2 * chunk_avg`` are one node; longer ones are cut.
    chunk_min: int = 128
    chunk_avg: int = 1024
    chunk_max: int = 16384
    #: Consecutive chunks are grouped into content-defined regions of ``bundle_chunks``
    #: chunks on average and at most ``bundle_max`` bytes; a region of new data is stored
    #: as one blob, an edited one as a blob per chunk (see :class:`SplitMemory`).
    #: ``bundle_chunks=1`` stores every chunk on its own.
    bundle_chunks: int = 16
    bundle_max: int = 32768
    #: Children per index node: minimum, average and maximum.
    fanout_min: int = 4
    fanout_avg: int = 16
    fanout_max: int = 256
    #: Length in bytes of the truncated SHA-256 digest that names a node (16 to 32).
    digest_size: int = 16
    #: ``None`` or ``"zstd"`` (needs the ``zstandard`` package: ``aiocheckpoint[zstd]``).
    compression: str | None = None
    zstd_level: int = 3

    def __post_init__(self) -> None:
        if not 16 <= self.digest_size <= 32:
            raise InvalidArgumentError(f"digest_size must be 16..32, got {self.digest_size}")
        if not 0 < self.chunk_min <= self.chunk_avg <= self.chunk_max:
            raise InvalidArgumentError("need 0 < chunk_min <= chunk_avg <= chunk_max")
        if self.bundle_chunks < 1 or self.bundle_max < self.chunk_max:
            raise InvalidArgumentError("need bundle_chunks >= 1 and bundle_max >= chunk_max")
        if not 2 <= self.fanout_min <= self.fanout_avg <= self.fanout_max:
            raise InvalidArgumentError("need 2 <= fanout_min <= fanout_avg <= fanout_max")
        if self.inline_limit < 16 or self.root_inline_limit < 0:
            raise InvalidArgumentError("inline_limit must be >= 16, root_inline_limit >= 0")
        if self.compression not in (None, "zstd"):
            raise InvalidArgumentError(
                f"compression must be None or 'zstd', not {self.compression!r}"
            )
        if self.compression == "zstd":
            _zstd()


DEFAULT_PARAMS: Final = TreeParams()


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - zstandard is installed in development
        raise ImportError(
            "zstd compression of checkpoint blobs needs the zstandard package: "
            "pip install 'aiocheckpoint[zstd]'"
        ) from exc
    return zstandard


class SplitMemory:
    """What a split remembers for the next split of the same workflow's state.

    Regions of chunks (see :attr:`TreeParams.bundle_chunks`) are stored as one blob while
    their data is new and one blob per chunk once edited; the next split reads here which
    form each region took, so that unchanged regions keep it (and their blobs are shared)
    and edited ones are cut finer. It holds small integers (a checksum per region and two
    per region's first and last entries), never state. Losing it costs sharing, not
    correctness: a split without it bundles every region of several chunks.
    """

    __slots__ = ("edges", "first_chunks", "regions")

    def __init__(self) -> None:
        #: Region fingerprint -> whether the region was stored as one blob.
        self.regions: dict[int, bool] = {}
        #: Boundary checksums of the first and last entries of every region.
        self.edges: set[int] = set()
        #: Filled by a split made without a previous memory: region fingerprint -> the hash
        #: its first chunk has as a blob of its own. A store that holds that blob stored the
        #: region cut into chunks (:func:`recovered_memory`).
        self.first_chunks: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.regions) + len(self.edges) + len(self.first_chunks)


def recovered_memory(memory: SplitMemory, stored: Collection[bytes]) -> SplitMemory | None:
    """The memory a split without one should have had, given which first chunks are stored.

    ``memory`` comes from a split made with ``previous=None``; ``stored`` holds the hashes
    among its ``first_chunks`` values that the store has. A region whose first chunk is
    stored was written cut into chunks before and is cut again; the others stay bundled.
    None when nothing would change (no first chunk stored): the split stands as it is.
    """
    cut = {key for key, h in memory.first_chunks.items() if h in stored}
    if not cut:
        return None
    recovered = SplitMemory()
    recovered.regions = {key: key not in cut for key in memory.first_chunks}
    return recovered


@dataclass(frozen=True, slots=True)
class SplitResult:
    """A state cut into a root and content-addressed blobs.

    ``blobs`` maps each hash to its stored bytes (nodes listed in ``known`` are left out);
    ``children`` maps every node of the tree, root excluded, to the distinct hashes it
    references directly, which is what reference counting needs; ``root_refs`` are the
    hashes the root references directly.
    """

    root: bytes
    blobs: dict[bytes, bytes]
    children: dict[bytes, tuple[bytes, ...]]
    root_refs: tuple[bytes, ...]
    #: CRC-32 of the state's whole JSON text as a reader rebuilds it (what the record keeps
    #: as ``state.text_crc32``), or None when the exact encoder ran or nothing was cut.
    text_crc: int | None = None
    #: What to pass as ``previous`` to the next split of the same workflow's state.
    memory: SplitMemory | None = field(default=None, compare=False, repr=False)

    @property
    def referenced(self) -> frozenset[bytes]:
        """Every blob hash the root references, transitively."""
        return frozenset(self.children)


# -- splitting ------------------------------------------------------------------------------


def _scalar_text(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value) if value.bit_length() <= _BIG_INT_BITS else _int_to_decimal(value)
    if kind is float:
        if value != value:
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if value is None:
        return "null"
    raise CheckpointSerializationError(
        "state", f"values of type {kind.__qualname__} are not storable (use to_storable first)"
    )


# A value (or a container's entry, ``"key":value``) encoded: its UTF-8 JSON text and the
# references inside it as (byte offset of the ``null`` placeholder, hash).
_Encoded = tuple[bytes, _Refs]
# A split step: yields (nothing) between slices of work, returns its result.
_Work = Generator[None, None, _T]

# How many bytes of JSON text a cooperative split handles between two yields: ~0.1-0.2 ms of
# CPU here (docs/incremental.md, "Where the split runs").
_SLICE_BYTES: Final = 32 * 1024

# orjson, refusing what it would encode differently from serde's exact encoder: values of
# other types raise TypeError (as do ints beyond 64 bits), and the caller falls back to it.
_fast_dumps: Final = functools.partial(
    orjson.dumps,
    option=orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS,
)


def _finish(work: _Work[_T]) -> _T:
    """Run split work to its end in one go."""
    try:
        while True:
            next(work)
    except StopIteration as stop:
        result: _T = stop.value
        return result


class _Splitter:
    __slots__ = (
        "_budget",
        "_digest",
        "_known",
        "_zc",
        "blobs",
        "children",
        "memory",
        "p",
        "previous",
        "text_crc",
    )

    def __init__(
        self, params: TreeParams, known: Collection[bytes], previous: SplitMemory | None
    ) -> None:
        self.p = params
        self.previous = previous
        self.memory = SplitMemory()
        self._digest = params.digest_size
        self._known = known
        self._budget = _SLICE_BYTES
        self.blobs: dict[bytes, bytes] = {}
        self.children: dict[bytes, tuple[bytes, ...]] = {}
        self.text_crc: int | None = None
        self._zc: Any = (
            _zstd().ZstdCompressor(level=params.zstd_level) if params.compression else None
        )

    def encode(self, value: Any) -> _Encoded:
        """The exact encoder: any storable value (NaN, infinities, ints of any size)."""
        kind = type(value)
        if kind is dict:
            if not value:
                return b"{}", _NO_REFS
            texts: list[bytes] = []
            refmap: dict[int, _Refs] = {}
            for key, item in value.items():
                head = (_encode_str(key) + ":").encode()
                text, refs = self.encode(item)
                if refs:
                    shift = len(head)
                    refmap[len(texts)] = [(off + shift, h) for off, h in refs]
                texts.append(head + text)
            return self._kept(texts, refmap, True)
        if kind is list:
            if not value:
                return b"[]", _NO_REFS
            texts, refmap = [], {}
            for item in value:
                text, refs = self.encode(item)
                if refs:
                    refmap[len(texts)] = refs
                texts.append(text)
            return self._kept(texts, refmap, False)
        text = _scalar_text(value).encode()
        if len(text) > self.p.inline_limit:
            return b"null", [(0, self.value_node(text, _NO_REFS))]
        return text, _NO_REFS

    def _kept(self, texts: list[bytes], refmap: dict[int, _Refs], is_dict: bool) -> _Encoded:
        """A container whose element texts are all at hand (the exact encoder's)."""

        def chunk(start: int, end: int, head: bytes) -> _Encoded:
            return _join_entries(texts, refmap, start, end, is_dict, head)

        def mix(i: int) -> int:
            return _mix(zlib.crc32(texts[i]), refmap.get(i))

        return _finish(self._container(list(map(len, texts)), refmap, mix, chunk, is_dict))

    def encode_fast(self, value: Any, text: bytes | None, top: bool = False) -> _Work[_Encoded]:
        """The fast encoder, for values without non-finite floats or ints beyond 64 bits.

        ``text`` is ``_fast_dumps(value)``, or None when not encoded yet (the root, whose
        whole encoding would be thrown away). Every sub-tree that fits is encoded by one
        orjson call, so the Python-level work is per element of a large container, not per
        value. An element's own text is only measured and checksummed (for the boundaries)
        and then dropped: each chunk is encoded again by one orjson call over its slice of
        the container, which is what its node holds, so only one buffer per node stays
        alive (many small buffers kept alive cost several times more to allocate here).
        Yields every ``_SLICE_BYTES`` of text. ``top`` (the root) also sets ``text_crc``,
        chained over the element texts at hand, so the whole text is never built.
        """
        limit = self.p.inline_limit
        is_dict = type(value) is dict
        if not is_dict and type(value) is not list and type(value) is not tuple:
            if text is None:
                text = _fast_dumps(value)
            if top:
                self.text_crc = zlib.crc32(text)
            if len(text) <= limit:
                return text, _NO_REFS
            return b"null", [(0, self.value_node(text, _NO_REFS))]
        elements: list[Any] = list(value.items()) if is_dict else list(value)
        lens: list[int] = []
        mixes: list[int] = []
        kept: dict[int, bytes] = {}  # entry texts that hold references
        refmap: dict[int, _Refs] = {}
        whole = zlib.crc32(b"{" if is_dict else b"[") if top else 0
        for i, element in enumerate(elements):
            if is_dict:
                key = _fast_dumps(element[0])
                item = _fast_dumps(element[1])
                crc = zlib.crc32(item, zlib.crc32(b":", zlib.crc32(key)))
                size = len(key) + 1 + len(item)
            else:
                item = _fast_dumps(element)
                crc = zlib.crc32(item)
                size = len(item)
            if top:
                if i:
                    whole = zlib.crc32(b",", whole)
                if is_dict:
                    whole = zlib.crc32(b":", zlib.crc32(key, whole))
                whole = zlib.crc32(item, whole)
            if len(item) > limit:
                inner, refs = yield from self.encode_fast(element[1] if is_dict else element, item)
                if is_dict:
                    shift = len(key) + 1
                    refs = [(off + shift, h) for off, h in refs]
                    inner = b"".join((key, b":", inner))
                refmap[i] = refs
                kept[i] = inner
                crc = zlib.crc32(inner)
                size = len(inner)
            lens.append(size)
            mixes.append(_mix(crc, refmap.get(i)))
            self._budget -= size
            if self._budget < 0:
                self._budget = _SLICE_BYTES
                yield
        if top:
            self.text_crc = zlib.crc32(b"}" if is_dict else b"]", whole)

        def chunk(start: int, end: int, head: bytes) -> _Encoded:
            if not refmap or not any(i in refmap for i in range(start, end)):
                part = elements[start:end]
                return b"".join((head, _fast_dumps(dict(part) if is_dict else part))), _NO_REFS
            texts: list[bytes] = []
            for i in range(start, end):
                entry = kept.get(i)
                if entry is None:
                    entry = (
                        b"".join((_fast_dumps(elements[i][0]), b":", _fast_dumps(elements[i][1])))
                        if is_dict
                        else _fast_dumps(elements[i])
                    )
                texts.append(entry)
            return _join_entries(
                texts,
                {i - start: r for i, r in refmap.items() if start <= i < end},
                0,
                end - start,
                is_dict,
                head,
            )

        return (yield from self._container(lens, refmap, mixes.__getitem__, chunk, is_dict))

    def _container(
        self,
        lens: list[int],
        refmap: dict[int, _Refs],
        mix: Callable[[int], int],
        chunk: Callable[[int, int, bytes], _Encoded],
        is_dict: bool,
    ) -> _Work[_Encoded]:
        """Encode a container of ``len(lens)`` elements: inline, one node, or chunked.

        ``lens[i]`` is element ``i``'s text length, ``refmap[i]`` its references, ``mix(i)``
        the checksum that decides boundaries, and ``chunk(start, end, head)`` the text of
        elements ``start:end`` as a container, after ``head``. Chunks are grouped into
        regions, each stored as one node or one node per chunk (:meth:`_region`).
        """
        p = self.p
        n = len(lens)
        # What the container costs in a node: its text plus what its references take.
        size = n + 1 + sum(lens) + _REF_WEIGHT * sum(map(len, refmap.values()))
        if size <= p.inline_limit:
            return chunk(0, n, b"")
        if size <= 2 * p.chunk_avg:
            # Too small to be worth cutting: one node. A container that grows past this
            # is cut once; from then on its boundaries are stable.
            return b"null", [(0, self._chunk_node(refmap, chunk, 0, n))]
        chunks: list[bytes] = []
        chunk_min, chunk_avg, chunk_max = p.chunk_min, p.chunk_avg, p.chunk_max
        bundle, bundle_max = p.bundle_chunks, p.bundle_max
        # Chunks are grouped into regions (their ends: content-defined too, a subset of
        # the chunk ends); a region becomes one node or one per chunk (see _region).
        region: list[int] = [0]  # the region's chunk ends, after its start
        start = size = region_size = 0
        for i in range(n):
            weight = lens[i] + 1
            if refmap:
                refs = refmap.get(i)
                if refs:
                    weight += _REF_WEIGHT * len(refs)
            size += weight
            if size < chunk_max and (size < chunk_min or mix(i) % chunk_avg >= weight):
                continue
            if region_size and region_size + size > bundle_max:
                self._region(region, refmap, mix, chunk, chunks)
                region, region_size = [start], 0
            region.append(i + 1)
            region_size += size
            self._budget -= size
            start, size = i + 1, 0
            if bundle == 1 or region_size >= bundle_max or (mix(i) // chunk_avg) % bundle == 0:
                self._region(region, refmap, mix, chunk, chunks)
                region = [i + 1]
                region_size = 0
                if self._budget < 0:
                    self._budget = _SLICE_BYTES
                    yield
        if start < n:
            if region_size and region_size + size > bundle_max:
                self._region(region, refmap, mix, chunk, chunks)
                region = [start]
            region.append(n)
        if len(region) > 1:
            self._region(region, refmap, mix, chunk, chunks)
        return b"null", [(0, self._index(chunks, _KIND_DICT if is_dict else _KIND_LIST))]

    def _region(
        self,
        ends: list[int],
        refmap: dict[int, _Refs],
        mix: Callable[[int], int],
        chunk: Callable[[int, int, bytes], _Encoded],
        out: list[bytes],
    ) -> None:
        """Append the nodes of the region of chunks ``ends[0]:ends[1]``, ... to ``out``.

        A region of several chunks is one node (a *bundle*: fewer, larger nodes make a
        large state's resume cheaper) when its data is new, and one node per chunk when it
        is an edited version of a region the previous save of the same workflow held
        (``previous``): a list that grows at its end, or one entry edited in place, then
        rewrites one chunk, not the region. A region kept unchanged keeps the form it had.
        Only the blobs' sizes and sharing depend on this, never what a reader rebuilds.
        """
        first, last = ends[0], ends[-1]
        head, tail = mix(first), mix(last - 1)
        whole = True
        if len(ends) > 2:
            key = hash(tuple(map(mix, range(first, last))))
            previous = self.previous
            if previous is not None:
                kept = previous.regions.get(key)
                # Not kept as it was: an edited region still starts or ends as before.
                whole = (
                    kept
                    if kept is not None
                    else head not in previous.edges and tail not in previous.edges
                )
            self.memory.regions[key] = whole
            if previous is None:
                self.memory.first_chunks[key] = self._chunk_node(
                    refmap, chunk, first, ends[1], keep=False
                )
        self.memory.edges.update((head, tail))
        if whole:
            out.append(self._chunk_node(refmap, chunk, first, last))
        else:
            out.extend([self._chunk_node(refmap, chunk, a, b) for a, b in itertools.pairwise(ends)])

    def _index(self, hashes: list[bytes], kind: int) -> bytes:
        p = self.p
        head = bytes((0, kind))
        while len(hashes) > 1:
            groups: list[list[bytes]] = []
            current: list[bytes] = []
            for h in hashes:
                current.append(h)
                n = len(current)
                if n >= p.fanout_max or (
                    n >= p.fanout_min and int.from_bytes(h[-4:], "big") % p.fanout_avg == 0
                ):
                    groups.append(current)
                    current = []
            if current:
                groups.append(current)
            hashes = [g[0] if len(g) == 1 else self._add(head + b"".join(g), g) for g in groups]
        return hashes[0]

    def _chunk_node(
        self,
        refmap: dict[int, _Refs],
        chunk: Callable[[int, int, bytes], _Encoded],
        start: int,
        end: int,
        keep: bool = True,
    ) -> bytes:
        """The hash of the node of elements ``start:end``, kept (unless known) if ``keep``."""
        if refmap and any(i in refmap for i in range(start, end)):
            text, refs = chunk(start, end, b"")
            if keep:
                return self.value_node(text, refs)
            node: bytes | memoryview = _value_node(text, refs)
        else:
            # No references: build the stored blob in one piece.
            blob = chunk(start, end, _PLAIN_LEAF)[0]
            if keep:
                return self._add(blob, _NO_HASHES)
            node = memoryview(blob)[1:]
        return _sha256(node).digest()[: self._digest]

    def value_node(self, text: bytes, refs: _Refs) -> bytes:
        if not refs:
            return self._add(b"".join((_PLAIN_LEAF, text)), _NO_HASHES)
        return self._add(b"\x00" + _value_node(text, refs), [h for _, h in refs])

    def _add(self, blob: bytes, hashes: list[bytes]) -> bytes:
        """Name ``blob`` (a zero flags byte + a node) and keep it unless it is known."""
        node = memoryview(blob)[1:]
        h = _sha256(node).digest()[: self._digest]
        if h not in self.children:
            self.children[h] = tuple(dict.fromkeys(hashes)) if hashes else ()
            if h not in self._known:
                self.blobs[h] = blob if self._zc is None else self.wrap(node)
        return h

    def wrap(self, node: bytes | memoryview) -> bytes:
        if self._zc is not None and len(node) > 64:
            packed: bytes = self._zc.compress(node)
            if len(packed) + 8 < len(node):
                return bytes((_FLAG_ZSTD,)) + packed
        return b"\x00" + node


def _value_node(data: bytes, refs: _Refs) -> bytes:
    n = len(refs)
    if not n:
        return _LEAF + data
    return b"".join(
        (
            b"V",
            _COUNT.pack(n),
            *[h for _, h in refs],
            struct.pack(f">{n}I", *[off for off, _ in refs]),
            data,
        )
    )


def _mix(crc: int, refs: _Refs | None) -> int:
    """The boundary checksum of an element: CRC-32 of its text (``crc``) and child hashes."""
    if refs:
        for _, h in refs:
            crc = zlib.crc32(h, crc)
    return ((crc * _MIX) & 0xFFFFFFFF) >> 8


def _join_entries(
    texts: list[bytes],
    refmap: dict[int, _Refs] | None,
    start: int,
    end: int,
    is_dict: bool,
    head: bytes = b"",
) -> _Encoded:
    """The container text of ``texts[start:end]`` (after ``head``) and its references."""
    opening, closing = (b"{", b"}") if is_dict else (b"[", b"]")
    body = texts[start] if end - start == 1 else b",".join(texts[start:end])
    if not refmap:
        return b"".join((head, opening, body, closing)), _NO_REFS
    refs: _Refs = []
    pos = 1
    for i in range(start, end):
        sub = refmap.get(i)
        if sub:
            refs.extend([(pos + off, h) for off, h in sub])
        pos += len(texts[i]) + 1
    return b"".join((head, opening, body, closing)), refs


def _exceeds(value: Any, limit: int) -> bool:
    """Whether the JSON text of ``value`` is surely longer than ``limit`` characters.

    Counts a lower bound and stops as soon as it passes ``limit``, so that a large state
    is not encoded whole just to learn that it does not fit in the root.
    """
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            total += len(item) + 2
        elif kind is dict:
            total += 1 + 3 * len(item)
            for key in item:
                total += len(key)
            stack.extend(item.values())
        elif kind is list:
            total += 1 + len(item)
            stack.extend(item)
        else:
            total += 1
        if total > limit:
            return True
    return False


def split_state(
    data: Any,
    params: TreeParams = DEFAULT_PARAMS,
    *,
    known: Collection[bytes] = (),
    finite: bool = False,
    previous: SplitMemory | None = None,
) -> SplitResult:
    """Cut a storable value into a root and content-addressed blobs.

    ``data`` must be what :func:`~aiocheckpoint.serde.to_storable` returns. Values whose
    encoding is longer than ``params.inline_limit`` become blobs; a value whose whole
    encoding fits in ``params.root_inline_limit`` bytes is kept in the root with no blobs.
    Blobs whose hash is in ``known`` (already stored) are not encoded again and are left
    out of ``blobs``. ``finite=True`` promises that no float in ``data`` is NaN or infinite
    (as :func:`~aiocheckpoint.serde.storable_copy` reports), which allows a several times
    faster encoder. ``previous`` is the :attr:`SplitResult.memory` of the previous split
    of the same value's history (it changes which blobs are made, never the value).
    Raises :class:`CheckpointSerializationError` for unstorable values.
    """
    return _finish(_split(data, params, known, previous, inline=True, finite=finite))


def _split(
    data: Any,
    params: TreeParams,
    known: Collection[bytes],
    previous: SplitMemory | None,
    *,
    inline: bool,
    finite: bool,
) -> _Work[SplitResult]:
    splitter = _Splitter(params, known, previous)
    limit = params.root_inline_limit
    small = inline and limit and not _exceeds(data, limit)
    try:
        if finite:
            try:
                if small:
                    body = _fast_dumps(data)
                    if len(body) <= limit:
                        return SplitResult(splitter.wrap(_LEAF + body), {}, {}, ())
                encoded, refs = yield from splitter.encode_fast(data, None, top=True)
            except TypeError:  # an int beyond 64 bits, or not storable: the exact encoder
                splitter, finite = _Splitter(params, known, previous), False
        if not finite:
            if small:
                body = _dumps(data, False)  # exact: NaN, big ints stay as they are
                if len(body) <= limit:
                    return SplitResult(splitter.wrap(_LEAF + body), {}, {}, ())
            encoded, refs = splitter.encode(data)
        root = _value_node(encoded, refs)
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, CheckpointSerializationError):
            raise
        raise CheckpointSerializationError("state", str(exc)) from exc
    return SplitResult(
        splitter.wrap(root),
        splitter.blobs,
        splitter.children,
        tuple(dict.fromkeys(h for _, h in refs)),
        splitter.text_crc,
        splitter.memory,
    )


# -- reading ---------------------------------------------------------------------------------


def _corrupt(reason: str) -> CheckpointCorruptedError:
    return CheckpointCorruptedError(reason)


class _Unwrapper:
    """Undoes :meth:`_Splitter.wrap`, sharing one zstd decompressor per read."""

    __slots__ = ("_zd",)

    def __init__(self) -> None:
        self._zd: Any = None

    def __call__(self, stored: bytes) -> bytes:
        if not stored:
            raise _corrupt("empty blob")
        flags = stored[0]
        if flags == 0:
            return stored[1:]
        if flags != _FLAG_ZSTD:
            raise _corrupt(f"unknown blob flags {flags:#x}")
        if self._zd is None:
            self._zd = _zstd().ZstdDecompressor()
        try:
            out: bytes = self._zd.decompress(stored[1:], max_output_size=DEFAULT_MAX_RECORD_BYTES)
        except Exception as exc:  # zstandard.ZstdError and friends
            raise _corrupt(f"undecompressable blob ({type(exc).__name__})") from exc
        return out


def _hashes(data: bytes, digest: int) -> list[bytes]:
    count, rest = divmod(len(data), digest)
    if rest:
        raise _corrupt("index node length is not a multiple of the digest size")
    if count <= _MAX_UNPACK:
        return list(_unpacker(count, digest).unpack(data))
    return [data[i : i + digest] for i in range(0, len(data), digest)]


_MAX_UNPACK: Final = 1024


@functools.lru_cache(maxsize=256)
def _unpacker(count: int, digest: int) -> struct.Struct:
    """Cuts ``count`` hashes out of a node in one call (an index node holds ~16)."""
    return struct.Struct(f"{digest}s" * count)


def _node_refs(node: bytes, digest: int) -> list[bytes]:
    kind = node[0] if node else -1
    if kind == _KIND_VALUE:
        if len(node) < 5:
            raise _corrupt("truncated value node")
        (count,) = _COUNT.unpack_from(node, 1)
        end = 5 + count * digest
        if len(node) < end + 4 * count:
            raise _corrupt("truncated value node")
        return _hashes(node[5:end], digest) if count else []
    if kind in (_KIND_LIST, _KIND_DICT):
        return _hashes(node[1:], digest)
    raise _corrupt(f"unknown node kind {kind}")


def node_children(stored: bytes, digest_size: int = 16) -> tuple[bytes, ...]:
    """The distinct hashes a stored blob (or a root) references directly.

    Backends use it to cascade reference-count decrements without decoding values.
    """
    return tuple(dict.fromkeys(_node_refs(_Unwrapper()(stored), digest_size)))


# C-level callables mapped over a tree level's blobs, so that the per-blob Python work of
# a resume is a few builtin calls rather than bytecode (docs/incremental.md, "Reading").
_is_plain_leaf: Final = operator.methodcaller("startswith", _PLAIN_LEAF)
_view: Final[Callable[[bytes], memoryview]] = memoryview
_after_flags: Final = operator.itemgetter(slice(1, None))
_digest_of: Final = operator.methodcaller("digest")
_chunk_opening: Final = operator.itemgetter(len(_PLAIN_LEAF))
_last_byte: Final = operator.itemgetter(-1)
_chunk_entries: Final = operator.itemgetter(slice(len(_PLAIN_LEAF) + 1, -1))


class _Joiner:
    """Fetches a tree level by level, verifying every node, then parses it in one go.

    The value nodes' texts are spliced together at their placeholders into one JSON
    document that a single ``json.loads`` turns into the state: the same parse the
    version-1 format does, plus a hash and a slice per node. An uncompressed leaf is kept
    as its stored blob (hashed in place, sliced once when spliced), any other node as
    ``(node, refs)``. Leaves, nearly all of a large state's nodes, are verified and
    spliced in bulk: a level's hashes by one chain of ``map`` calls, an index node's leaf
    chunks by one ``join``.
    """

    def __init__(self, digest: int, max_bytes: int) -> None:
        self._digest = digest
        self._name = operator.itemgetter(slice(0, digest))
        self._budget = max_bytes
        self._unwrap = _Unwrapper()
        self._nodes: dict[bytes, bytes | tuple[bytes, list[bytes]]] = {}

    def steps(self, root: bytes, text_crc: int | None = None) -> _Steps[Any]:
        """Fetch and verify the tree under ``root``; return the parsed state.

        With ``text_crc`` (the record's checksum of the whole text) the leaves, nearly all
        of the bytes, are not hashed one by one: the rebuilt text is checked once, and only
        a mismatch hashes every node, to name the damaged one. Nodes with references are
        hashed either way (a few per cent of a tree).
        """
        digest = self._digest
        unwrap = self._unwrap
        nodes = self._nodes
        hashed = text_crc is None
        root_node = unwrap(root)
        root_refs = _node_refs(root_node, digest)
        pending = list(dict.fromkeys(root_refs))
        while pending:
            got = yield pending
            try:
                stored = list(map(got.__getitem__, pending))
            except KeyError as exc:
                raise _corrupt(f"missing blob {bytes(exc.args[0]).hex()}") from None
            is_leaf = list(map(_is_plain_leaf, stored))
            if all(is_leaf):
                if hashed:
                    self._check_leaves(pending, stored)
                nodes.update(zip(pending, stored, strict=True))
                break  # leaves reference nothing: the tree is complete
            leaves = list(itertools.compress(pending, is_leaf))
            leaf_blobs = list(itertools.compress(stored, is_leaf))
            if hashed:
                self._check_leaves(leaves, leaf_blobs)
            nodes.update(zip(leaves, leaf_blobs, strict=True))
            level: dict[bytes, None] = {}
            for h, blob, leaf in zip(pending, stored, is_leaf, strict=True):
                if leaf:
                    continue
                node = unwrap(blob)
                value = node.startswith(_LEAF)
                # Nodes that reference others are hashed whatever the text checksum says:
                # a damaged reference must be named as such, not as the blob it misnames.
                if (hashed or not value) and _sha256(node).digest()[:digest] != h:
                    raise _corrupt(f"blob {h.hex()} does not match its hash")
                refs = _NO_HASHES if value else _node_refs(node, digest)
                nodes[h] = (node, refs)
                level.update(dict.fromkeys(refs))
            pending = [h for h in level if h not in nodes]
        if not root_refs and root_node[:1] == b"V":
            return _loads(root_node[5:])  # a small state kept whole in the root
        out: list[bytes | memoryview] = []
        try:
            self._emit(root_node, root_refs, out, 0)
        except (CheckpointCorruptedError, ValueError, TypeError, KeyError, IndexError):
            if not hashed:
                self._check_all()  # a damaged node names itself before a malformed one
            raise
        text = b"".join(out)
        del out
        if not hashed and zlib.crc32(text) != text_crc:
            self._check_all()
            raise _corrupt("state text does not match its checksum")
        return _loads(text)

    def _check_all(self) -> None:
        """Hash every node fetched so far; raise for the first that does not match."""
        for h, node in self._nodes.items():
            if isinstance(node, tuple):
                if _sha256(node[0]).digest()[: self._digest] != h:
                    raise _corrupt(f"blob {h.hex()} does not match its hash")
            else:
                self._check_leaves([h], [node])

    def _check_leaves(self, hashes: list[bytes], blobs: list[bytes]) -> None:
        """Verify uncompressed stored blobs against their hashes, in one chain of maps."""
        names = list(
            map(
                self._name,
                map(_digest_of, map(_sha256, map(_after_flags, map(_view, blobs)))),
            )
        )
        if names != hashes:
            for h, name in zip(hashes, names, strict=True):
                if name != h:
                    raise _corrupt(f"blob {h.hex()} does not match its hash")

    def _spend(self, size: int) -> None:
        self._budget -= size
        if self._budget < 0:
            raise _corrupt("tree expands beyond the record size limit")

    def _emit(
        self, node: bytes, refs: list[bytes], out: list[bytes | memoryview], inner: int
    ) -> None:
        """Append the JSON text (UTF-8) of ``node`` to ``out``.

        ``inner`` is ``ord("[")`` or ``ord("{")`` when the node is a chunk of a list or dict
        index (0 otherwise): then its brackets are left out so the chunks concatenate.
        """
        kind = node[0]
        nodes = self._nodes
        if kind != _KIND_VALUE:
            self._emit_index(kind, refs, out, inner)
            return
        n = len(refs)
        base = 5 + n * (self._digest + 4)
        end = len(node)
        self._spend(end - base)
        pos = base
        if inner:
            if end - base < 3 or node[base] != inner or node[-1] != inner + 2:  # "]" / "}"
                raise _corrupt("chunk of the wrong kind")
            pos, end = base + 1, end - 1
        view = memoryview(node)
        if n:
            offsets = struct.unpack_from(f">{n}I", node, base - 4 * n)
            for off, h in zip(offsets, refs, strict=True):
                at = base + off
                if at < pos or at + 4 > end or node[at : at + 4] != b"null":
                    raise _corrupt("reference does not point at a placeholder")
                out.append(view[pos:at])
                child = nodes[h]
                if isinstance(child, tuple):
                    self._emit(child[0], child[1], out, 0)
                else:  # a stored leaf, without a call
                    self._spend(len(child) - 6)
                    out.append(memoryview(child)[6:])
                pos = at + 4
        out.append(view[pos:end])

    def _emit_index(
        self, kind: int, refs: list[bytes], out: list[bytes | memoryview], inner: int
    ) -> None:
        """:meth:`_emit` for a list or dict index: all its leaf chunks spliced by one join."""
        opening, closing = (b"[", b"]") if kind == _KIND_LIST else (b"{", b"}")
        if inner:  # an index node is never a chunk of another index's node
            raise _corrupt("index node of the wrong kind")
        pieces: list[bytes] = []
        made: set[int] = set()
        self._collect(kind, refs, pieces, made)
        bracket = opening[0]
        leaves = pieces if not made else [p for i, p in enumerate(pieces) if i not in made]
        n = len(leaves)
        if n:
            if (
                min(map(len, leaves)) <= len(_PLAIN_LEAF) + 2
                or bytes(map(_chunk_opening, leaves)).count(bracket) != n
                or bytes(map(_last_byte, leaves)).count(bracket + 2) != n  # "]" / "}"
            ):
                raise _corrupt("chunk of the wrong kind")
            self._spend(sum(map(len, leaves)) - (len(_PLAIN_LEAF) + 2) * n)
        out.append(opening)
        if made:
            out.append(
                b",".join([p if i in made else _chunk_entries(p) for i, p in enumerate(pieces)])
            )
        elif pieces:
            # Views, not slices, with the commas between them, straight into ``out``: the
            # caller's join is the only copy of the text.
            spliced: list[bytes | memoryview] = [b","] * (2 * len(pieces) - 1)
            spliced[::2] = map(_chunk_entries, map(_view, pieces))
            out.extend(spliced)
        out.append(closing)

    def _collect(self, kind: int, refs: list[bytes], pieces: list[bytes], made: set[int]) -> None:
        """Append the chunks under index node ``refs`` to ``pieces``, in order.

        A stored leaf chunk is appended as it is, a chunk with references as its text (its
        position goes into ``made``); inner index nodes are descended into.
        """
        if not refs:
            raise _corrupt("empty index node")
        children = list(map(self._nodes.__getitem__, refs))
        if tuple not in map(type, children):  # the common case: leaf chunks only
            pieces.extend(children)  # type: ignore[arg-type]
            return
        for child in children:
            if not isinstance(child, tuple):
                pieces.append(child)
                continue
            node, sub = child
            if node[0] == kind:
                self._collect(kind, sub, pieces, made)
            elif node[0] == _KIND_VALUE:
                text: list[bytes | memoryview] = []
                self._emit(node, sub, text, b"[{"[kind == _KIND_DICT])
                made.add(len(pieces))
                pieces.append(b"".join(text))
            else:
                raise _corrupt("index node of the wrong kind")


def _drive(steps: _Steps[_T], fetch: Fetch) -> _T:
    try:
        request = next(steps)
        while True:
            request = steps.send(fetch(request))
    except StopIteration as stop:
        result: _T = stop.value
        return result


async def _adrive(steps: _Steps[_T], fetch: AsyncFetch) -> _T:
    try:
        request = next(steps)
        while True:
            request = steps.send(await fetch(request))
    except StopIteration as stop:
        result: _T = stop.value
        return result


def _guard(steps: _Steps[_T]) -> _Steps[_T]:
    """Map decoding failures inside ``steps`` to :class:`CheckpointCorruptedError`."""
    try:
        return (yield from steps)
    except CheckpointCorruptedError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise _corrupt(f"undecodable node ({type(exc).__name__})") from exc


def join_state(
    root: bytes,
    fetch: Fetch,
    *,
    digest_size: int = 16,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Any:
    """Rebuild the value :func:`split_state` cut into ``root`` and blobs.

    ``fetch`` is called once per tree level with the hashes of that level. Every blob is
    verified against its hash; a missing or mismatching blob, or a malformed node, raises
    :class:`CheckpointCorruptedError`. The result never shares objects between positions.
    """
    return _drive(_guard(_Joiner(digest_size, max_bytes).steps(root)), fetch)


async def ajoin_state(
    root: bytes,
    fetch: AsyncFetch,
    *,
    digest_size: int = 16,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Any:
    """:func:`join_state` with an async ``fetch`` (one await per tree level)."""
    return await _adrive(_guard(_Joiner(digest_size, max_bytes).steps(root)), fetch)


def _reference_steps(
    roots: Collection[bytes], digest: int, skip: Collection[bytes]
) -> _Steps[set[bytes]]:
    unwrap = _Unwrapper()
    seen: set[bytes] = set()
    if isinstance(roots, (bytes, bytearray)):  # one root rather than a collection of them
        roots = [bytes(roots)]
    pending = {h for root in roots for h in _node_refs(unwrap(root), digest) if h not in skip}
    while pending:
        got = yield list(pending)
        seen |= pending
        level: set[bytes] = set()
        for h in pending:
            stored = got.get(h)
            if stored is None:
                raise _corrupt(f"missing blob {h.hex()}")
            node = unwrap(stored)
            if _sha256(node).digest()[:digest] != h:
                raise _corrupt(f"blob {h.hex()} does not match its hash")
            level.update(_node_refs(node, digest))
        pending = {h for h in level if h not in seen and h not in skip}
    return seen


def referenced_hashes(
    roots: Collection[bytes],
    fetch: Fetch,
    *,
    digest_size: int = 16,
    skip: Collection[bytes] = (),
) -> set[bytes]:
    """Every blob hash reachable from ``roots`` (the mark phase of mark-and-sweep).

    ``roots`` are stored roots (or blobs: their descendants are returned); one root may be
    passed as plain bytes. Hashes in ``skip`` (already marked) are not descended into: a
    blob's sub-tree is immutable, so marking costs one fetch per distinct blob, not per
    checkpoint.
    """
    return _drive(_guard(_reference_steps(roots, digest_size, skip)), fetch)


async def areferenced_hashes(
    roots: Collection[bytes],
    fetch: AsyncFetch,
    *,
    digest_size: int = 16,
    skip: Collection[bytes] = (),
) -> set[bytes]:
    """:func:`referenced_hashes` with an async ``fetch``."""
    return await _adrive(_guard(_reference_steps(roots, digest_size, skip)), fetch)


# -- version-2 records -----------------------------------------------------------------------


def _meta(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "workflow_id": checkpoint.workflow_id,
        "step": checkpoint.step,
        "agent_id": checkpoint.agent_id,
        "status": checkpoint.status.value,
        "timestamp": checkpoint.timestamp.isoformat(),
        "metrics": checkpoint.metrics.model_dump(mode="json"),
        "metadata": checkpoint.metadata,
        "state": {
            "version": checkpoint.state_snapshot.version.model_dump(mode="json"),
            "metadata": checkpoint.state_snapshot.metadata,
        },
    }


def _record(meta_bytes: bytes, digest: int, root: bytes) -> bytes:
    body = b"".join((_V2_PREFIX.pack(len(meta_bytes), digest), meta_bytes, root))
    return _HEADER.pack(MAGIC, FORMAT_VERSION_2, 0, 0, len(body), zlib.crc32(body)) + body


def _meta_bytes(meta: dict[str, Any]) -> bytes:
    try:
        return _dumps(meta, False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CheckpointSerializationError("checkpoint", str(exc)) from exc


def encode_checkpoint_v2(
    checkpoint: Checkpoint,
    params: TreeParams = DEFAULT_PARAMS,
    *,
    known: Collection[bytes] = (),
    finite: bool = False,
    previous: SplitMemory | None = None,
) -> tuple[bytes, SplitResult]:
    """Encode a checkpoint as a version-2 record plus the blobs its state needs.

    A checkpoint whose JSON (state included) fits in ``params.root_inline_limit`` bytes is
    stored whole in the record, with no blobs and no root (``result.root == b""``).
    Otherwise the caller must make every blob in ``result.blobs`` durable before the
    record (see docs/incremental.md). The state must already be storable; ``finite`` and
    ``previous`` are as in :func:`split_state`.
    """
    return _finish(
        encode_v2_work(checkpoint, params, known=known, finite=finite, previous=previous)
    )


def encode_v2_work(
    checkpoint: Checkpoint,
    params: TreeParams = DEFAULT_PARAMS,
    *,
    known: Collection[bytes] = (),
    finite: bool = False,
    previous: SplitMemory | None = None,
) -> Generator[None, None, tuple[bytes, SplitResult]]:
    """:func:`encode_checkpoint_v2` as a generator that yields between slices of work.

    With ``finite=True`` each slice is ~0.1-0.2 ms of CPU, so an event loop can run the
    encoding itself, resuming the generator between its other callbacks, instead of
    handing it to a thread that would hold the GIL against the loop. Without ``finite`` the
    exact encoder runs in one slice.
    """
    meta = _meta(checkpoint)
    data = checkpoint.state_snapshot.data
    limit = params.root_inline_limit
    if limit and not _exceeds(data, limit):
        meta["state"]["data"] = data
        meta_bytes = _meta_bytes(meta)
        if len(meta_bytes) <= limit:
            return _record(meta_bytes, params.digest_size, b""), SplitResult(b"", {}, {}, ())
        del meta["state"]["data"]
    split = yield from _split(data, params, known, previous, inline=False, finite=finite)
    if split.text_crc is not None:
        meta["state"]["text_crc32"] = split.text_crc
    return _record(_meta_bytes(meta), params.digest_size, split.root), split


def record_format_version(record: bytes) -> int:
    """The format version of a record (1 or 2); bad magic raises CheckpointCorruptedError."""
    if len(record) < HEADER_SIZE or record[:4] != MAGIC:
        raise CheckpointCorruptedError("not an aiocheckpoint record (bad magic)")
    return record[4]


def _open_v2(record: bytes) -> tuple[dict[str, Any], int, bytes]:
    """Verify a version-2 record; return its metadata object, digest size and root."""
    if len(record) < HEADER_SIZE:
        raise _corrupt(f"record too short ({len(record)} bytes)")
    magic, version, flags, _reserved, length, crc = _HEADER.unpack_from(record)
    if magic != MAGIC:
        raise _corrupt("not an aiocheckpoint record (bad magic)")
    if version != FORMAT_VERSION_2 or flags != 0:
        raise _corrupt(f"not a version-2 record (version {version}, flags {flags:#x})")
    body = memoryview(record)[HEADER_SIZE:]
    if len(body) != length:
        raise _corrupt(f"body is {len(body)} bytes, header says {length}")
    if zlib.crc32(body) != crc:
        raise _corrupt("checksum mismatch")
    if length < _V2_PREFIX.size:
        raise _corrupt("truncated version-2 body")
    meta_len, digest = _V2_PREFIX.unpack_from(body)
    root_at = _V2_PREFIX.size + meta_len
    if root_at > length or not 16 <= digest <= 32:
        raise _corrupt("malformed version-2 body")
    meta = _loads(bytes(body[_V2_PREFIX.size : root_at]))
    if type(meta) is not dict or type(meta.get("state")) is not dict:
        raise _corrupt("body is not a checkpoint object")
    root = bytes(body[root_at:])
    if ("data" in meta["state"]) == bool(root):
        raise _corrupt("a record needs exactly one of an inline state and a root")
    return meta, digest, root


def record_root_refs(record: bytes) -> tuple[bytes, ...]:
    """The blob hashes a record references directly (none for version 1 or inline states).

    Backends use it to release a replaced or deleted record's references.
    """
    if record_format_version(record) == 1:
        return ()
    try:
        _meta, digest, root = _open_v2(record)
        return node_children(root, digest) if root else ()
    except (ValueError, TypeError) as exc:
        raise _corrupt(f"undecodable record ({type(exc).__name__})") from exc


def _decode_steps(record: bytes) -> _Steps[Checkpoint]:
    if record_format_version(record) == 1:
        return decode_checkpoint(record)
    meta, digest, root = _open_v2(record)
    text_crc = meta["state"].pop("text_crc32", None)
    if text_crc is not None and (type(text_crc) is not int or not 0 <= text_crc <= 0xFFFFFFFF):
        raise _corrupt("malformed text checksum")
    if root:
        joiner = _Joiner(digest, DEFAULT_MAX_RECORD_BYTES)
        meta["state"]["data"] = yield from joiner.steps(root, text_crc)
    return _build(meta)


def _checked(
    steps: _Steps[Checkpoint], workflow_id: str | None, step: int | None
) -> _Steps[Checkpoint]:
    try:
        checkpoint = yield from _guard(steps)
    except CheckpointCorruptedError as exc:
        raise CheckpointCorruptedError(exc.reason, workflow_id=workflow_id, step=step) from exc
    return check_owner(checkpoint, workflow_id, step)


def decode_checkpoint_v2(
    record: bytes,
    fetch: Fetch,
    *,
    workflow_id: str | None = None,
    step: int | None = None,
) -> Checkpoint:
    """Decode a record of format version 1 or 2, fetching blobs one tree level at a time.

    Any damage -- to the record, a missing blob, a blob that fails its hash or a state text
    that fails the record's checksum (``state.text_crc32``, which then replaces the leaves'
    hashes) -- raises :class:`CheckpointCorruptedError`, naming the damaged blob when one
    is, as does a record of another workflow or step.
    ``fetch`` is not called for version-1 records or states stored inline.
    """
    return _drive(_checked(_decode_steps(record), workflow_id, step), fetch)


async def adecode_checkpoint_v2(
    record: bytes,
    fetch: AsyncFetch,
    *,
    workflow_id: str | None = None,
    step: int | None = None,
) -> Checkpoint:
    """:func:`decode_checkpoint_v2` with an async ``fetch`` (one await per tree level)."""
    return await _adrive(_checked(_decode_steps(record), workflow_id, step), fetch)
