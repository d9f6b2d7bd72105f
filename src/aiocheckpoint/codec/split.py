"""Cutting a storable state into a root and content-addressed blobs (the writing side).

The node format is :mod:`aiocheckpoint.format.tree`'s. Unchanged sub-trees hash to the same
blobs, so a store that keeps each blob once pays only for what changed between checkpoints.
Long lists and dicts are cut at content-defined boundaries and indexed hierarchically, so
that appending to a list rewrites its last chunk and O(log n) small index nodes. Two
encoders produce the same nodes: the exact one (any storable value) and the fast one
(orjson per sub-tree, for values without non-finite floats or ints beyond 64 bits), which
yields between slices of work so that an event loop can run it (``docs/incremental.md``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import json
import math
import struct
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import orjson

from ..errors import CheckpointSerializationError
from ..format.checksum import crc32
from ..format.jsontext import BIG_INT_BITS
from ..format.tree import (
    COUNT,
    DEFAULT_PARAMS,
    KIND_DICT,
    KIND_LIST,
    LEAF,
    PLAIN_LEAF,
    SplitMemory,
    SplitResult,
    TreeParams,
)
from .compress import Compressor
from .jsontext import dumps, int_to_decimal
from .typed import SCALARS

__all__ = [
    "OFFLOAD_BYTES",
    "Job",
    "crc_work",
    "dumps_work",
    "exceeds",
    "finish",
    "job",
    "namer",
    "split_state",
    "split_work",
    "text_bound",
]

_T = TypeVar("_T")
_Refs = list[tuple[int, bytes]]
#: A node as a split named it: hash, distinct children, stored blob (None if known), the
#: length of its text once spliced, the node's length.
Node = tuple[bytes, tuple[bytes, ...], bytes | None, int, int]
#: A region as a split cut it: its memory key (None for one chunk), whether it was stored
#: whole, the boundary checksums of its first and last entries.
Region = tuple[int | None, bool, int, int]
#: One level of a container's index as far as it stays when the container grows: how
#: many of the level's hashes closed groups took, those groups' hashes and their nodes.
IndexLevel = tuple[int, tuple[bytes, ...], "NodeSet"]
#: The nodes of a list's chunks by their element range ``(start, end)``: a later cut of a
#: list that starts with the same elements makes the same node for the same range.
ChunkMemo = Mapping[tuple[int, int], Node]
_NO_REFS: Final[_Refs] = []
_NO_HASHES: Final[list[bytes]] = []
_REF_WEIGHT: Final = 20  # what one reference adds to a node: hash and offset, roughly
_MIX: Final = 0x9E3779B1

# SHA-256 rather than BLAKE2b: with SHA-NI it hashes ~1.2 GB/s here against ~180 MB/s for
# hashlib's BLAKE2b, and every node is hashed on every write (and on reads of records
# without a text checksum: docs/incremental.md).
_sha256 = hashlib.sha256
_hmac_digest = hmac.digest
_encode_str: Callable[[str], str] = json.encoder.encode_basestring


def _scalar_text(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value) if value.bit_length() <= BIG_INT_BITS else int_to_decimal(value)
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
#: A call a split step hands to its driver (:func:`finish`, or the pipeline's
#: ``cooperate``, which runs it in a worker thread) and is sent the result of.
Job = Callable[[], Any]
# A split step: yields None between slices of work, or a Job to run; returns its result.
_Work = Generator[Job | None, Any, _T]

#: Texts from this size on are hashed, checksummed and copied by jobs, not on the caller's
#: thread: hashlib, crc32 and bytes.join release the GIL for them (~1-2 ms per MB here).
OFFLOAD_BYTES: Final = 1024 * 1024

# How many bytes of JSON text a cooperative split handles between two yields: ~0.1-0.2 ms of
# CPU here (docs/incremental.md, "Where the split runs").
_SLICE_BYTES: Final = 32 * 1024
#: Lists longer than this are encoded a run of items at a time (see dumps_work).
_LIST_SLICE: Final = 64
#: The kinds of values dumps_work may slice.
_SLICED: Final = frozenset((str, list))

# orjson, refusing what it would encode differently from the exact encoder: values of
# other types raise TypeError (as do ints beyond 64 bits), and the caller falls back to it.
_fast_dumps: Final = functools.partial(
    orjson.dumps,
    option=orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS,
)


def namer(params: TreeParams) -> Callable[[bytes | memoryview], bytes]:
    """What names a node: its truncated SHA-256, or HMAC-SHA256 under ``params.name_key``.

    A keyed name (an encrypted tree's) still deduplicates equal nodes, but nobody without
    the key can tell from a name what the node holds.
    """
    digest, key = params.digest_size, params.name_key
    if key is None:
        return lambda node: _sha256(node).digest()[:digest]
    return lambda node: _hmac_digest(key, node, "sha256")[:digest]


def finish(work: _Work[_T]) -> _T:
    """Run split work to its end in one go (its jobs too, in this thread)."""
    try:
        job = next(work)
        while True:
            job = work.send(None if job is None else job())
    except StopIteration as stop:
        result: _T = stop.value
        return result


def job(call: Callable[..., _T], *args: Any) -> Generator[Job, Any, _T]:
    """Have the driver run ``call(*args)`` (in a worker thread) and return its result."""
    result: _T = yield functools.partial(call, *args)
    return result


def crc_work(text: bytes, crc: int = 0) -> Generator[Job | None, Any, int]:
    """``crc32(text, crc)``, as a job when ``text`` is large."""
    if len(text) < OFFLOAD_BYTES:
        return crc32(text, crc)
    return (yield from job(crc32, text, crc))


def dumps_work(value: Any) -> Generator[Job | None, Any, bytes]:
    """``_fast_dumps(value)``; a long string or list is encoded in slices, joined by a job.

    JSON escapes a string character by character and separates a list's items by commas,
    so the slices' texts joined are the whole value's text. One orjson call holds the GIL
    for as long as it runs (~1-2 ms per MB): a slice is about a megabyte of string, or
    about ``_SLICE_BYTES`` of a list's items.
    """
    kind = type(value)
    if kind is str and len(value) >= 2 * OFFLOAD_BYTES:
        parts = yield from _string_parts(value)
        separator = b""
    elif kind is list and len(value) > _LIST_SLICE:
        parts = yield from _list_parts(value)
        separator = b","
    else:
        return _fast_dumps(value)
    opening, closing = (b'"', b'"') if kind is str else (b"[", b"]")
    pieces = [opening, parts[0]]
    for part in itertools.islice(parts, 1, None):
        pieces += (separator, part)
    pieces.append(closing)
    return (yield from job(b"".join, pieces))


def _string_parts(value: str) -> Generator[None, Any, list[bytes]]:
    """The JSON texts of ``value``'s slices, without their quotes."""
    parts = []
    for start in range(0, len(value), OFFLOAD_BYTES):
        parts.append(_fast_dumps(value[start : start + OFFLOAD_BYTES])[1:-1])
        yield None
    return parts


def _list_parts(value: list[Any]) -> Generator[None, Any, list[bytes]]:
    """The JSON texts of runs of ``value``'s items, without their brackets."""
    parts = []
    start, count = 0, _LIST_SLICE
    while start < len(value):
        text = _fast_dumps(value[start : start + count])
        parts.append(text[1:-1])
        start += count
        # Aim the next run at about _SLICE_BYTES of text.
        count = max(1, min(4 * count, count * _SLICE_BYTES // len(text)))
        yield None
    return parts


class _Splitter:
    __slots__ = (
        "_budget",
        "_compress",
        "_known",
        "_name",
        "_wrap",
        "blob_bytes",
        "blob_max",
        "blobs",
        "children",
        "chunk_memo",
        "chunks_made",
        "levels",
        "log",
        "memory",
        "node_bytes",
        "p",
        "point",
        "previous",
        "region_log",
        "sizes",
        "text_crc",
    )

    def __init__(
        self, params: TreeParams, known: Collection[bytes], previous: SplitMemory | None
    ) -> None:
        self.p = params
        self.previous = previous
        self.memory = SplitMemory()
        self._name = namer(params)
        self._known = known
        self._budget = _SLICE_BYTES
        self.blobs: dict[bytes, bytes] = {}
        self.blob_bytes = 0  # of ``blobs`` together
        self.blob_max = 0  # the longest of ``blobs``
        self.children: dict[bytes, tuple[bytes, ...]] = {}
        self.text_crc: int | None = None
        # What a reader will hold: each node's text once spliced (by hash), and the bytes
        # of all the distinct nodes (see Joiner: it refuses more than the store's limit).
        self.sizes: dict[bytes, int] = {}
        self.node_bytes = 0
        # Every node named and every region cut, in order, repeats included, when a caller
        # keeps what each sub-tree made (codec/subtrees.py); None: nobody does.
        self.log: list[Node] | None = None
        self.region_log: list[Region] = []
        self.point: tuple[int, int, int, int] | None = None
        self.levels: list[IndexLevel] = []
        # A list's cut that resumes (codec/subtrees.py): the chunk nodes its last cut made,
        # to be taken again, and the ones this cut makes (both None: nobody keeps them).
        self.chunk_memo: ChunkMemo | None = None
        self.chunks_made: dict[tuple[int, int], Node] | None = None
        compressor = Compressor(params)
        self._compress = compressor.active
        self._wrap = compressor.wrap

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
            return _mix(crc32(texts[i]), refmap.get(i))

        return finish(self._container(list(map(len, texts)), refmap, mix, chunk, is_dict))

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
                text = yield from dumps_work(value)
            if top:
                self.text_crc = yield from crc_work(text)
            if len(text) <= limit:
                return text, _NO_REFS
            if len(text) < OFFLOAD_BYTES:
                return b"null", [(0, self.value_node(text, _NO_REFS))]
            return b"null", [(0, (yield from self.large_leaf(text)))]
        elements: list[Any] = list(value.items()) if is_dict else list(value)
        lens: list[int] = []
        mixes: list[int] = []
        kept: dict[int, bytes] = {}  # entry texts that hold references
        refmap: dict[int, _Refs] = {}
        whole = crc32(b"{" if is_dict else b"[") if top else 0
        for i, element in enumerate(elements):
            member = element[1] if is_dict else element
            if type(member) in _SLICED:
                item = yield from dumps_work(member)
            else:
                item = _fast_dumps(member)
            large = len(item) >= OFFLOAD_BYTES
            if is_dict:
                key = _fast_dumps(element[0])
                crc = crc32(b":", crc32(key))
                size = len(key) + 1 + len(item)
            else:
                crc, size = 0, len(item)
            crc = (yield from crc_work(item, crc)) if large else crc32(item, crc)
            if top:
                if i:
                    whole = crc32(b",", whole)
                if is_dict:
                    whole = crc32(b":", crc32(key, whole))
                whole = (yield from crc_work(item, whole)) if large else crc32(item, whole)
            if len(item) > limit:
                inner, refs = yield from self.encode_fast(member, item)
                if is_dict:
                    shift = len(key) + 1
                    refs = [(off + shift, h) for off, h in refs]
                    inner = b"".join((key, b":", inner))
                refmap[i] = refs
                kept[i] = inner
                crc = crc32(inner)
                size = len(inner)
            lens.append(size)
            mixes.append(_mix(crc, refmap.get(i)))
            self._budget -= size
            if self._budget < 0:
                self._budget = _SLICE_BYTES
                yield None
        if top:
            self.text_crc = crc32(b"}" if is_dict else b"]", whole)

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
        chunks: list[bytes] | None = None,
    ) -> _Work[_Encoded]:
        """Encode a container of ``len(lens)`` elements: inline, one node, or chunked.

        ``lens[i]`` is element ``i``'s text length, ``refmap[i]`` its references, ``mix(i)``
        the checksum that decides boundaries, and ``chunk(start, end, head)`` the text of
        elements ``start:end`` as a container, after ``head``. Chunks are grouped into
        regions, each stored as one node or one node per chunk (:meth:`_region`); the
        chunks' nodes are appended to ``chunks`` if given.
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
        if chunks is None:
            chunks = []
        yield from self.scan(lens, refmap, mix, chunk, 0, chunks)
        stable = 0 if self.point is None else self.point[1]
        return b"null", [(0, self.index(chunks, KIND_DICT if is_dict else KIND_LIST, (), stable))]

    def scan(
        self,
        lens: list[int],
        refmap: dict[int, _Refs],
        mix: Callable[[int], int],
        chunk: Callable[[int, int, bytes], _Encoded],
        base: int,
        chunks: list[bytes],
    ) -> _Work[None]:
        """Cut elements ``base:base + len(lens)`` into chunks, appending their nodes to ``chunks``.

        ``lens[i - base]`` is element ``i``'s text length; the other arguments index elements
        as :meth:`_container`'s. Every boundary depends only on the elements before it, so a
        scan that starts at a region's end (``base``, with the ``chunks`` made before it)
        cuts the rest as a scan from the start would. The last such end this scan passed is
        left in :attr:`point` (None if none): ``(element, len(chunks), len(log),
        len(region_log))`` there, when a caller keeps the log.
        """
        p = self.p
        n = base + len(lens)
        self.point = None
        chunk_min, chunk_avg, chunk_max = p.chunk_min, p.chunk_avg, p.chunk_max
        bundle, bundle_max = p.bundle_chunks, p.bundle_max
        # Chunks are grouped into regions (their ends: content-defined too, a subset of
        # the chunk ends); a region becomes one node or one per chunk (see _region).
        region: list[int] = [base]  # the region's chunk ends, after its start
        start, size, region_size = base, 0, 0
        for i in range(base, n):
            weight = lens[i - base] + 1
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
                if self.log is not None:
                    self.point = (i + 1, len(chunks), len(self.log), len(self.region_log))
                if self._budget < 0:
                    self._budget = _SLICE_BYTES
                    yield None
        if start < n:
            if region_size and region_size + size > bundle_max:
                self._region(region, refmap, mix, chunk, chunks)
                region = [start]
            region.append(n)
        if len(region) > 1:
            self._region(region, refmap, mix, chunk, chunks)

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
        key: int | None = None
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
        if self.log is not None:
            self.region_log.append((key, whole, head, tail))
        if whole:
            out.append(self._chunk_node(refmap, chunk, first, last))
        else:
            out.extend([self._chunk_node(refmap, chunk, a, b) for a, b in itertools.pairwise(ends)])

    def index(
        self,
        hashes: list[bytes],
        kind: int,
        resume: Sequence[IndexLevel] = (),
        stable: int = 0,
    ) -> bytes:
        """The root of the index nodes over the chunk nodes ``hashes`` of a container.

        Groups are content-defined: whether a group closes depends only on its hashes, so
        the groups closed over a prefix that did not change are taken from ``resume`` (per
        level, what :attr:`levels` held after an index of those hashes). When a caller
        keeps the log, :attr:`levels` is left holding, per level, the groups closed within
        the first ``stable`` hashes (the chunks of regions that have ended).
        """
        p = self.p
        fanout_min, fanout_avg, fanout_max = p.fanout_min, p.fanout_avg, p.fanout_max
        head = bytes((0, kind))
        log = self.log
        levels: list[IndexLevel] = []
        while len(hashes) > 1:
            taken, outs, nodes = resume[len(levels)] if len(levels) < len(resume) else _NO_LEVEL
            self.adopt_set(nodes)
            out, current, start = list(outs), [], 0 if log is None else len(log)
            kept = taken, len(outs), start
            for i in range(taken, len(hashes)):
                h = hashes[i]
                current.append(h)
                n = len(current)
                if n >= fanout_max or (
                    n >= fanout_min and int.from_bytes(h[-4:], "big") % fanout_avg == 0
                ):
                    out.append(self._index_node(head, current))
                    current = []
                    if log is not None and i < stable:
                        kept = i + 1, len(out), len(log)
            if current:
                out.append(current[0] if len(current) == 1 else self._index_node(head, current))
            if log is not None:
                closed = NodeSet(log[start : kept[2]], nodes) if kept[2] > start else nodes
                levels.append((kept[0], tuple(out[: kept[1]]), closed))
                stable = kept[1]
            hashes = out
        self.levels = levels
        return hashes[0]

    def _index_node(self, head: bytes, hashes: list[bytes]) -> bytes:
        """An index node over ``hashes``: its text is theirs without their brackets."""
        size = sum(map(self.sizes.__getitem__, hashes)) - len(hashes) + 1
        return self._add(head + b"".join(hashes), hashes, size)

    def _chunk_node(
        self,
        refmap: dict[int, _Refs],
        chunk: Callable[[int, int, bytes], _Encoded],
        start: int,
        end: int,
        keep: bool = True,
    ) -> bytes:
        """The hash of the node of elements ``start:end``, kept (unless known) if ``keep``.

        With a :attr:`chunk_memo`, a range the list's last cut made already is taken from it
        (what the open region's chunks cost at every append otherwise: each was encoded and
        hashed again); with :attr:`chunks_made`, the range's node is noted there.
        """
        if not keep or self.chunks_made is None:
            return self._make_chunk(refmap, chunk, start, end, keep)
        memo = self.chunk_memo
        node = None if memo is None else memo.get((start, end))
        if node is None:
            self._make_chunk(refmap, chunk, start, end, keep)
            log = self.log
            assert log is not None
            node = log[-1]
        else:
            self.adopt((node,), ())
        self.chunks_made[start, end] = node
        return node[0]

    def _make_chunk(
        self,
        refmap: dict[int, _Refs],
        chunk: Callable[[int, int, bytes], _Encoded],
        start: int,
        end: int,
        keep: bool,
    ) -> bytes:
        """:meth:`_chunk_node` without the memo."""
        if refmap and any(i in refmap for i in range(start, end)):
            text, refs = chunk(start, end, b"")
            if keep:
                return self.value_node(text, refs)
            node: bytes | memoryview = _value_node(text, refs)
        else:
            # No references: build the stored blob in one piece.
            blob = chunk(start, end, PLAIN_LEAF)[0]
            if keep:
                return self._add(blob, _NO_HASHES, len(blob) - len(PLAIN_LEAF))
            node = memoryview(blob)[1:]
        return self._name(node)

    def large_leaf(self, text: bytes) -> _Work[bytes]:
        """:meth:`value_node` of a large text without references: copied and hashed by jobs."""
        blob = yield from job(b"".join, (PLAIN_LEAF, text))
        name = yield from job(self._name, memoryview(blob)[1:])
        return self._add(blob, _NO_HASHES, len(text), name)

    def value_node(self, text: bytes, refs: _Refs) -> bytes:
        if not refs:
            return self._add(b"".join((PLAIN_LEAF, text)), _NO_HASHES, len(text))
        hashes = [h for _, h in refs]
        return self._add(b"\x00" + _value_node(text, refs), hashes, self.spliced(text, hashes))

    def spliced(self, text: bytes, hashes: list[bytes]) -> int:
        """The length of ``text`` once its references' texts replace their placeholders."""
        return len(text) - 4 * len(hashes) + sum(map(self.sizes.__getitem__, hashes))

    def _add(self, blob: bytes, hashes: list[bytes], size: int, name: bytes = b"") -> bytes:
        """Name ``blob`` (a zero flags byte + a node) and keep it unless it is known.

        ``size`` is the length of the node's text once its references are spliced in;
        ``name`` the blob's hash when the caller has it.
        """
        node = memoryview(blob)[1:]
        h = name or self._name(node)
        if h not in self.children:
            self.children[h] = tuple(dict.fromkeys(hashes)) if hashes else ()
            self.sizes[h] = size
            self.node_bytes += len(node)
            if h not in self._known:
                stored = self._wrap(node) if self._compress else blob
                self.blobs[h] = stored
                self.blob_bytes += len(stored)
                self.blob_max = max(self.blob_max, len(stored))
        if self.log is not None:
            self.log.append((h, self.children[h], self.blobs.get(h), size, len(node)))
        return h

    def adopt(self, nodes: Iterable[Node], regions: Iterable[Region]) -> None:
        """Take nodes and regions another split of the same sub-tree made, as it made them."""
        children, sizes, blobs = self.children, self.sizes, self.blobs
        for h, kids, blob, size, length in nodes:
            if h not in children:
                children[h] = kids
                sizes[h] = size
                self.node_bytes += length
                if blob is not None and h not in self._known:
                    blobs[h] = blob
                    self.blob_bytes += len(blob)
                    self.blob_max = max(self.blob_max, len(blob))
        memory = self.memory
        for key, whole, head, tail in regions:
            if key is not None:
                memory.regions[key] = whole
            memory.edges.update((head, tail))
        if self.log is not None:
            self.log.extend(nodes)
            self.region_log.extend(regions)

    def adopt_set(self, kept: NodeSet) -> None:
        """:meth:`adopt` for a node set and its regions: dict updates, not a loop per node."""
        if not kept.nodes and not kept.regions:
            return
        children = self.children
        before = len(children)
        children.update(kept.children)
        # Nodes named twice are counted once. Usually none is (the set's nodes are new to
        # the split: the dict grew by all of them), and no set of the nodes both name is
        # made, ~100 ns per node of the smaller: ``sizes`` (the same keys as ``children``,
        # not updated yet) tells which, and ``blobs`` names no node ``children`` does not.
        twice = len(children) - before < len(kept.children)
        if twice:
            again = self.sizes.keys() & kept.children.keys()
            self.node_bytes -= sum(map(kept.lengths.__getitem__, again))
        self.node_bytes += kept.length
        self.sizes.update(kept.sizes)
        fresh, size, largest = kept.blobs, kept.blob_bytes, kept.blob_max
        if self._known:
            fresh = {h: b for h, b in fresh.items() if h not in self._known}
            size = sum(map(len, fresh.values()))
            largest = max(map(len, fresh.values()), default=0)
        self.blob_max = max(self.blob_max, largest)
        blobs = self.blobs
        if twice:
            size -= sum(len(fresh[h]) for h in blobs.keys() & fresh.keys())
        self.blob_bytes += size
        blobs.update(fresh)
        memory = self.memory
        memory.regions.update(kept.keyed)
        memory.edges.update(kept.edges)
        if self.log is not None:
            self.log.extend(kept.nodes)
            self.region_log.extend(kept.regions)

    def wrap(self, node: bytes | memoryview) -> bytes:
        """The stored blob of ``node`` (compressed if the parameters say so)."""
        return self._wrap(node)


class NodeSet:
    """Nodes a split named, in order, kept to be adopted whole (:meth:`_Splitter.adopt_set`).

    By hash: each distinct node's children, size, stored blob and length (what adopting
    them one by one would add), ``length``, their lengths' sum, ``blob_bytes``, the
    stored blobs' bytes together, and ``blob_max``, the longest's length. Also regions cut
    with those nodes, in order, with what adopting them adds to a split's memory
    (``keyed``, ``edges``).
    """

    __slots__ = (
        "blob_bytes",
        "blob_max",
        "blobs",
        "children",
        "edges",
        "keyed",
        "length",
        "lengths",
        "nodes",
        "regions",
        "sizes",
    )

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        base: NodeSet | None = None,
        regions: Iterable[Region] = (),
    ) -> None:
        nodes, regions = tuple(nodes), tuple(regions)
        if base is None:
            self.nodes, self.regions = nodes, regions
            self.children: dict[bytes, tuple[bytes, ...]] = {}
            self.sizes: dict[bytes, int] = {}
            self.blobs: dict[bytes, bytes] = {}
            self.lengths: dict[bytes, int] = {}
            self.keyed: dict[int, bool] = {}
            self.edges: set[int] = set()
            self.length = self.blob_bytes = self.blob_max = 0
        else:
            self.nodes, self.regions = base.nodes + nodes, base.regions + regions
            self.children, self.sizes = dict(base.children), dict(base.sizes)
            self.blobs, self.lengths = dict(base.blobs), dict(base.lengths)
            self.keyed, self.edges = dict(base.keyed), set(base.edges)
            self.length, self.blob_bytes = base.length, base.blob_bytes
            self.blob_max = base.blob_max
        for key, whole, head, tail in regions:
            if key is not None:
                self.keyed[key] = whole
            self.edges.update((head, tail))
        for h, kids, blob, size, length in nodes:
            if h not in self.children:
                self.children[h], self.sizes[h], self.lengths[h] = kids, size, length
                self.length += length
                if blob is not None:
                    self.blobs[h] = blob
                    self.blob_bytes += len(blob)
                    self.blob_max = max(self.blob_max, len(blob))


NO_NODES: Final = NodeSet()
_NO_LEVEL: Final[IndexLevel] = (0, (), NO_NODES)


def _value_node(data: bytes, refs: _Refs) -> bytes:
    n = len(refs)
    if not n:
        return LEAF + data
    return b"".join(
        (
            b"V",
            COUNT.pack(n),
            *[h for _, h in refs],
            struct.pack(f">{n}I", *[off for off, _ in refs]),
            data,
        )
    )


def _mix(crc: int, refs: _Refs | None) -> int:
    """The boundary checksum of an element: CRC-32 of its text (``crc``) and child hashes."""
    if refs:
        for _, h in refs:
            crc = crc32(h, crc)
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


def exceeds(value: Any, limit: int) -> bool:
    """Whether the JSON text of ``value`` is surely longer than ``limit`` characters.

    Counts a lower bound and stops as soon as it passes ``limit``, so that a large state
    is not encoded whole just to learn that it does not fit in the root.
    """
    return text_bound(value, limit) > limit


def text_bound(value: Any, limit: int) -> int:
    """The lower bound :func:`exceeds` counts for ``value``, given up once past ``limit``.

    ``value`` is a storable copy, or a SharedState's tree before its copy: keys of any type
    and the standard types the copy tags, each counted at most as long as its tagged text.
    """
    try:
        return _text_bound(value, limit, len)
    except TypeError:  # a key of another type (stored in a "$map"): the hot loop is len's
        return _text_bound(value, limit, _key_length)


#: Types a SharedState's tree may hold and its copy tags: counted by their items.
_TAGGED_ITEMS: Final = frozenset({bytes, bytearray, tuple, set, frozenset})
#: Values counted as one character: JSON scalars, and the standard types tagged as scalars.
_ONE: Final = frozenset({int, float, bool, type(None), *SCALARS}) - _TAGGED_ITEMS
#: The shortest text of any other value the copy takes (a registered type, a TaggedValue):
#: a "$" tag over a name of one character, a version and the smallest data.
_TYPED_MIN: Final = len('{"$":["N",1,0]}')


def _key_length(key: Any) -> int:
    return len(key) if type(key) is str else 1


def _text_bound(value: Any, limit: int, key_length: Callable[[Any], int]) -> int:
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
                total += key_length(key)
            stack.extend(item.values())
        elif kind is list:
            total += 1 + len(item)
            stack.extend(item)
        elif kind in _ONE:
            total += 1
        elif kind in _TAGGED_ITEMS:  # bytes in base64; the others as lists, tagged
            total += 1 + len(item)
            if kind is not bytes and kind is not bytearray:
                stack.extend(item)
        else:  # a registered type's value (a model: a chat of them is a large state)
            total += _TYPED_MIN
        if total > limit:
            break
    return total


def split_state(
    data: Any,
    params: TreeParams = DEFAULT_PARAMS,
    *,
    known: Collection[bytes] = (),
    finite: bool = False,
    previous: SplitMemory | None = None,
    max_bytes: int | None = None,
) -> SplitResult:
    """Cut a storable value into a root and content-addressed blobs.

    ``data`` must be what :func:`~aiocheckpoint.codec.copy.to_storable` returns. Values whose
    encoding is longer than ``params.inline_limit`` become blobs; a value whose whole
    encoding fits in ``params.root_inline_limit`` bytes is kept in the root with no blobs.
    Blobs whose hash is in ``known`` (already stored) are not encoded again and are left
    out of ``blobs``. ``finite=True`` promises that no float in ``data`` is NaN or infinite
    (as :func:`~aiocheckpoint.codec.copy.storable_copy` reports), which allows a several times
    faster encoder. ``previous`` is the :attr:`SplitResult.memory` of the previous split
    of the same value's history (it changes which blobs are made, never the value).
    Raises :class:`CheckpointSerializationError` for unstorable values, and for a value
    whose text, or whose tree's nodes together, would be longer than ``max_bytes`` (what a
    reader with that limit refuses: :func:`~aiocheckpoint.codec.join.join_state`).
    """
    return finish(
        split_work(data, params, known, previous, inline=True, finite=finite, max_bytes=max_bytes)
    )


def split_work(
    data: Any,
    params: TreeParams,
    known: Collection[bytes],
    previous: SplitMemory | None,
    *,
    inline: bool,
    finite: bool,
    max_bytes: int | None = None,
) -> _Work[SplitResult]:
    """:func:`split_state` as a generator that yields between slices of work.

    ``inline=False`` never keeps the state in the root (the version-2 record does that).
    """
    splitter = _Splitter(params, known, previous)
    limit = params.root_inline_limit
    small = inline and limit and not exceeds(data, limit)
    try:
        if finite:
            try:
                if small:
                    body = _fast_dumps(data)
                    if len(body) <= limit:
                        return _inline_root(splitter, body, max_bytes)
                encoded, refs = yield from splitter.encode_fast(data, None, top=True)
            except TypeError:  # an int beyond 64 bits, or not storable: the exact encoder
                splitter, finite = _Splitter(params, known, previous), False
        if not finite:
            if small:
                body = dumps(data, False)  # exact: NaN, big ints stay as they are
                if len(body) <= limit:
                    return _inline_root(splitter, body, max_bytes)
            encoded, refs = splitter.encode(data)
        root = _value_node(encoded, refs)
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, CheckpointSerializationError):
            raise
        raise CheckpointSerializationError("state", str(exc)) from exc
    hashes = [h for _, h in refs]
    _check_size(splitter.spliced(encoded, hashes), splitter.node_bytes + len(root), max_bytes)
    return SplitResult(
        splitter.wrap(root),
        splitter.blobs,
        splitter.children,
        tuple(dict.fromkeys(h for _, h in refs)),
        splitter.text_crc,
        splitter.memory,
        splitter.blob_bytes,
        splitter.blob_max,
    )


def _inline_root(splitter: _Splitter, text: bytes, max_bytes: int | None) -> SplitResult:
    """A state kept whole in the root: a value node without references."""
    _check_size(len(text), len(LEAF) + len(text), max_bytes)
    return SplitResult(splitter.wrap(LEAF + text), {}, {}, ())


def _check_size(text: int, nodes: int, max_bytes: int | None) -> None:
    """Refuse a state a reader with a limit of ``max_bytes`` could not read back."""
    if max_bytes is not None and max(text, nodes) > max_bytes:
        raise CheckpointSerializationError(
            "state",
            f"its text is {text} bytes (its tree's nodes {nodes}), over this store's "
            f"max_record_bytes ({max_bytes})",
        )
