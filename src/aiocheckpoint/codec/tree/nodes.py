"""The nodes a split makes: their shapes, the sets a split adopts whole, their texts.

Shared by the splitter (:mod:`.split`) and the reuse of unchanged sub-trees
(:mod:`.subtrees`); the node format itself is :mod:`aiocheckpoint.format.tree`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Final

from ...format.checksum import crc32
from ...format.tree import COUNT, LEAF

__all__ = [
    "MIX",
    "NO_LEVEL",
    "NO_NODES",
    "NO_REFS",
    "ChunkMemo",
    "Encoded",
    "IndexLevel",
    "Node",
    "NodeSet",
    "Refs",
    "Region",
    "join_entries",
    "boundary_mix",
    "value_node_bytes",
]

Refs = list[tuple[int, bytes]]
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
NO_REFS: Final[Refs] = []
MIX: Final = 0x9E3779B1
#: A value (or a container's entry, ``"key":value``) encoded: its UTF-8 JSON text and the
#: references inside it as (byte offset of the ``null`` placeholder, hash).
Encoded = tuple[bytes, Refs]


class NodeSet:
    """Nodes a split named, in order, kept to be adopted whole (``Splitter.adopt_set``).

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
NO_LEVEL: Final[IndexLevel] = (0, (), NO_NODES)


def value_node_bytes(data: bytes, refs: Refs) -> bytes:
    """The value node of ``data``: a leaf, or its references' hashes and offsets first."""
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


def boundary_mix(crc: int, refs: Refs | None) -> int:
    """The boundary checksum of an element: CRC-32 of its text (``crc``) and child hashes."""
    if refs:
        for _, h in refs:
            crc = crc32(h, crc)
    return ((crc * MIX) & 0xFFFFFFFF) >> 8


def join_entries(
    texts: list[bytes],
    refmap: dict[int, Refs] | None,
    start: int,
    end: int,
    is_dict: bool,
    head: bytes = b"",
) -> Encoded:
    """The container text of ``texts[start:end]`` (after ``head``) and its references."""
    opening, closing = (b"{", b"}") if is_dict else (b"[", b"]")
    body = texts[start] if end - start == 1 else b",".join(texts[start:end])
    if not refmap:
        return b"".join((head, opening, body, closing)), NO_REFS
    refs: Refs = []
    pos = 1
    for i in range(start, end):
        sub = refmap.get(i)
        if sub:
            refs.extend([(pos + off, h) for off, h in sub])
        pos += len(texts[i]) + 1
    return b"".join((head, opening, body, closing)), refs
