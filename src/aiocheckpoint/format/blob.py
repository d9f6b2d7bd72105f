"""Stored blobs: one flags byte, then a node (see :mod:`aiocheckpoint.format.tree`).

Flags bit 0 set means the rest is a zstd frame that decompresses to the node; no other
bit is defined. Compressing is the writer's choice (:mod:`aiocheckpoint.codec.compress`);
every reader, backends included, undoes it here.
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import CheckpointCorruptedError
from .limits import DEFAULT_MAX_RECORD_BYTES

__all__ = ["FLAG_ZSTD", "Unwrapper", "zstd"]

#: The flags byte of a blob whose node is a zstd frame.
FLAG_ZSTD: Final = 0x01


def zstd() -> Any:
    """The ``zstandard`` module; ImportError naming the extra when it is not installed."""
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - zstandard is installed in development
        raise ImportError(
            "zstd compression of checkpoint blobs needs the zstandard package: "
            "pip install 'aiocheckpoint[zstd]'"
        ) from exc
    return zstandard


class Unwrapper:
    """Turns stored blobs back into nodes, sharing one zstd decompressor per read."""

    __slots__ = ("_zd",)

    def __init__(self) -> None:
        self._zd: Any = None

    def __call__(self, stored: bytes) -> bytes:
        """The node a stored blob holds; CheckpointCorruptedError if it holds none."""
        if not stored:
            raise CheckpointCorruptedError("empty blob")
        flags = stored[0]
        if flags == 0:
            return stored[1:]
        if flags != FLAG_ZSTD:
            raise CheckpointCorruptedError(f"unknown blob flags {flags:#x}")
        if self._zd is None:
            self._zd = zstd().ZstdDecompressor()
        try:
            out: bytes = self._zd.decompress(stored[1:], max_output_size=DEFAULT_MAX_RECORD_BYTES)
        except Exception as exc:  # zstandard.ZstdError and friends
            raise CheckpointCorruptedError(f"undecompressable blob ({type(exc).__name__})") from exc
        return out
