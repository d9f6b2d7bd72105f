"""Compressing blobs: the writer's side of :mod:`aiocheckpoint.format.blob`.

A node longer than 64 bytes is stored as a zstd frame when ``TreeParams.compression`` is
``"zstd"`` and the frame saves more than 8 bytes; anything else is stored as it is. The
node's hash is over its uncompressed bytes, so compression never changes a blob's name.
"""

from __future__ import annotations

from typing import Any

from ..format.blob import FLAG_ZSTD, zstd
from ..format.tree import TreeParams

__all__ = ["Compressor"]


class Compressor:
    """Makes stored blobs out of nodes, compressing them as ``params`` say."""

    __slots__ = ("_zc",)

    def __init__(self, params: TreeParams) -> None:
        self._zc: Any = (
            zstd().ZstdCompressor(level=params.zstd_level) if params.compression else None
        )

    @property
    def active(self) -> bool:
        """Whether blobs may be compressed (else a blob is a zero byte and the node)."""
        return self._zc is not None

    def wrap(self, node: bytes | memoryview) -> bytes:
        """The stored blob of ``node``."""
        if self._zc is not None and len(node) > 64:
            packed: bytes = self._zc.compress(node)
            if len(packed) + 8 < len(node):
                return bytes((FLAG_ZSTD,)) + packed
        return b"\x00" + node
