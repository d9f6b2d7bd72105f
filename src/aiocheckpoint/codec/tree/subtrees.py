"""Cached encodings of a SharedState's sub-trees: a checkpoint costs what changed.

A :class:`~aiocheckpoint.SharedState` never changes its tree in place: a change copies the
dicts on its path and leaves every other sub-tree the *same object*. So an object seen at
the previous checkpoint of a workflow still holds what it held then, and what the pipeline
made of it then -- its value-stage copy, its encoded text and references, the nodes (blobs)
and regions its split produced -- is still right. :func:`shared_split_work` walks the
state's dicts from the root, reuses that for every sub-tree it has seen (by identity), and
runs the value stage and the fast encoder only on what is new. The result is the split a
from-scratch :func:`~aiocheckpoint.codec.tree.split.split_work` of the same state with the same
split memory makes, byte for byte (``tests/test_subtrees.py`` checks it on random edit
sequences), so readers and backends see nothing new.

The walk descends into plain dicts with ``str`` keys (JSON objects, which a value stage
maps key for key) and into long lists, whose content-defined cut resumes where the list
last cut at the same path ended its last region when the new list extends it (an append:
:meth:`_Walk.walk_list`); every other value goes through the configured value stage whole.
A state the fast encoder cannot take (a NaN, an int beyond 64 bits) is left to the
pipeline's ordinary path (None).
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Generator, Mapping
from itertools import repeat
from operator import is_
from typing import Any, Final

from ...errors import CheckpointSerializationError
from ...format.checksum import crc32
from ...format.limits import MAX_DEPTH
from ...format.tags import TAG_START
from ...format.tree import KIND_LIST, SplitMemory, SplitResult, TreeParams
from ..copy import child_path
from ..sliced import SLICE_BYTES, Job, crc_work, dumps_work, fast_dumps
from ..stages import ValueStage
from ..typed import has_tags, needs_map
from .crc import crc_combine, crc_shift
from .nodes import (
    NO_NODES,
    ChunkMemo,
    IndexLevel,
    Node,
    NodeSet,
    Refs,
    Region,
    boundary_mix,
    join_entries,
    value_node_bytes,
)
from .split import Splitter, check_size

__all__ = ["Entries", "Lineage", "SharedSplit", "SubtreeCache", "shared_split_work"]

_Work = Generator[Job | None, Any, Any]
#: Dicts nested deeper than this are taken whole, like any other value.
_WALK_DEPTH: Final = 32
#: Lists shorter than this are taken whole (a list is walked so that an append resumes
#: its cut, which needs a list long enough to be cut into regions).
_LIST_MIN: Final = 16
#: Bounds of the cached sub-trees kept: workflows, and bytes of their blobs in all.
_CACHE_WORKFLOWS: Final = 1024
_CACHE_BYTES: Final = 128 * 1024 * 1024


_referents: Final = gc.get_referents
_tracked: Final = gc.is_tracked


def _is_container(value: Any) -> bool:
    kind = type(value)
    return kind is dict or kind is list


def _depth(value: Any) -> int:
    """How many levels of containers ``value`` nests (0 for a scalar), up to MAX_DEPTH + 1."""
    if not _is_container(value):
        return 0
    depth, level = 1, [value]
    while depth <= MAX_DEPTH:
        inside = _referents(*level)
        if not any(map(_is_container, inside)):
            break
        depth += 1
        # Containers that may hold containers are tracked by the garbage collector.
        level = list(filter(_tracked, inside))
        if not level:
            break
    return depth


class _Entry:
    """What the pipeline made of one sub-tree: its copy, encoding, nodes and regions."""

    __slots__ = (
        "copy",
        "crc",
        "depth",
        "inner",
        "length",
        "node_set",
        "nodes",
        "path",
        "refs",
        "regions",
        "scan",
        "shift",
        "source",
        "span",
        "tagged",
        "text",
    )

    def __init__(
        self, source: Any, copy: Any, text: bytes, refs: Refs, crc: int, length: int, depth: int
    ) -> None:
        self.source = source  # kept alive, so that its id is not reused
        self.copy = copy
        #: The encoded text (a reference's ``null``, or the whole text when inline).
        self.text = text
        self.refs = refs
        #: CRC-32 and length of the sub-tree's whole JSON text.
        self.crc = crc
        self.length = length
        self.depth = depth
        #: ``crc_shift(length)`` once needed (for an entry with references).
        self.shift = 0
        #: The nodes and regions the sub-tree's split made (see :meth:`settle`).
        self.nodes: tuple[Node, ...] = ()
        self.regions: tuple[Region, ...] = ()
        #: Until :meth:`settle`: the log of that split and the sub-tree's ranges in it, its
        #: nodes' and its regions'. Most entries (a grown list, the dicts above it) are never
        #: adopted whole: copying their ranges out would be a copy per node of the tree.
        self.span: tuple[list[Node], int, int, list[Region], int, int] | None = None
        #: ``nodes`` by hash, made when the entry is first adopted (and kept for the next).
        self.node_set: NodeSet | None = None
        #: The cached sub-trees inside this one (kept with it).
        self.inner: tuple[_Entry, ...] = ()
        #: A list cut into chunks: where its cut can resume when it grows, and its path.
        self.scan: _Scan | None = None
        self.path = ""
        #: Whether the sub-tree's text may hold a tag (:func:`~.typed.has_tags`).
        self.tagged = True

    def settle(self) -> None:
        """Copy the entry's nodes and regions out of its split's log (and let the log go)."""
        span = self.span
        if span is not None:
            log, start, end, region_log, first, last = span
            self.nodes, self.regions = tuple(log[start:end]), tuple(region_log[first:last])
            self.span = None


class _Tail:
    """The elements after a list's last region end as its last cut saw them.

    Their texts, lengths and boundary checksums, the CRC-32 and length of the list's text
    after each, and where in ``items`` the first text that may hold a tag is (its length
    if none may). Kept only for elements without references (each fits in its chunk).
    """

    __slots__ = ("after", "items", "lens", "mixes", "tagged_at")

    def __init__(
        self,
        items: list[bytes],
        lens: list[int],
        mixes: list[int],
        after: list[tuple[int, int]],
        tagged_at: int,
    ) -> None:
        self.items, self.lens, self.mixes, self.after = items, lens, mixes, after
        self.tagged_at = tagged_at


class _Scan:
    """A chunked list's cut up to its last region end: all that an append leaves as it is.

    Elements ``0:index`` lie in regions that end there; the chunks of those regions, the
    nodes they and those elements made and the regions themselves are what a split of any
    list that starts with the same elements (the same objects) makes of them too.
    """

    __slots__ = (
        "chunk_memo",
        "chunk_nodes",
        "chunks",
        "crc",
        "depth",
        "element_nodes",
        "index",
        "length",
        "levels",
        "tagged",
        "tail",
    )

    def __init__(
        self,
        index: int,
        chunks: tuple[bytes, ...],
        element_nodes: NodeSet,
        chunk_nodes: NodeSet,
        text: tuple[int, int, int],
        levels: tuple[IndexLevel, ...] = (),
    ) -> None:
        self.index = index
        self.chunks = chunks
        self.element_nodes = element_nodes
        self.chunk_nodes = chunk_nodes
        #: CRC-32 and length of ``[`` and the elements' texts before ``index``, comma
        #: separated; the depth of the list of those elements.
        self.crc, self.length, self.depth = text
        #: The index levels over ``chunks`` (``Splitter.index``).
        self.levels = levels
        #: Whether the elements before ``index`` may hold a tag.
        self.tagged = False
        #: The nodes the last cut made of chunks after ``index``, by element range: the
        #: open region's chunks, which the next cut makes again unless it takes them here.
        self.chunk_memo: ChunkMemo = _NO_MEMO
        #: What the last cut made of the elements from ``index`` on, when none of them
        #: holds a reference: an append encodes and checksums them again otherwise.
        self.tail: _Tail | None = None


#: A list and lists it starts with (their elements, the same objects), the newest first:
#: what :meth:`~aiocheckpoint.SharedState.append` knows of the lists it makes.
Lineage = tuple[list[Any], tuple[list[Any], ...]]
_NO_LINEAGES: Final[Mapping[int, Lineage]] = {}
_NO_MEMO: Final[ChunkMemo] = {}
_START: Final = _Scan(0, (), NO_NODES, NO_NODES, (crc32(b"["), 1, 1))
#: A workflow's cached sub-trees: by the id of their source, and chunked lists by path too.
Entries = dict[int | str, _Entry]


def _tagged(entry: _Entry, text: bytes) -> _Entry:
    """``entry``, marked with whether its whole ``text`` may hold a tag."""
    entry.tagged = has_tags(text)
    return entry


def _with_tags(tagged: bool, scan: _Scan) -> _Scan:
    scan.tagged = tagged
    return scan


class SharedSplit:
    """The outcome of :func:`shared_split_work`: the copy, the split, the cache to keep."""

    __slots__ = ("copy", "entries", "split", "tagged")

    def __init__(
        self, copy: dict[str, Any], split: SplitResult, entries: Entries, tagged: bool = True
    ):
        #: The state's value-stage copy (unchanged sub-trees: the copies made before).
        self.copy = copy
        self.split = split
        #: The cached sub-trees this split used or made, for the next one.
        self.entries = entries
        #: Whether the copy's text may hold a tag (False: nothing to decode back).
        self.tagged = tagged


class _Fallback(Exception):
    """The fast encoder cannot take this state: the ordinary path must."""


class _Walk:
    __slots__ = ("cache", "kept", "limit", "lineages", "new", "splitter", "values")

    def __init__(
        self,
        splitter: Splitter,
        values: ValueStage,
        cache: Entries,
        lineages: Mapping[int, Lineage] = _NO_LINEAGES,
    ):
        self.splitter = splitter
        self.values = values
        self.cache = cache
        self.lineages = lineages
        self.new: Entries = {}
        self.kept: list[_Entry] = []  # the entries of ``new``, in the order they were kept
        self.limit = splitter.p.inline_limit

    def value(self, source: Any, path: str, depth: int) -> Generator[Job | None, Any, _Entry]:
        entry = self.cached(source)
        if entry is None:
            walked = depth < _WALK_DEPTH
            if walked and type(source) is dict and not needs_map(source):
                entry = yield from self.walk_dict(source, path, depth, False)
            elif walked and type(source) is list and len(source) >= _LIST_MIN:
                entry = yield from self.walk_list(source, path)
            else:
                entry = yield from self.leaf(source, path)
        if depth + entry.depth > MAX_DEPTH:
            raise _Fallback  # the value stage's own copy names the path too deep
        return entry

    def cached(self, source: Any) -> _Entry | None:
        """The entry of ``source`` if it is cached, adopted into the split; else None."""
        entry = self.cache.get(id(source))
        if entry is None or entry.source is not source:
            return None
        nodes = entry.node_set
        if nodes is None:  # adopted whole for the first time
            for kept in (*entry.inner, entry):
                kept.settle()  # kept on: not holding on to an earlier split's log
            nodes = entry.node_set = NodeSet(entry.nodes, None, entry.regions)
        self.splitter.adopt_set(nodes)
        for kept in (*entry.inner, entry):
            self.new[id(kept.source)] = kept
            if kept.scan is not None:
                self.new[kept.path] = kept
            self.kept.append(kept)
        return entry

    def leaf(self, source: Any, path: str) -> Generator[Job | None, Any, _Entry]:
        """A value the value stage copies whole; encoded like the fast encoder's element."""
        copy, finite = yield from self.values.copy_work(source, path)
        if not finite:
            raise _Fallback
        item = yield from dumps_work(copy)
        splitter = self.splitter
        if len(item) <= self.limit:
            entry = _Entry(source, copy, item, [], 0, len(item), _depth(copy))
        else:
            marks = self._marks()
            text, refs = yield from splitter.encode_fast(copy, item)
            crc = yield from crc_work(item)
            entry = _Entry(source, copy, text, refs, crc, len(item), _depth(copy))
            entry = self._kept(entry, marks)
        entry.tagged = has_tags(item)
        return entry

    def walk_dict(
        self, source: dict[str, Any], path: str, depth: int, top: bool
    ) -> Generator[Job | None, Any, _Entry]:
        """A dict walked key by key: its entries' encodings joined as the fast encoder would."""
        marks = self._marks()
        keys = list(source)
        entries = []
        for key in keys:
            entries.append((yield from self.value(source[key], child_path(path, key), depth + 1)))
        copy = dict(zip(keys, [e.copy for e in entries], strict=True))
        texts: list[bytes] = []
        refmap: dict[int, Refs] = {}
        mixes: list[int] = []
        length = 1 + len(keys)
        crc = crc32(b"{")
        for i, (key, entry) in enumerate(zip(keys, entries, strict=True)):
            head = fast_dumps(key) + b":"
            if i:
                crc = crc32(b",", crc)
            crc = crc32(head, crc)
            length += len(head) + entry.length
            text = head + entry.text
            if entry.refs:
                shift = len(head)
                refs = refmap[i] = [(off + shift, h) for off, h in entry.refs]
                if not entry.shift:
                    entry.shift = crc_shift(entry.length)
                crc = crc_combine(crc, entry.crc, entry.shift)
                mixes.append(boundary_mix(crc32(text), refs))
            else:
                crc = crc32(entry.text, crc)
                mixes.append(boundary_mix(crc32(text), None))
            texts.append(text)
        crc = crc32(b"}", crc)
        length = max(length, 2)
        inner = 1 + max((e.depth for e in entries), default=0)
        tagged = keys[0].startswith(TAG_START) if keys else False
        tagged = tagged or any(e.tagged for e in entries)
        if length <= self.limit and not top:
            whole = b"".join((b"{", b",".join(texts), b"}"))
            entry = _Entry(source, copy, whole, [], crc, length, inner)
            entry.tagged = tagged
            return entry

        def chunk(first: int, end: int, head: bytes) -> tuple[bytes, Refs]:
            return join_entries(texts, refmap, first, end, True, head)

        lens = list(map(len, texts))
        text, refs = yield from self.splitter._container(
            lens, refmap, mixes.__getitem__, chunk, True
        )
        entry = _Entry(source, copy, text, refs, crc, length, inner)
        entry.tagged = tagged
        return self._kept(entry, marks)

    def walk_list(self, source: list[Any], path: str) -> Generator[Job | None, Any, _Entry]:
        """A long list, its cut resumed where the list last cut at ``path`` ended a region.

        Resumed when this list starts with that one's elements (an append), else cut from
        its start. Encodes, copies and cuts only the elements after that region end, and makes the
        nodes a from-scratch cut of the whole list makes.
        """
        base = self._base(source, path)
        if base is None:
            copy, finite = yield from self.values.copy_work(source, path)
        else:
            try:
                tail, finite = yield from self.values.copy_work(source[len(base.source) :], path)
            except CheckpointSerializationError:  # the whole list's copy names the element
                return (yield from self.leaf(source, path))
            copy = [*base.copy, *tail]
        if not finite:
            raise _Fallback
        scan = _START if base is None or base.scan is None else base.scan
        seen = None if base is None else scan.tail
        if seen is None:
            items, first_tagged = yield from _encoded(copy, scan.index)
        else:
            items, first_tagged = yield from _encoded(copy, scan.index + len(seen.items))
            if seen.tagged_at < len(seen.items):  # else none of them may hold a tag
                first_tagged = seen.tagged_at
            else:
                first_tagged += len(seen.items)
            items = [*seen.items, *items]
        if base is None and scan.length + sum(map(len, items)) + len(items) <= self.limit:
            item = fast_dumps(copy)
            return _tagged(_Entry(source, copy, item, [], 0, len(item), _depth(copy)), item)
        marks = self._marks()
        cut = _ListCut(self.splitter, copy, scan)
        cut.first_tagged, cut.tail = first_tagged, seen
        text, refs = yield from cut.run(items, base is not None)
        entry = _Entry(source, copy, text, refs, cut.crc, cut.length, cut.depth())
        entry.scan, entry.path = cut.resumable(), path
        entry.tagged = scan.tagged or first_tagged < len(items)
        self._kept(entry, marks)
        if entry.scan is not None:
            self.new[path] = entry
        return entry

    def _base(self, source: list[Any], path: str) -> _Entry | None:
        """The entry of the list last cut at ``path`` if ``source`` extends it, else None."""
        if self.splitter.previous is None:
            return None  # a split without memory keeps more of it (``first_chunks``)
        entry = self.cache.get(path)
        if entry is None or entry.scan is None:
            return None
        old = entry.source
        if len(old) > len(source):
            return None
        lineage = self.lineages.get(id(source))
        if lineage is not None and lineage[0] is source and any(map(is_, lineage[1], repeat(old))):
            return entry  # made by appending to ``old`` (or to a list that was): no need to look
        return entry if all(map(is_, old, source)) else None

    def _marks(self) -> tuple[int, int, int]:
        log = self.splitter.log
        assert log is not None
        return len(log), len(self.splitter.region_log), len(self.kept)

    def _kept(self, entry: _Entry, marks: tuple[int, int, int]) -> _Entry:
        """Keep what the split of ``entry``'s sub-tree made since ``marks``, and the entry."""
        splitter = self.splitter
        assert splitter.log is not None
        nodes, regions, kept = marks
        log, region_log = splitter.log, splitter.region_log
        entry.span = (log, nodes, len(log), region_log, regions, len(region_log))
        entry.inner = tuple(self.kept[kept:])
        self.new[id(entry.source)] = entry
        self.kept.append(entry)
        return entry


def _encoded(elements: list[Any], start: int) -> Generator[None, Any, tuple[list[bytes], int]]:
    """The compact texts of ``elements[start:]``, and where the first tag may be.

    Encoded a run of about ``SLICE_BYTES`` at a time: one ``map`` over a 50,000-message
    chat held the GIL for its whole encode (~50 MB). The index returned is that (in the
    texts) of the first text that may hold a tag, or their count if none may.
    """
    items: list[bytes] = []
    first_tagged = -1
    count = 64
    while start < len(elements):
        run = list(map(fast_dumps, elements[start : start + count]))
        if first_tagged < 0 and any(tags := list(map(has_tags, run))):
            first_tagged = len(items) + tags.index(True)
        items += run
        start += count
        count = max(1, min(4 * count, count * SLICE_BYTES // (sum(map(len, run)) or 1)))
        yield None
    return items, len(items) if first_tagged < 0 else first_tagged


class _ListCut:
    """The cut of one list's elements from ``scan.index`` on, as ``encode_fast`` cuts them."""

    __slots__ = (
        "after",
        "chunks",
        "copy",
        "crc",
        "ends",
        "first_tagged",
        "items",
        "length",
        "lens",
        "made",
        "mixes",
        "refmap",
        "region_ends",
        "scan",
        "scan_from",
        "splitter",
        "tail",
        "texts",
    )

    def __init__(self, splitter: Splitter, copy: list[Any], scan: _Scan) -> None:
        self.splitter = splitter
        self.copy = copy
        self.scan = scan
        self.lens: list[int] = []
        self.mixes: list[int] = []
        self.refmap: dict[int, Refs] = {}
        self.texts: dict[int, bytes] = {}  # the entries that hold references
        #: The log's length before each element's nodes, and after the last one's.
        self.ends: list[int] = []
        #: The region log's length likewise (a large element cut into regions of its own).
        self.region_ends: list[int] = []
        #: CRC-32 and length of the list's text up to the end of each element.
        self.after: list[tuple[int, int]] = []
        self.chunks: list[bytes] = list(scan.chunks)
        #: The texts of the elements from ``scan.index`` on.
        self.items: list[bytes] = []
        #: The index in ``items`` of the first that may hold a tag (``len(items)``: none).
        self.first_tagged = 0
        #: The log's and the region log's lengths where this cut's own chunks start.
        self.scan_from = (0, 0)
        self.crc = self.length = 0
        #: The chunk nodes this cut made or took, by element range.
        self.made: dict[tuple[int, int], Node] = {}
        #: What the last cut made of the first elements from ``scan.index`` on, if kept.
        self.tail: _Tail | None = None

    def run(
        self, items: list[bytes], resumed: bool
    ) -> Generator[Job | None, Any, tuple[bytes, Refs]]:
        """The list's encoded text and references, its nodes named in the splitter."""
        splitter = self.splitter
        log = splitter.log
        assert log is not None
        scan = self.scan
        if resumed:
            splitter.adopt_set(scan.element_nodes)
        yield from self._elements(items)
        splitter.point = None
        splitter.chunk_memo, splitter.chunks_made = scan.chunk_memo, self.made
        try:
            if not resumed:
                self.scan_from = (len(log), len(splitter.region_log))
                return (
                    yield from splitter._container(
                        self.lens, self.refmap, self._mix, self._chunk, False, self.chunks
                    )
                )
            splitter.adopt_set(scan.chunk_nodes)
            self.scan_from = (len(log), len(splitter.region_log))
            yield from splitter.scan(
                self.lens, self.refmap, self._mix, self._chunk, scan.index, self.chunks
            )
        finally:
            splitter.chunk_memo = splitter.chunks_made = None
        point = splitter.point
        stable = len(scan.chunks) if point is None else point[1]
        return b"null", [(0, splitter.index(self.chunks, KIND_LIST, scan.levels, stable))]

    def _elements(self, items: list[bytes]) -> Generator[Job | None, Any, None]:
        """Each element's length, boundary checksum and references, and the text's CRC."""
        splitter, base = self.splitter, self.scan.index
        self.items = items
        log = splitter.log
        assert log is not None
        limit = splitter.p.inline_limit
        crc, length = self.scan.crc, self.scan.length
        tail = self.tail
        if tail is not None and tail.items:  # no references: no nodes, no log entries
            self.ends += [len(log)] * len(tail.items)
            self.region_ends += [len(splitter.region_log)] * len(tail.items)
            self.after += tail.after
            self.lens += tail.lens
            self.mixes += tail.mixes
            crc, length = tail.after[-1]
            base += len(tail.items)
            items = items[len(tail.items) :]
        budget = SLICE_BYTES
        for i, item in enumerate(items, base):
            self.ends.append(len(log))
            self.region_ends.append(len(splitter.region_log))
            if i:
                crc = crc32(b",", crc)
                length += 1
            crc = crc32(item, crc)
            length += len(item)
            self.after.append((crc, length))
            if len(item) > limit:
                inner, refs = yield from splitter.encode_fast(self.copy[i], item)
                self.refmap[i], self.texts[i] = refs, inner
                self.lens.append(len(inner))
                self.mixes.append(boundary_mix(crc32(inner), refs))
            else:
                self.lens.append(len(item))
                self.mixes.append(boundary_mix(crc32(item), None))
            budget -= len(item)
            if budget < 0:
                budget = SLICE_BYTES
                yield None
        self.ends.append(len(log))
        self.region_ends.append(len(splitter.region_log))
        self.crc, self.length = crc32(b"]", crc), length + 1

    def _mix(self, i: int) -> int:
        return self.mixes[i - self.scan.index]

    def _chunk(self, start: int, end: int, head: bytes) -> tuple[bytes, Refs]:
        """Elements ``start:end`` as a list after ``head``, as ``encode_fast``'s chunks."""
        copy, refmap = self.copy, self.refmap
        if not refmap or not any(i in refmap for i in range(start, end)):
            return b"".join((head, fast_dumps(copy[start:end]))), []
        texts = [self.texts.get(i) or fast_dumps(copy[i]) for i in range(start, end)]
        refs = {i - start: r for i, r in refmap.items() if start <= i < end}
        return join_entries(texts, refs, 0, end - start, False, head)

    def depth(self) -> int:
        """The depth of the whole list."""
        return max(self.scan.depth, _depth(self.copy[self.scan.index :]))

    def resumable(self) -> _Scan | None:
        """Where the next cut of a longer list can resume: this cut's last region end.

        With the nodes this cut made of the chunks after it, which a cut of the list grown
        further makes again (the open region's).
        """
        resume = self._resume_point()
        if resume is not None:
            index = resume.index
            resume.chunk_memo = {r: node for r, node in self.made.items() if r[0] >= index}
            resume.tail = self._tail(index)
        return resume

    def _tail(self, index: int) -> _Tail | None:
        """The elements from ``index`` on as this cut saw them; None if one has references."""
        refmap, base = self.refmap, self.scan.index
        if refmap and any(i >= index for i in refmap):
            return None
        at = index - base
        # A tag before ``index`` marks the scan itself: from there on any answer will do.
        return _Tail(
            self.items[at:],
            self.lens[at:],
            self.mixes[at:],
            self.after[at:],
            max(0, self.first_tagged - at),
        )

    def _resume_point(self) -> _Scan | None:
        point, scan = self.splitter.point, self.scan
        if point is None:
            if scan is _START:
                return None
            return _with_tags(
                scan.tagged,
                _Scan(
                    scan.index,
                    scan.chunks,
                    scan.element_nodes,
                    scan.chunk_nodes,
                    (scan.crc, scan.length, scan.depth),
                    tuple(self.splitter.levels),
                ),
            )
        index, chunks, nodes, regions = point
        base = scan.index
        log = self.splitter.log
        assert log is not None
        start, region_start = self.scan_from
        chunk_nodes = NodeSet(
            log[start:nodes], scan.chunk_nodes, self.splitter.region_log[region_start:regions]
        )
        depth = max(scan.depth, _depth(self.copy[base:index]))
        tagged = scan.tagged or self.first_tagged < index - base
        return _with_tags(
            tagged,
            _Scan(
                index,
                tuple(self.chunks[:chunks]),
                NodeSet(
                    log[self.ends[0] : self.ends[index - base]],
                    scan.element_nodes,
                    self.splitter.region_log[self.region_ends[0] : self.region_ends[index - base]],
                ),
                chunk_nodes,
                (*self.after[index - base - 1], depth),
                tuple(self.splitter.levels),
            ),
        )


def shared_split_work(
    data: dict[str, Any],
    values: ValueStage,
    params: TreeParams,
    previous: SplitMemory | None,
    cache: Entries,
    max_bytes: int | None,
    lineages: Mapping[int, Lineage] = _NO_LINEAGES,
) -> Generator[Job | None, Any, SharedSplit | None]:
    """Copy and split a SharedState's tree ``data``, reusing ``cache``'s sub-trees.

    ``previous`` is the memory of the workflow's last split, the one ``cache`` was made
    with (None, with an empty cache, for a workflow whose last split is not known).
    ``lineages`` are the state's (``SharedState._lineages``): a list found there extends
    the lists named with it, which spares comparing its elements with theirs. The
    split equals ``split_work(copy, params, (), previous, inline=False, finite=True)``.
    None when the state needs the ordinary path (a value the fast encoder does not take);
    a value the value stage refuses raises as it would there.
    """
    if needs_map(data):
        return None  # a state of one "$" key is stored as "$map": not walked key by key
    splitter = Splitter(params, (), previous)
    splitter.log = []
    walk = _Walk(splitter, values, cache, lineages)
    try:
        root = walk.cached(data) or (yield from walk.walk_dict(data, "state", 0, True))
    except (_Fallback, TypeError, RecursionError):
        return None
    hashes = [h for _, h in root.refs]
    node = value_node_bytes(root.text, root.refs)
    check_size(splitter.spliced(root.text, hashes), splitter.node_bytes + len(node), max_bytes)
    split = SplitResult(
        splitter.wrap(node),
        splitter.blobs,
        splitter.children,
        tuple(dict.fromkeys(hashes)),
        root.crc,
        splitter.memory,
        splitter.blob_bytes,
        splitter.blob_max,
    )
    return SharedSplit(root.copy, split, walk.new, root.tagged)


class SubtreeCache:
    """Each recently saved workflow's cached sub-trees, least recently saved dropped.

    Bounded by workflows and by the bytes of the blobs the entries hold.
    """

    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        self.entries: OrderedDict[str, tuple[Entries, int]] = OrderedDict()
        self.size = 0

    def get(self, workflow_id: str) -> Entries:
        """The workflow's cached sub-trees (empty if none are kept)."""
        kept = self.entries.get(workflow_id)
        return {} if kept is None else kept[0]

    def keep(self, workflow_id: str, entries: Entries | None, size: int = 0) -> None:
        """Keep ``entries`` (of ``size`` bytes) for the workflow; None forgets it."""
        old = self.entries.pop(workflow_id, None)
        if old is not None:
            self.size -= old[1]
        if entries is None or size > _CACHE_BYTES:
            return
        self.entries[workflow_id] = (entries, size)
        self.size += size
        while len(self.entries) > _CACHE_WORKFLOWS or self.size > _CACHE_BYTES:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.size -= dropped
