"""Rebuilding a state from its root and blobs (the reading side of version-2 trees).

Every blob is verified against its hash (or, with a record's text checksum, the rebuilt
text once); a missing or mismatching blob, or a malformed node, raises
:class:`CheckpointCorruptedError`. The code is sans-IO: one generator per read asks for
one tree level of blobs at a time, and :func:`drive` / :func:`adrive` answer it with a
sync or an async ``fetch``.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import operator
import secrets
import struct
from collections.abc import Awaitable, Callable, Collection, Generator, Iterator, Mapping
from typing import Any, Final, TypeVar

import orjson

from ...errors import CheckpointCorruptedError
from ...format.blob import Unwrapper
from ...format.checksum import crc32
from ...format.jsonread import loads, loads_fast
from ...format.limits import DEFAULT_MAX_RECORD_BYTES
from ...format.sealed import BLOB_SEALED, sealed_blob_children
from ...format.tags import MARK
from ...format.tags import may_hold_tag as has_tags
from ...format.tree import KIND_LIST, KIND_VALUE, LEAF, PLAIN_LEAF, node_refs

__all__ = [
    "AsyncFetch",
    "Fetch",
    "Joiner",
    "Steps",
    "adrive",
    "ajoin_state",
    "areferenced_hashes",
    "drive",
    "guard",
    "join_state",
    "referenced_hashes",
]

#: ``fetch(hashes) -> {hash: stored blob}``; called once per tree level. Missing keys mean
#: missing blobs.
Fetch = Callable[[Collection[bytes]], Mapping[bytes, bytes]]
#: The async form of :data:`Fetch`.
AsyncFetch = Callable[[Collection[bytes]], Awaitable[Mapping[bytes, bytes]]]

_T = TypeVar("_T")
#: A read: yields the hashes of one tree level, is sent their blobs, returns its result.
Steps = Generator[list[bytes], Mapping[bytes, bytes], _T]
_NO_HASHES: Final[list[bytes]] = []
_sha256 = hashlib.sha256


def _corrupt(reason: str) -> CheckpointCorruptedError:
    return CheckpointCorruptedError(reason)


# C-level callables mapped over a tree level's blobs, so that the per-blob Python work of
# a resume is a few builtin calls rather than bytecode (docs/incremental.md, "Reading").
_is_plain_leaf: Final = operator.methodcaller("startswith", PLAIN_LEAF)
_SEALED: Final = bytes((BLOB_SEALED,))
_view: Final[Callable[[bytes], memoryview]] = memoryview
_after_flags: Final = operator.itemgetter(slice(1, None))
_digest_of: Final = operator.methodcaller("digest")
_chunk_opening: Final = operator.itemgetter(len(PLAIN_LEAF))
_last_byte: Final = operator.itemgetter(-1)
_chunk_entries: Final = operator.itemgetter(slice(len(PLAIN_LEAF) + 1, -1))


class Joiner:
    """Fetches a tree level by level, verifying every node, then parses it in one go.

    The value nodes' texts are spliced together at their placeholders into one JSON
    document that a single ``json.loads`` turns into the state: the same parse the
    version-1 format does, plus a hash and a slice per node. An uncompressed leaf is kept
    as its stored blob (hashed in place, sliced once when spliced), any other node as
    ``(node, refs)``. Leaves, nearly all of a large state's nodes, are verified and
    spliced in bulk: a level's hashes by one chain of ``map`` calls, an index node's leaf
    chunks by one ``join``.

    ``max_bytes`` bounds what one read may hold, whatever the store contains: the nodes
    fetched (decompressed) and, separately, the rebuilt text, counted byte by byte as it
    is spliced, so that a tree referencing one sub-tree many times ("billion laughs") is
    refused at the limit with :class:`CheckpointCorruptedError`. Every reference splices
    at least one byte (empty values are refused), so the time is bounded by the limit too.
    """

    def __init__(self, digest: int, max_bytes: int, authenticated: bool = False) -> None:
        self._digest = digest
        #: Blobs come authenticated (unsealed under their names): no hash to check.
        self._authenticated = authenticated
        self._name = operator.itemgetter(slice(0, digest))
        self._max = max_bytes
        self._unwrap = Unwrapper(max_bytes)
        self._nodes: dict[bytes, bytes | tuple[bytes, list[bytes]]] = {}
        # Large values not spliced into the text: parsed a piece at a time (see _Part).
        self._parts: list[_Part] = []
        self._aside = 0  # the bytes of their texts
        #: Whether the rebuilt text may hold a typed value's tag (set by :meth:`steps`):
        #: when it does not, the values need no walk (:func:`~.typed.has_tags`).
        self.tagged = True

    def steps(self, root: bytes, text_crc: int | None = None) -> Steps[Any]:
        """Fetch and verify the tree under ``root``; return the parsed state.

        With ``text_crc`` (the record's checksum of the whole text) the leaves, nearly all
        of the bytes, are not hashed one by one: the rebuilt text is checked once, and only
        a mismatch hashes every node, to name the damaged one. Nodes with references are
        hashed either way (a few per cent of a tree).
        """
        digest = self._digest
        unwrap = self._unwrap
        nodes = self._nodes
        authenticated = self._authenticated
        hashed = text_crc is None and not authenticated
        root_node = unwrap(root)
        root_refs = node_refs(root_node, digest)
        pending = list(dict.fromkeys(root_refs))
        while pending:
            got = yield pending
            try:
                stored = list(map(got.__getitem__, pending))
            except KeyError as exc:
                raise _corrupt(f"missing blob {bytes(exc.args[0]).hex()}") from None
            is_leaf = list(map(_is_plain_leaf, stored))
            if all(is_leaf):
                unwrap.spend(sum(map(len, stored)) - len(stored))
                if hashed:
                    self._check_leaves(pending, stored)
                nodes.update(zip(pending, stored, strict=True))
                break  # leaves reference nothing: the tree is complete
            leaves = list(itertools.compress(pending, is_leaf))
            leaf_blobs = list(itertools.compress(stored, is_leaf))
            unwrap.spend(sum(map(len, leaf_blobs)) - len(leaf_blobs))
            if hashed:
                self._check_leaves(leaves, leaf_blobs)
            nodes.update(zip(leaves, leaf_blobs, strict=True))
            level: dict[bytes, None] = {}
            for h, blob, leaf in zip(pending, stored, is_leaf, strict=True):
                if leaf:
                    continue
                node = unwrap(blob)
                value = node.startswith(LEAF)
                # Nodes that reference others are hashed whatever the text checksum says:
                # a damaged reference must be named as such, not as the blob it misnames.
                if (
                    (hashed or not value)
                    and not authenticated
                    and _sha256(node).digest()[:digest] != h
                ):
                    raise _corrupt(f"blob {h.hex()} does not match its hash")
                refs = _NO_HASHES if value else node_refs(node, digest)
                nodes[h] = (node, refs)
                level.update(dict.fromkeys(refs))
            pending = [h for h in level if h not in nodes]
        if not root_refs and root_node[:1] == b"V":
            self.tagged = has_tags(root_node)
            return loads(root_node[5:])  # a small state kept whole in the root
        text = bytearray()
        try:
            self._emit(root_node, root_refs, text, 0)
        except (CheckpointCorruptedError, ValueError, TypeError, KeyError, IndexError):
            if not hashed:
                self._check_all()  # a damaged node names itself before a malformed one
            raise
        # A text checksum says the fast encoder wrote the text: orjson reads it exactly.
        parse = loads if text_crc is None else loads_fast
        try:
            crc, tagged, parts = self._read_parts(text, parse)
        except (CheckpointCorruptedError, ValueError, TypeError, IndexError, RecursionError):
            if not hashed:
                self._check_all()  # a damaged blob names itself before what it broke
            raise
        if text_crc is not None and crc != text_crc:
            self._check_all()
            raise _corrupt("state text does not match its checksum")
        self.tagged = tagged or has_tags(text)
        value = parse(text)
        return _substituted(value, parts) if parts else value

    def _read_parts(
        self, text: bytearray, parse: Callable[[bytes | bytearray], Any]
    ) -> tuple[int, bool, dict[str, Any]]:
        """The CRC-32 of the whole text, whether it may hold a tag, and the parts' values.

        The whole text is ``text`` with each large part's text in its place. A part's text
        is checked as it is parsed, a run of chunks at a time (one pass over it): the caller
        compares the checksum before it uses any value parsed here.
        """
        crc, pos, view = 0, 0, memoryview(text)
        tagged, values = False, {}
        for part in self._parts:
            crc = crc32(view[pos : part.at], crc)
            values[part.token], crc, tag = part.read(parse, crc)
            tagged = tagged or tag
            pos = part.at + len(part.placeholder)
        return crc32(view[pos:], crc), tagged, values

    def _check_all(self) -> None:
        """Hash every node fetched so far; raise for the first that does not match."""
        if self._authenticated:
            return  # each was authenticated when it was unsealed
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

    def _check_room(self, text: bytearray, more: int = 0) -> None:
        """Refuse a text that is, or would be with ``more`` bytes, over the limit."""
        if len(text) + self._aside + more > self._max:
            raise _corrupt("tree expands beyond the record size limit")

    def _emit(self, node: bytes, refs: list[bytes], text: bytearray, inner: int) -> None:
        """Append the JSON text (UTF-8) of ``node`` to ``text``.

        ``inner`` is ``ord("[")`` or ``ord("{")`` when the node is a chunk of a list or dict
        index (0 otherwise): then its brackets are left out so the chunks concatenate.
        """
        kind = node[0]
        nodes = self._nodes
        if kind != KIND_VALUE:
            self._emit_index(kind, refs, text, inner)
            return
        n = len(refs)
        base = 5 + n * (self._digest + 4)
        end = len(node)
        pos = base
        if inner:
            if end - base < 3 or node[base] != inner or node[-1] != inner + 2:  # "]" / "}"
                raise _corrupt("chunk of the wrong kind")
            pos, end = base + 1, end - 1
        elif end <= base:
            raise _corrupt("empty value node")
        view = memoryview(node)
        if n:
            offsets = struct.unpack_from(f">{n}I", node, base - 4 * n)
            for off, h in zip(offsets, refs, strict=True):
                at = base + off
                if at < pos or at + 4 > end or node[at : at + 4] != b"null":
                    raise _corrupt("reference does not point at a placeholder")
                text += view[pos:at]
                child = nodes[h]
                if isinstance(child, tuple):
                    self._emit(child[0], child[1], text, 0)
                elif len(child) > len(PLAIN_LEAF):  # a stored leaf, without a call
                    self._check_room(text, len(child))
                    if len(child) < PART_BYTES:
                        text += memoryview(child)[6:]
                    else:
                        self._set_aside(text, 0, [child], len(child) - len(PLAIN_LEAF))
                else:
                    raise _corrupt("empty value node")
                pos = at + 4
        self._check_room(text, end - pos)
        text += view[pos:end]

    def _emit_index(self, kind: int, refs: list[bytes], text: bytearray, inner: int) -> None:
        """:meth:`_emit` for a list or dict index: all its leaf chunks spliced by one join."""
        opening, closing = (b"[", b"]") if kind == KIND_LIST else (b"{", b"}")
        if inner:  # an index node is never a chunk of another index's node
            raise _corrupt("index node of the wrong kind")
        pieces: list[bytes | tuple[bytes, list[bytes]]] = []
        # Each chunk adds at least one byte and a comma: more chunks than that cannot fit.
        self._collect(kind, refs, pieces, (self._max - len(text)) // 2)
        bracket = opening[0]
        leaves = [p for p in pieces if not isinstance(p, tuple)]
        n = len(leaves)
        if n:
            if (
                min(map(len, leaves)) <= len(PLAIN_LEAF) + 2
                or bytes(map(_chunk_opening, leaves)).count(bracket) != n
                or bytes(map(_last_byte, leaves)).count(bracket + 2) != n  # "]" / "}"
            ):
                raise _corrupt("chunk of the wrong kind")
            size = sum(map(len, leaves)) - (len(PLAIN_LEAF) + 1) * n + 1
            self._check_room(text, size)
            if n == len(pieces) and size >= PART_BYTES:
                self._set_aside(text, kind, leaves, size + 1)
                return
        text += opening
        if n == len(pieces):
            text += b",".join(map(_chunk_entries, map(_view, leaves)))
        else:
            for i, piece in enumerate(pieces):
                if i:
                    text += b","
                if isinstance(piece, tuple):
                    self._emit(piece[0], piece[1], text, bracket)
                else:
                    text += _chunk_entries(_view(piece))
        self._check_room(text, 1)
        text += closing

    def _set_aside(self, text: bytearray, kind: int, blobs: list[bytes], size: int) -> None:
        """Put a placeholder in ``text`` for a large value of ``blobs`` (see _Part)."""
        part = _Part(len(text), kind, blobs, len(self._parts))
        text += part.placeholder
        self._aside += size - len(part.placeholder)
        self._parts.append(part)

    def _collect(
        self,
        kind: int,
        refs: list[bytes],
        pieces: list[bytes | tuple[bytes, list[bytes]]],
        most: int,
    ) -> None:
        """Append the chunks under index node ``refs`` to ``pieces``, in order.

        A stored leaf chunk is appended as it is, a chunk with references as its
        ``(node, refs)``; inner index nodes are descended into. More than ``most`` chunks
        are refused.
        """
        if not refs:
            raise _corrupt("empty index node")
        children = list(map(self._nodes.__getitem__, refs))
        if tuple not in map(type, children):  # the common case: leaf chunks only
            pieces.extend(children)
        else:
            for child in children:
                if isinstance(child, tuple) and child[0][0] == kind:
                    self._collect(kind, child[1], pieces, most)
                elif isinstance(child, tuple) and child[0][0] != KIND_VALUE:
                    raise _corrupt("index node of the wrong kind")
                else:
                    pieces.append(child)
        if len(pieces) > most:
            raise _corrupt("tree expands beyond the record size limit")


class _Part:
    """A large value of a rebuilt state, parsed apart from the text around it.

    One parse of a whole state holds the GIL for as long as it runs (~10 ms per MB of
    short strings), and so stalls the event loop however the read is scheduled. A list or
    dict index node whose chunks are all stored leaves, or a large leaf, is therefore not
    spliced into the text: a placeholder string goes there, runs of its chunks (~128 KB)
    are parsed alone (the GIL can pass to the loop between runs) and the value replaces
    the placeholder in the parsed state. The text checksum still covers the whole text, placeholders
    replaced by what they stand for.
    """

    __slots__ = ("at", "blobs", "kind", "placeholder", "token")

    def __init__(self, at: int, kind: int, blobs: list[bytes], index: int) -> None:
        self.at = at  # where the placeholder is in the text
        self.kind = kind  # KIND_LIST, KIND_DICT, or 0: a leaf
        self.blobs = blobs
        # A NUL, a random 128-bit nonce: no stored string can be expected to equal it.
        self.token = f"\x00aiocheckpoint-part-{_NONCE.hex()}-{index}"
        self.placeholder = orjson.dumps(self.token)

    def read(self, parse: Callable[[bytes | bytearray], Any], crc: int) -> tuple[Any, int, bool]:
        """The part's value, ``crc`` continued over its text, and whether that may hold a tag.

        A list or dict is parsed a run of chunks at a time, a long string a slice at a time.
        """
        if not self.kind:
            leaf = self.blobs[0]
            crc = crc32(memoryview(leaf)[len(PLAIN_LEAF) :], crc)
            return _parse_leaf(leaf, parse), crc, _may_hold_tag(leaf)
        # Each run's container is merged and dropped at once: kept until the end, the
        # hundreds of them outlive young collections and are promoted, which brings on a
        # full collection (tens of ms holding the GIL) every few large reads.
        kind: type = list if self.kind == KIND_LIST else dict
        merged: list[Any] | dict[str, Any] = kind()
        add: Callable[[Any], None] = merged.extend if isinstance(merged, list) else merged.update
        tagged, closing = False, memoryview(b"")
        for run in _runs(self.blobs):
            view = memoryview(run)  # "[entries]": the part's text is "[" entries,... "]"
            crc = crc32(view[1:-1], crc32(b",", crc)) if closing else crc32(view[:-1], crc)
            closing = view[-1:]
            tagged = tagged or has_tags(run)  # a tag's mark never spans a run's edge
            add(_of_kind(parse(run), kind))
        return merged, crc32(closing, crc), tagged


def _of_kind(value: Any, kind: type) -> Any:
    """``value``, if it is a ``kind`` (a list index's chunk is a list, a dict's a dict)."""
    if type(value) is not kind:
        raise _corrupt("chunk of the wrong kind")
    return value


_NONCE: Final = secrets.token_bytes(16)
#: Values at least this long are parsed apart from the rest of a state (see _Part).
PART_BYTES: Final = 1024 * 1024
#: A large list or dict is parsed in runs of its chunks of about this many bytes of text:
#: an orjson call per ~14 KB chunk cost the 10 MB resume 1.4-2.6 ms more CPU than one per
#: run (bench/NOTES.md), and a run holds the GIL for ~0.1 ms.
RUN_BYTES: Final = 128 * 1024


def _runs(blobs: list[bytes]) -> Iterator[bytes]:
    """The text of a list or dict part in runs of chunks of about ``RUN_BYTES`` each.

    A run is bracketed like its value (``[entries,entries]``: its first chunk keeps its
    opening bracket, its last its closing one), so that each parses alone to a list (a
    dict) that is a piece of the value; it is made by one ``join``.
    """
    ends = list(itertools.accumulate(map(len, blobs)))
    start = 0
    while start < len(blobs):
        reach = (ends[start - 1] if start else 0) + RUN_BYTES
        stop = min(bisect.bisect_left(ends, reach, start) + 1, len(blobs))
        if stop - start == 1:
            yield blobs[start][len(PLAIN_LEAF) :]
        else:
            first, last = memoryview(blobs[start]), memoryview(blobs[stop - 1])
            inner = map(_chunk_entries, map(_view, blobs[start + 1 : stop - 1]))
            yield b",".join((first[len(PLAIN_LEAF) : -1], *inner, last[len(PLAIN_LEAF) + 1 :]))
        start = stop


def _parse_leaf(blob: bytes, parse: Callable[[bytes | bytearray], Any]) -> Any:
    """A stored leaf's value; a long string without escapes is parsed in ~1 MB slices.

    The leaf's text is not copied out of its blob: a copy of bytes holds the GIL.
    """
    start = len(PLAIN_LEAF)
    if blob[start] != ord('"') or len(blob) < 2 * PART_BYTES or _contains(blob, b"\\"):
        return parse(blob[start:])
    view, slices, start, end = memoryview(blob), [], start + 1, len(blob) - 1
    while start < end:
        stop = min(start + PART_BYTES, end)
        while stop < end and blob[stop] & 0xC0 == 0x80:  # not inside a UTF-8 sequence
            stop += 1
        slices.append(parse(b"".join((b'"', view[start:stop], b'"'))))
        start = stop
    # One copy of the whole string, holding the GIL: no Python call builds a str without
    # it (appending in place is quadratic once other allocations follow the string).
    return "".join(slices)


def _contains(data: bytes, needle: bytes) -> bool:
    """``needle in data``, searched ~1 MB at a time (one search holds the GIL throughout)."""
    reach = PART_BYTES + len(needle) - 1
    return any(data.find(needle, at, at + reach) >= 0 for at in range(0, len(data), PART_BYTES))


def _may_hold_tag(blob: bytes) -> bool:
    """:func:`~aiocheckpoint.format.tags.may_hold_tag`, a large blob searched in slices."""
    if len(blob) < 2 * PART_BYTES:
        return has_tags(blob)
    return _contains(blob, b"$") and _contains(blob, MARK)


def _substituted(value: Any, parts: dict[str, Any]) -> Any:
    """``value`` with each placeholder string replaced by the part it stands for."""
    if type(value) is str:
        return parts.get(value, value)
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            for key, child in item.items():
                if type(child) is str and child in parts:
                    item[key] = parts[child]
                elif type(child) is dict or type(child) is list:
                    stack.append(child)
        elif type(item) is list:
            for i, child in enumerate(item):
                if type(child) is str and child in parts:
                    item[i] = parts[child]
                elif type(child) is dict or type(child) is list:
                    stack.append(child)
    return value


def drive(steps: Steps[_T], fetch: Fetch) -> _T:
    """Run a read to its end, answering each level's request with ``fetch``."""
    try:
        request = next(steps)
        while True:
            request = steps.send(fetch(request))
    except StopIteration as stop:
        result: _T = stop.value
        return result


async def adrive(steps: Steps[_T], fetch: AsyncFetch) -> _T:
    """:func:`drive` with an async ``fetch`` (one await per tree level)."""
    try:
        request = next(steps)
        while True:
            request = steps.send(await fetch(request))
    except StopIteration as stop:
        result: _T = stop.value
        return result


def guard(steps: Steps[_T]) -> Steps[_T]:
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
    """Rebuild the value that :func:`~aiocheckpoint.codec.tree.split.split_state` cut up.

    ``root`` is the split's root; ``fetch`` is called once per tree level with the hashes
    of that level and returns their stored blobs. Every blob is
    verified against its hash; a missing or mismatching blob, a malformed node, or a tree
    whose nodes or text would be longer than ``max_bytes`` raises
    :class:`CheckpointCorruptedError`. The result never shares objects between positions.
    """
    return drive(guard(Joiner(digest_size, max_bytes).steps(root)), fetch)


async def ajoin_state(
    root: bytes,
    fetch: AsyncFetch,
    *,
    digest_size: int = 16,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Any:
    """:func:`join_state` with an async ``fetch`` (one await per tree level)."""
    return await adrive(guard(Joiner(digest_size, max_bytes).steps(root)), fetch)


def _stored_refs(stored: bytes, unwrap: Unwrapper, digest: int) -> Collection[bytes]:
    """What a stored root or blob references (a sealed one: the names in its clear part)."""
    if stored[:1] == _SEALED:
        return sealed_blob_children(stored, digest)
    return node_refs(unwrap(stored), digest)


def _reference_steps(
    roots: Collection[bytes], digest: int, skip: Collection[bytes]
) -> Steps[set[bytes]]:
    unwrap = Unwrapper()
    seen: set[bytes] = set()
    if isinstance(roots, (bytes, bytearray)):  # one root rather than a collection of them
        roots = [bytes(roots)]
    pending = {h for root in roots for h in _stored_refs(root, unwrap, digest) if h not in skip}
    while pending:
        got = yield list(pending)
        seen |= pending
        level: set[bytes] = set()
        for h in pending:
            stored = got.get(h)
            if stored is None:
                raise _corrupt(f"missing blob {h.hex()}")
            if stored[:1] == _SEALED:  # an encrypted tree's: its children's names in the clear
                level.update(sealed_blob_children(stored, digest))
                continue
            node = unwrap(stored)
            if _sha256(node).digest()[:digest] != h:
                raise _corrupt(f"blob {h.hex()} does not match its hash")
            level.update(node_refs(node, digest))
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
    checkpoint. A sealed blob (an encrypted tree's) is followed through the names it lists
    in the clear, without a key and so without verifying it.
    """
    return drive(guard(_reference_steps(roots, digest_size, skip)), fetch)


async def areferenced_hashes(
    roots: Collection[bytes],
    fetch: AsyncFetch,
    *,
    digest_size: int = 16,
    skip: Collection[bytes] = (),
) -> set[bytes]:
    """:func:`referenced_hashes` with an async ``fetch``."""
    return await adrive(guard(_reference_steps(roots, digest_size, skip)), fetch)
