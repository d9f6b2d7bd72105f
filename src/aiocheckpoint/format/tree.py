"""Version-2 records: a state stored as a tree of content-addressed nodes.

Node format (the bytes that are hashed; a node is named by the first ``digest_size`` bytes
of their SHA-256)::

    b"V" | n: u32 BE | n child hashes | n offsets: u32 BE | UTF-8 JSON text
    b"L" | child hashes            a list: the concatenation of its children's lists
    b"D" | child hashes            a dict: its children's entries, in order

In a ``V`` node every reference sits *out of band*: the JSON text holds the placeholder
``null`` where child ``i`` goes, and offset ``i`` (in bytes) says where that is, so no
user value can ever be mistaken for a reference and nothing needs escaping. A *stored* blob
is one flags byte and the node (:mod:`aiocheckpoint.format.blob`).

The version-2 record keeps the version-1 header (:mod:`aiocheckpoint.format.header`) with
version 2; its body is::

    meta_len: u32 BE | digest_size: u8 | meta JSON (meta_len bytes) | root (stored blob) or nothing

``meta`` holds the checkpoint's fields as in version 1 without ``state.data``, plus
``state.text_crc32`` (the CRC-32 of the state's whole text) when the fast encoder cut the
state; a state small enough is kept inline as ``state.data`` and the root is empty.
``docs/incremental.md`` describes the format, the garbage collection scheme and the write
ordering backends must follow. This module holds what readers and backends need: the
definitions, the split's result a backend stores, and the parsing of nodes and records.
Writing is :mod:`aiocheckpoint.codec.tree.split`, reading a state back
:mod:`aiocheckpoint.codec.tree.join`.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import CheckpointCorruptedError, InvalidArgumentError
from .blob import Unwrapper, zstd
from .checksum import crc32
from .header import FORMAT_VERSION_2, HEADER, HEADER_SIZE, MAGIC, record_format_version
from .jsonread import loads
from .sealed import BLOB_SEALED, is_sealed_tree_record, sealed_blob_children, sealed_tree_refs

__all__ = [
    "COUNT",
    "DEFAULT_PARAMS",
    "KIND_DICT",
    "KIND_LIST",
    "KIND_VALUE",
    "LEAF",
    "PLAIN_LEAF",
    "V2_PREFIX",
    "SplitMemory",
    "SplitResult",
    "TreeParams",
    "node_children",
    "node_refs",
    "open_record_v2",
    "record_root_refs",
    "record_tree",
]

KIND_VALUE: Final = 0x56  # "V"
KIND_LIST: Final = 0x4C  # "L"
KIND_DICT: Final = 0x44  # "D"
#: The head of a value node without references ...
LEAF: Final = b"V\x00\x00\x00\x00"
#: ... and of its stored form, uncompressed.
PLAIN_LEAF: Final = b"\x00" + LEAF
#: A value node's reference count.
COUNT: Final = struct.Struct(">I")
#: The start of a version-2 body: meta JSON length, digest size.
V2_PREFIX: Final = struct.Struct(">IB")


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
    #: Set by an encrypting codec, never by a backend: nodes are then named by the first
    #: ``digest_size`` bytes of their HMAC-SHA256 under this key (``docs/encryption.md``).
    name_key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name_key is not None and len(self.name_key) != 32:
            raise InvalidArgumentError("name_key must be 32 bytes")
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
            zstd()


DEFAULT_PARAMS: Final = TreeParams()


class SplitMemory:
    """What a split remembers for the next split of the same workflow's state.

    Regions of chunks (see :attr:`TreeParams.bundle_chunks`) are stored as one blob while
    their data is new and one blob per chunk once edited; the next split reads here which
    form each region took, so that unchanged regions keep it (and their blobs are shared)
    and edited ones are cut finer. It holds small integers (a checksum per region and two
    per region's first and last entries), never state. Losing it costs sharing, not
    correctness: a split without it bundles every region of several chunks. It is never
    stored; it lives here because :class:`SplitResult` carries it (see
    :mod:`aiocheckpoint.codec.tree.splitmemory` for how it is kept and recovered).
    """

    __slots__ = ("edges", "first_chunks", "regions")

    def __init__(self) -> None:
        #: Region fingerprint -> whether the region was stored as one blob.
        self.regions: dict[int, bool] = {}
        #: Boundary checksums of the first and last entries of every region.
        self.edges: set[int] = set()
        #: Filled by a split made without a previous memory: region fingerprint -> the hash
        #: its first chunk has as a blob of its own. A store that holds that blob stored the
        #: region cut into chunks (:func:`~aiocheckpoint.codec.tree.splitmemory.recovered_memory`).
        self.first_chunks: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.regions) + len(self.edges) + len(self.first_chunks)


@dataclass(frozen=True, slots=True)
class SplitResult:
    """A state cut into a root and content-addressed blobs: what a backend stores.

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
    #: The bytes of ``blobs`` together, when the split counted them as it made them.
    blob_bytes: int | None = field(default=None, compare=False, repr=False)
    #: The length of the longest of ``blobs`` (0: none), when the split kept it.
    blob_max: int | None = field(default=None, compare=False, repr=False)

    def stored_bytes(self) -> int:
        """The bytes of ``blobs`` together (counted once by a split that keeps the count).

        A split made from cached sub-trees names every node of the tree, ~1,000 for a
        1 MB chat whose step adds ~20: the count keeps the size off a walk over them all.
        """
        size = self.blob_bytes
        return sum(map(len, self.blobs.values())) if size is None else size

    def largest_blob(self) -> int:
        """The length of the longest of ``blobs``, 0 if none (kept by a split that keeps it)."""
        size = self.blob_max
        if size is None:
            return len(max(self.blobs.values(), key=len)) if self.blobs else 0
        return size

    @property
    def referenced(self) -> frozenset[bytes]:
        """Every blob hash the root references, transitively."""
        return frozenset(self.children)


def _corrupt(reason: str) -> CheckpointCorruptedError:
    return CheckpointCorruptedError(reason)


_MAX_UNPACK: Final = 1024


@functools.lru_cache(maxsize=256)
def _unpacker(count: int, digest: int) -> struct.Struct:
    """Cuts ``count`` hashes out of a node in one call (an index node holds ~16)."""
    return struct.Struct(f"{digest}s" * count)


def hashes(data: bytes, digest: int) -> list[bytes]:
    """The ``digest``-byte hashes ``data`` holds back to back."""
    count, rest = divmod(len(data), digest)
    if rest:
        raise _corrupt("index node length is not a multiple of the digest size")
    if count <= _MAX_UNPACK:
        return list(_unpacker(count, digest).unpack(data))
    return [data[i : i + digest] for i in range(0, len(data), digest)]


def node_refs(node: bytes, digest: int) -> list[bytes]:
    """The hashes a node references, in order (repeats kept)."""
    kind = node[0] if node else -1
    if kind == KIND_VALUE:
        if len(node) < 5:
            raise _corrupt("truncated value node")
        (count,) = COUNT.unpack_from(node, 1)
        end = 5 + count * digest
        if len(node) < end + 4 * count:
            raise _corrupt("truncated value node")
        return hashes(node[5:end], digest) if count else []
    if kind in (KIND_LIST, KIND_DICT):
        return hashes(node[1:], digest)
    raise _corrupt(f"unknown node kind {kind}")


def node_children(stored: bytes, digest_size: int = 16) -> tuple[bytes, ...]:
    """The distinct hashes a stored blob (or a root) references directly.

    Backends use it to cascade reference-count decrements without decoding values. A
    sealed blob lists its children in the clear (:mod:`aiocheckpoint.format.sealed`).
    """
    if stored and stored[0] == BLOB_SEALED:
        return sealed_blob_children(stored, digest_size)
    return tuple(dict.fromkeys(node_refs(Unwrapper()(stored), digest_size)))


def open_record_v2(record: bytes) -> tuple[dict[str, Any], int, bytes]:
    """Verify a version-2 record; return its metadata object, digest size and root.

    The root is empty when the state is kept inline (as ``meta["state"]["data"]``). Any
    damage raises :class:`CheckpointCorruptedError`; so may ``ValueError`` and
    ``TypeError`` from a malformed metadata text, which callers map to it.
    """
    if len(record) < HEADER_SIZE:
        raise _corrupt(f"record too short ({len(record)} bytes)")
    magic, version, flags, _reserved, length, crc = HEADER.unpack_from(record)
    if magic != MAGIC:
        raise _corrupt("not an aiocheckpoint record (bad magic)")
    if version != FORMAT_VERSION_2 or flags != 0:
        raise _corrupt(f"not a version-2 record (version {version}, flags {flags:#x})")
    body = memoryview(record)[HEADER_SIZE:]
    if len(body) != length:
        raise _corrupt(f"body is {len(body)} bytes, header says {length}")
    if crc32(body) != crc:
        raise _corrupt("checksum mismatch")
    if length < V2_PREFIX.size:
        raise _corrupt("truncated version-2 body")
    meta_len, digest = V2_PREFIX.unpack_from(body)
    root_at = V2_PREFIX.size + meta_len
    if root_at > length or not 16 <= digest <= 32:
        raise _corrupt("malformed version-2 body")
    meta = loads(bytes(body[V2_PREFIX.size : root_at]))
    if type(meta) is not dict or type(meta.get("state")) is not dict:
        raise _corrupt("body is not a checkpoint object")
    root = bytes(body[root_at:])
    if ("data" in meta["state"]) == bool(root):
        raise _corrupt("a record needs exactly one of an inline state and a root")
    return meta, digest, root


def record_tree(record: bytes) -> tuple[dict[str, Any], int, bytes] | None:
    """A version-2 record's metadata, digest size and root, if it has a tree.

    None for a version-1 record or a state kept inline; a malformed record raises
    :class:`CheckpointCorruptedError` (:func:`open_record_v2`'s errors included).
    """
    if record_format_version(record) != FORMAT_VERSION_2:
        return None
    try:
        meta, digest, root = open_record_v2(record)
    except (ValueError, TypeError) as exc:
        raise _corrupt(f"undecodable record ({type(exc).__name__})") from exc
    return (meta, digest, root) if root else None


def record_root_refs(record: bytes) -> tuple[bytes, ...]:
    """The blob hashes a record references directly (none for version 1 or inline states).

    Backends use it to release a replaced or deleted record's references; a sealed tree
    record lists them in the clear (:mod:`aiocheckpoint.format.sealed`).
    """
    if record_format_version(record) == 1:
        return ()
    if is_sealed_tree_record(record):
        return sealed_tree_refs(record)
    try:
        _meta, digest, root = open_record_v2(record)
        return node_children(root, digest) if root else ()
    except (ValueError, TypeError) as exc:
        raise _corrupt(f"undecodable record ({type(exc).__name__})") from exc
