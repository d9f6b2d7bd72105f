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
carries the checkpoint's fields plus the root node; :func:`decode_checkpoint_v2` reads
records of both versions. ``docs/incremental.md`` describes the format, the garbage
collection scheme and the write ordering backends must follow.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import zlib
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

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
# hashlib's BLAKE2b, and every node is hashed again on every read (docs/incremental.md).
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


# An entry of a container being encoded: its JSON text (``"key":value`` in dicts) and the
# references inside it as (character offset of the ``null`` placeholder, hash).
_Entry = tuple[str, _Refs]


class _Splitter:
    __slots__ = ("_digest", "_known", "_zc", "blobs", "children", "p")

    def __init__(self, params: TreeParams, known: Collection[bytes]) -> None:
        self.p = params
        self._digest = params.digest_size
        self._known = known
        self.blobs: dict[bytes, bytes] = {}
        self.children: dict[bytes, tuple[bytes, ...]] = {}
        self._zc: Any = (
            _zstd().ZstdCompressor(level=params.zstd_level) if params.compression else None
        )

    def encode(self, value: Any) -> tuple[str, _Refs]:
        kind = type(value)
        if kind is dict:
            if not value:
                return "{}", _NO_REFS
            entries: list[_Entry] = []
            for key, item in value.items():
                head = _encode_str(key) + ":"
                text, refs = self.encode(item)
                if refs:
                    shift = len(head)
                    refs = [(off + shift, h) for off, h in refs]
                entries.append((head + text, refs))
            return self._container(entries, True)
        if kind is list:
            if not value:
                return "[]", _NO_REFS
            return self._container([self.encode(item) for item in value], False)
        text = _scalar_text(value)
        if len(text) > self.p.inline_limit:
            return "null", [(0, self.value_node(text, _NO_REFS))]
        return text, _NO_REFS

    def _container(self, entries: list[_Entry], is_dict: bool) -> tuple[str, _Refs]:
        # What the container costs in a node: its text plus what its references take.
        size = len(entries) + 1
        for text, refs in entries:
            size += len(text)
            if refs:
                size += _REF_WEIGHT * len(refs)
        if size <= self.p.inline_limit:
            return _join_entries(entries, is_dict)
        if size <= 2 * self.p.chunk_avg:
            # Too small to be worth cutting: one node. A container that grows past this
            # is cut once; from then on its boundaries are stable.
            return "null", [(0, self.value_node(*_join_entries(entries, is_dict)))]
        chunks = [self.value_node(*_join_entries(c, is_dict)) for c in self._chunks(entries)]
        return "null", [(0, self._index(chunks, _KIND_DICT if is_dict else _KIND_LIST))]

    def _chunks(self, entries: list[_Entry]) -> list[list[_Entry]]:
        p = self.p
        chunks: list[list[_Entry]] = []
        current: list[_Entry] = []
        size = 0
        for entry in entries:
            current.append(entry)
            weight = len(entry[0]) + 1 + _REF_WEIGHT * len(entry[1])
            size += weight
            if size >= p.chunk_max or (
                size >= p.chunk_min and _entry_mix(entry) % p.chunk_avg < weight
            ):
                chunks.append(current)
                current, size = [], 0
        if current:
            chunks.append(current)
        return chunks

    def _index(self, hashes: list[bytes], kind: int) -> bytes:
        p = self.p
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
            hashes = [
                g[0] if len(g) == 1 else self._add(bytes((kind,)) + b"".join(g), g) for g in groups
            ]
        return hashes[0]

    def value_node(self, text: str, refs: _Refs) -> bytes:
        return self._add(_value_node(text, refs), [h for _, h in refs])

    def _add(self, node: bytes, hashes: list[bytes]) -> bytes:
        h = _sha256(node).digest()[: self._digest]
        if h not in self.children:
            self.children[h] = tuple(dict.fromkeys(hashes))
            if h not in self._known:
                self.blobs[h] = self.wrap(node)
        return h

    def wrap(self, node: bytes) -> bytes:
        if self._zc is not None and len(node) > 64:
            packed: bytes = self._zc.compress(node)
            if len(packed) + 8 < len(node):
                return bytes((_FLAG_ZSTD,)) + packed
        return b"\x00" + node


def _value_node(text: str, refs: _Refs) -> bytes:
    data = text.encode()
    n = len(refs)
    if not n:
        return _LEAF + data
    offsets = [off for off, _ in refs]
    if len(data) != len(text):  # not ASCII: turn character offsets into byte offsets
        offsets, at, prev = [], 0, 0
        for off, _ in refs:
            at += len(text[prev:off].encode())
            offsets.append(at)
            prev = off
    return b"".join(
        (b"V", _COUNT.pack(n), *[h for _, h in refs], struct.pack(f">{n}I", *offsets), data)
    )


def _entry_mix(entry: _Entry) -> int:
    crc = zlib.crc32(entry[0].encode("utf-8", "surrogatepass"))
    for _, h in entry[1]:
        crc = zlib.crc32(h, crc)
    return ((crc * _MIX) & 0xFFFFFFFF) >> 8


def _join_entries(entries: list[_Entry], is_dict: bool) -> tuple[str, _Refs]:
    refs: _Refs = []
    pos = 1
    for text, sub in entries:
        if sub:
            refs.extend([(pos + off, h) for off, h in sub])
        pos += len(text) + 1
    body = ",".join([e[0] for e in entries])
    return ("{" + body + "}" if is_dict else "[" + body + "]"), refs


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
    data: Any, params: TreeParams = DEFAULT_PARAMS, *, known: Collection[bytes] = ()
) -> SplitResult:
    """Cut a storable value into a root and content-addressed blobs.

    ``data`` must be what :func:`~aiocheckpoint.serde.to_storable` returns. Values whose
    encoding is longer than ``params.inline_limit`` become blobs; a value whose whole
    encoding fits in ``params.root_inline_limit`` bytes is kept in the root with no blobs.
    Blobs whose hash is in ``known`` (already stored) are not encoded again and are left
    out of ``blobs``. Raises :class:`CheckpointSerializationError` for unstorable values.
    """
    return _split(data, params, known, inline=True)


def _split(data: Any, params: TreeParams, known: Collection[bytes], inline: bool) -> SplitResult:
    splitter = _Splitter(params, known)
    limit = params.root_inline_limit
    try:
        if inline and limit and not _exceeds(data, limit):
            body = _dumps(data, False)  # exact path: NaN and big ints stay as they are
            if len(body) <= limit:
                return SplitResult(splitter.wrap(b"V\x00\x00\x00\x00" + body), {}, {}, ())
        text, refs = splitter.encode(data)
        root = _value_node(text, refs)
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, CheckpointSerializationError):
            raise
        raise CheckpointSerializationError("state", str(exc)) from exc
    return SplitResult(
        splitter.wrap(root),
        splitter.blobs,
        splitter.children,
        tuple(dict.fromkeys(h for _, h in refs)),
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
    if len(data) % digest:
        raise _corrupt("index node length is not a multiple of the digest size")
    return [data[i : i + digest] for i in range(0, len(data), digest)]


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


class _Joiner:
    """Fetches a tree level by level, verifying every node, then parses it in one go.

    The value nodes' texts are spliced together at their placeholders into one JSON
    document that a single ``json.loads`` turns into the state: the same parse the
    version-1 format does, plus a hash and a few slices per node.
    """

    def __init__(self, digest: int, max_bytes: int) -> None:
        self._digest = digest
        self._budget = max_bytes
        self._unwrap = _Unwrapper()
        self._nodes: dict[bytes, tuple[bytes, list[bytes]]] = {}

    def steps(self, root: bytes) -> _Steps[Any]:
        digest = self._digest
        unwrap = self._unwrap
        nodes = self._nodes
        root_node = unwrap(root)
        root_refs = _node_refs(root_node, digest)
        pending = dict.fromkeys(root_refs)
        while pending:
            got = yield list(pending)
            level: dict[bytes, None] = {}
            for h in pending:
                stored = got.get(h)
                if stored is None:
                    raise _corrupt(f"missing blob {h.hex()}")
                node = stored[1:] if stored[:1] == b"\x00" else unwrap(stored)
                if _sha256(node).digest()[:digest] != h:
                    raise _corrupt(f"blob {h.hex()} does not match its hash")
                refs = _NO_HASHES if node[:5] == _LEAF else _node_refs(node, digest)
                nodes[h] = (node, refs)
                for child in refs:
                    if child not in nodes and child not in pending:
                        level[child] = None
            pending = level
        if not root_refs and root_node[:1] == b"V":
            return _loads(root_node[5:])  # a small state kept whole in the root
        out: list[bytes | memoryview] = []
        self._emit(root_node, root_refs, out, 0)
        return _loads(b"".join(out))

    def _emit(
        self, node: bytes, refs: list[bytes], out: list[bytes | memoryview], inner: int
    ) -> None:
        """Append the JSON text (UTF-8) of ``node`` to ``out``.

        ``inner`` is ``ord("[")`` or ``ord("{")`` when the node is a chunk of a list or dict
        index (0 otherwise): then its brackets are left out so the chunks concatenate.
        """
        kind = node[0]
        if kind != _KIND_VALUE:
            opening, closing = (b"[", b"]") if kind == _KIND_LIST else (b"{", b"}")
            if inner and inner != opening[0]:
                raise _corrupt("index node of the wrong kind")
            if not inner:
                out.append(opening)
            nodes = self._nodes
            for i, h in enumerate(refs):
                if i:
                    out.append(b",")
                child, child_refs = nodes[h]
                self._emit(child, child_refs, out, opening[0])
            if not inner:
                out.append(closing)
            return
        n = len(refs)
        base = 5 + n * (self._digest + 4)
        end = len(node)
        self._budget -= end - base
        if self._budget < 0:
            raise _corrupt("tree expands beyond the record size limit")
        pos = base
        if inner:
            if end - base < 3 or node[base] != inner or node[-1] != inner + 2:  # "]" / "}"
                raise _corrupt("chunk of the wrong kind")
            pos, end = base + 1, end - 1
        view = memoryview(node)
        if n:
            offsets = struct.unpack_from(f">{n}I", node, base - 4 * n)
            nodes = self._nodes
            for off, h in zip(offsets, refs, strict=True):
                at = base + off
                if at < pos or at + 4 > end or node[at : at + 4] != b"null":
                    raise _corrupt("reference does not point at a placeholder")
                out.append(view[pos:at])
                child, child_refs = nodes[h]
                if child_refs or child[0] != _KIND_VALUE:
                    self._emit(child, child_refs, out, 0)
                else:  # the common leaf, without a call
                    self._budget -= len(child) - 5
                    if self._budget < 0:
                        raise _corrupt("tree expands beyond the record size limit")
                    out.append(memoryview(child)[5:])
                pos = at + 4
        out.append(view[pos:end])


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
    checkpoint: Checkpoint, params: TreeParams = DEFAULT_PARAMS, *, known: Collection[bytes] = ()
) -> tuple[bytes, SplitResult]:
    """Encode a checkpoint as a version-2 record plus the blobs its state needs.

    A checkpoint whose JSON (state included) fits in ``params.root_inline_limit`` bytes is
    stored whole in the record, with no blobs and no root (``result.root == b""``).
    Otherwise the caller must make every blob in ``result.blobs`` durable before the
    record (see docs/incremental.md). The state must already be storable.
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
    split = _split(data, params, known, inline=False)
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
    if root:
        joiner = _Joiner(digest, DEFAULT_MAX_RECORD_BYTES)
        meta["state"]["data"] = yield from joiner.steps(root)
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

    Any damage -- to the record, a missing blob or a blob that fails its hash -- raises
    :class:`CheckpointCorruptedError`, as does a record of another workflow or step.
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
