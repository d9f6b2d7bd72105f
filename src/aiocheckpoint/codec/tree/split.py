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

import hashlib
import hmac
import itertools
import json
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Final

from ...errors import CheckpointSerializationError
from ...format.checksum import crc32
from ...format.jsonread import BIG_INT_BITS
from ...format.tree import (
    DEFAULT_PARAMS,
    KIND_DICT,
    KIND_LIST,
    LEAF,
    PLAIN_LEAF,
    SplitMemory,
    SplitResult,
    TreeParams,
)
from ..compress import Compressor
from ..jsonwrite import dumps, int_to_decimal
from ..sizes import exceeds
from ..sliced import (
    OFFLOAD_BYTES,
    SLICE_BYTES,
    SLICED,
    Work,
    crc_work,
    dumps_work,
    fast_dumps,
    finish,
    job,
)
from .nodes import (
    NO_LEVEL,
    NO_REFS,
    ChunkMemo,
    Encoded,
    IndexLevel,
    Node,
    NodeSet,
    Refs,
    Region,
    boundary_mix,
    join_entries,
    value_node_bytes,
)

__all__ = ["Splitter", "check_size", "namer", "split_state", "split_work"]

_NO_HASHES: Final[list[bytes]] = []
_REF_WEIGHT: Final = 20  # what one reference adds to a node: hash and offset, roughly

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


def namer(params: TreeParams) -> Callable[[bytes | memoryview], bytes]:
    """What names a node: its truncated SHA-256, or HMAC-SHA256 under ``params.name_key``.

    A keyed name (an encrypted tree's) still deduplicates equal nodes, but nobody without
    the key can tell from a name what the node holds.
    """
    digest, key = params.digest_size, params.name_key
    if key is None:
        return lambda node: _sha256(node).digest()[:digest]
    return lambda node: _hmac_digest(key, node, "sha256")[:digest]


class Splitter:
    """One split's state: the nodes it made, its memory and its budget, and its encoders.

    :func:`split_work` runs one; :mod:`.subtrees` drives one too, feeding it the nodes and
    regions of sub-trees it has seen before.
    """

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
        self._budget = SLICE_BYTES
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
        # keeps what each sub-tree made (tree/subtrees.py); None: nobody does.
        self.log: list[Node] | None = None
        self.region_log: list[Region] = []
        self.point: tuple[int, int, int, int] | None = None
        self.levels: list[IndexLevel] = []
        # A list's cut that resumes (tree/subtrees.py): the chunk nodes its last cut made,
        # to be taken again, and the ones this cut makes (both None: nobody keeps them).
        self.chunk_memo: ChunkMemo | None = None
        self.chunks_made: dict[tuple[int, int], Node] | None = None
        compressor = Compressor(params)
        self._compress = compressor.active
        self._wrap = compressor.wrap

    def encode(self, value: Any) -> Encoded:
        """The exact encoder: any storable value (NaN, infinities, ints of any size)."""
        kind = type(value)
        if kind is dict:
            if not value:
                return b"{}", NO_REFS
            texts: list[bytes] = []
            refmap: dict[int, Refs] = {}
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
                return b"[]", NO_REFS
            texts, refmap = [], {}
            for item in value:
                text, refs = self.encode(item)
                if refs:
                    refmap[len(texts)] = refs
                texts.append(text)
            return self._kept(texts, refmap, False)
        text = _scalar_text(value).encode()
        if len(text) > self.p.inline_limit:
            return b"null", [(0, self.value_node(text, NO_REFS))]
        return text, NO_REFS

    def _kept(self, texts: list[bytes], refmap: dict[int, Refs], is_dict: bool) -> Encoded:
        """A container whose element texts are all at hand (the exact encoder's)."""

        def chunk(start: int, end: int, head: bytes) -> Encoded:
            return join_entries(texts, refmap, start, end, is_dict, head)

        def mix(i: int) -> int:
            return boundary_mix(crc32(texts[i]), refmap.get(i))

        return finish(self._container(list(map(len, texts)), refmap, mix, chunk, is_dict))

    def encode_fast(self, value: Any, text: bytes | None, top: bool = False) -> Work[Encoded]:
        """The fast encoder, for values without non-finite floats or ints beyond 64 bits.

        ``text`` is ``fast_dumps(value)``, or None when not encoded yet (the root, whose
        whole encoding would be thrown away). Every sub-tree that fits is encoded by one
        orjson call, so the Python-level work is per element of a large container, not per
        value. An element's own text is only measured and checksummed (for the boundaries)
        and then dropped: each chunk is encoded again by one orjson call over its slice of
        the container, which is what its node holds, so only one buffer per node stays
        alive (many small buffers kept alive cost several times more to allocate here).
        Yields every ``SLICE_BYTES`` of text. ``top`` (the root) also sets ``text_crc``,
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
                return text, NO_REFS
            if len(text) < OFFLOAD_BYTES:
                return b"null", [(0, self.value_node(text, NO_REFS))]
            return b"null", [(0, (yield from self.large_leaf(text)))]
        elements: list[Any] = list(value.items()) if is_dict else list(value)
        lens: list[int] = []
        mixes: list[int] = []
        kept: dict[int, bytes] = {}  # entry texts that hold references
        refmap: dict[int, Refs] = {}
        whole = crc32(b"{" if is_dict else b"[") if top else 0
        for i, element in enumerate(elements):
            member = element[1] if is_dict else element
            if type(member) in SLICED:
                item = yield from dumps_work(member)
            else:
                item = fast_dumps(member)
            large = len(item) >= OFFLOAD_BYTES
            if is_dict:
                key = fast_dumps(element[0])
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
            mixes.append(boundary_mix(crc, refmap.get(i)))
            self._budget -= size
            if self._budget < 0:
                self._budget = SLICE_BYTES
                yield None
        if top:
            self.text_crc = crc32(b"}" if is_dict else b"]", whole)

        def chunk(start: int, end: int, head: bytes) -> Encoded:
            if not refmap or not any(i in refmap for i in range(start, end)):
                part = elements[start:end]
                return b"".join((head, fast_dumps(dict(part) if is_dict else part))), NO_REFS
            texts: list[bytes] = []
            for i in range(start, end):
                entry = kept.get(i)
                if entry is None:
                    entry = (
                        b"".join((fast_dumps(elements[i][0]), b":", fast_dumps(elements[i][1])))
                        if is_dict
                        else fast_dumps(elements[i])
                    )
                texts.append(entry)
            return join_entries(
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
        refmap: dict[int, Refs],
        mix: Callable[[int], int],
        chunk: Callable[[int, int, bytes], Encoded],
        is_dict: bool,
        chunks: list[bytes] | None = None,
    ) -> Work[Encoded]:
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
        refmap: dict[int, Refs],
        mix: Callable[[int], int],
        chunk: Callable[[int, int, bytes], Encoded],
        base: int,
        chunks: list[bytes],
    ) -> Work[None]:
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
                    self._budget = SLICE_BYTES
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
        refmap: dict[int, Refs],
        mix: Callable[[int], int],
        chunk: Callable[[int, int, bytes], Encoded],
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
            taken, outs, nodes = resume[len(levels)] if len(levels) < len(resume) else NO_LEVEL
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
        refmap: dict[int, Refs],
        chunk: Callable[[int, int, bytes], Encoded],
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
        refmap: dict[int, Refs],
        chunk: Callable[[int, int, bytes], Encoded],
        start: int,
        end: int,
        keep: bool,
    ) -> bytes:
        """:meth:`_chunk_node` without the memo."""
        if refmap and any(i in refmap for i in range(start, end)):
            text, refs = chunk(start, end, b"")
            if keep:
                return self.value_node(text, refs)
            node: bytes | memoryview = value_node_bytes(text, refs)
        else:
            # No references: build the stored blob in one piece.
            blob = chunk(start, end, PLAIN_LEAF)[0]
            if keep:
                return self._add(blob, _NO_HASHES, len(blob) - len(PLAIN_LEAF))
            node = memoryview(blob)[1:]
        return self._name(node)

    def large_leaf(self, text: bytes) -> Work[bytes]:
        """:meth:`value_node` of a large text without references: copied and hashed by jobs."""
        blob = yield from job(b"".join, (PLAIN_LEAF, text))
        name = yield from job(self._name, memoryview(blob)[1:])
        return self._add(blob, _NO_HASHES, len(text), name)

    def value_node(self, text: bytes, refs: Refs) -> bytes:
        """Add the value node of ``text`` with its references; its hash."""
        if not refs:
            return self._add(b"".join((PLAIN_LEAF, text)), _NO_HASHES, len(text))
        hashes = [h for _, h in refs]
        return self._add(b"\x00" + value_node_bytes(text, refs), hashes, self.spliced(text, hashes))

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
    reader with that limit refuses: :func:`~aiocheckpoint.codec.tree.join.join_state`).
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
) -> Work[SplitResult]:
    """:func:`split_state` as a generator that yields between slices of work.

    ``inline=False`` never keeps the state in the root (the version-2 record does that).
    """
    splitter = Splitter(params, known, previous)
    limit = params.root_inline_limit
    small = inline and limit and not exceeds(data, limit)
    try:
        if finite:
            try:
                if small:
                    body = fast_dumps(data)
                    if len(body) <= limit:
                        return _inline_root(splitter, body, max_bytes)
                encoded, refs = yield from splitter.encode_fast(data, None, top=True)
            except TypeError:  # an int beyond 64 bits, or not storable: the exact encoder
                splitter, finite = Splitter(params, known, previous), False
        if not finite:
            if small:
                body = dumps(data, False)  # exact: NaN, big ints stay as they are
                if len(body) <= limit:
                    return _inline_root(splitter, body, max_bytes)
            encoded, refs = splitter.encode(data)
        root = value_node_bytes(encoded, refs)
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, CheckpointSerializationError):
            raise
        raise CheckpointSerializationError("state", str(exc)) from exc
    hashes = [h for _, h in refs]
    check_size(splitter.spliced(encoded, hashes), splitter.node_bytes + len(root), max_bytes)
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


def _inline_root(splitter: Splitter, text: bytes, max_bytes: int | None) -> SplitResult:
    """A state kept whole in the root: a value node without references."""
    check_size(len(text), len(LEAF) + len(text), max_bytes)
    return SplitResult(splitter.wrap(LEAF + text), {}, {}, ())


def check_size(text: int, nodes: int, max_bytes: int | None) -> None:
    """Refuse a state a reader with a limit of ``max_bytes`` could not read back."""
    if max_bytes is not None and max(text, nodes) > max_bytes:
        raise CheckpointSerializationError(
            "state",
            f"its text is {text} bytes (its tree's nodes {nodes}), over this store's "
            f"max_record_bytes ({max_bytes})",
        )
