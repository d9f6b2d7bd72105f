"""Stored blobs: one flags byte, then a node (see :mod:`aiocheckpoint.format.tree`).

Flags bit 0 set means the rest is a zstd frame that decompresses to the node; no other
bit is defined. Compressing is the writer's choice (:mod:`aiocheckpoint.codec.compress`);
every reader, backends included, undoes it here, within a byte budget: a frame is never
inflated past what the budget has left (a frame that declares a larger size is refused
before any output is allocated).
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import CheckpointCorruptedError
from .limits import DEFAULT_MAX_RECORD_BYTES

__all__ = ["FLAG_ZSTD", "Unwrapper", "zstd"]

#: The flags byte of a blob whose node is a zstd frame.
FLAG_ZSTD: Final = 0x01
#: What the reader needs to read compressed blobs.
_EXTRA: Final = "pip install 'aiocheckpoint[zstd]'"


def zstd() -> Any:
    """The ``zstandard`` module; ImportError naming the extra when it is not installed."""
    try:
        import zstandard
    except ImportError as exc:
        raise ImportError(
            f"zstd compression of checkpoint blobs needs the zstandard package: {_EXTRA}"
        ) from exc
    return zstandard


class Unwrapper:
    """Turns stored blobs back into nodes, sharing one zstd decompressor per read.

    ``budget`` is how many node bytes all the blobs it unwraps may hold together (one
    record's tree); None bounds each blob on its own by the default record size limit.
    Going past it raises :class:`CheckpointCorruptedError`.
    """

    __slots__ = ("_zd", "left")

    def __init__(self, budget: int | None = None) -> None:
        self._zd: Any = None
        #: The node bytes still allowed (None: no shared budget).
        self.left = budget

    def __call__(self, stored: bytes) -> bytes:
        """The node a stored blob holds; CheckpointCorruptedError if it holds none."""
        if not stored:
            raise CheckpointCorruptedError("empty blob")
        flags = stored[0]
        if flags == 0:
            self.spend(len(stored) - 1)
            return stored[1:]
        if flags != FLAG_ZSTD:
            raise CheckpointCorruptedError(f"unknown blob flags {flags:#x}")
        out = self._inflate(stored[1:])
        self.spend(len(out))
        return out

    def spend(self, size: int) -> None:
        """Count ``size`` node bytes against the budget."""
        if self.left is not None:
            self.left -= size
            if self.left < 0:
                raise CheckpointCorruptedError("tree holds more than the record size limit")

    def _inflate(self, frame: bytes) -> bytes:
        """Decompress a frame into at most what the budget allows (bounded output)."""
        room = DEFAULT_MAX_RECORD_BYTES if self.left is None else self.left
        if self._zd is None:
            self._zd = _decompressor()
        zstandard, zd = self._zd
        try:
            declared = zstandard.frame_content_size(frame)
            if declared > room:
                raise CheckpointCorruptedError(
                    f"blob inflates to {declared} bytes, over the record size limit"
                )
            if room < 1:  # a max_output_size of 0 would mean "unbounded"
                raise CheckpointCorruptedError("tree holds more than the record size limit")
            # With its size declared the frame decompresses into exactly that many bytes;
            # without, into at most ``room`` (a larger one fails as incomplete).
            out: bytes = zd.decompress(frame, max_output_size=room)
        except CheckpointCorruptedError:
            raise
        except Exception as exc:  # zstandard.ZstdError and friends
            raise CheckpointCorruptedError(f"undecompressable blob ({type(exc).__name__})") from exc
        return out


def _decompressor() -> tuple[Any, Any]:
    """The zstandard module and a decompressor; a typed error naming the missing extra."""
    try:
        zstandard = zstd()
    except ImportError:
        raise CheckpointCorruptedError(
            f"a blob is zstd-compressed, and reading it needs the zstandard package ({_EXTRA})"
        ) from None
    return zstandard, zstandard.ZstdDecompressor()
