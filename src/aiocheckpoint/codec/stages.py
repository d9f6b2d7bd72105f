"""The two kinds of stage around the encoding, and the value stage the pipeline runs today.

The path of a checkpoint through :class:`~aiocheckpoint.codec.pipeline.RecordCodec`::

    Python values --[ValueStage]--> JSON-able values --[encoding]--> record (+ blobs)
                                                                          |
                                             (a BytesStage goes here) <---+

and the reverse on reads. The *value stage* turns what callers pass into values the
encoders accept, and back: today :data:`JSON_VALUES`, the validated copy of
:mod:`aiocheckpoint.codec.copy` (a typed-state stage would map its types to JSON-able values
here, and back in :meth:`ValueStage.restore`). The *bytes stage* would transform encoded
bytes (encryption): none runs today, and :class:`BytesStage` is where one goes. Adding
either touches only :mod:`aiocheckpoint.codec`.

What a bytes stage must respect (the stored formats are otherwise opaque to backends):

* records: the 20-byte header stays readable (backends read the format version byte to
  find version-2 records); the header's flags byte, 0 today, is where a sealed record would
  be marked, so that records written before the stage still read;
* blobs: backends cascade reference counts by reading a stored blob's child hashes
  (:func:`~aiocheckpoint.format.tree.node_children`), so a sealed blob must keep its node's
  hash list in the clear (seal the JSON text only), or the backends must keep the
  ``SplitResult.children`` they are given; the blob flags byte has free bits to mark it;
* a blob's name is the hash of its node before any stage, so sealing never changes which
  blobs are shared.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final, Protocol

from ..models import Checkpoint
from .copy import storable_copy, storable_copy_work

__all__ = ["JSON_VALUES", "BytesStage", "JsonValues", "ValueStage"]


class ValueStage(Protocol):
    """Python values <-> JSON-able values: the stage before encoding and after decoding."""

    def copy(self, value: Any, path: str) -> tuple[Any, bool]:
        """A validated, independent JSON-able copy of ``value``; whether its floats are finite.

        Raises :class:`~aiocheckpoint.CheckpointSerializationError` naming ``path`` (or a
        path under it) for a value it cannot store.
        """
        ...

    def copy_work(self, value: Any, path: str) -> Generator[None, None, tuple[Any, bool]]:
        """:meth:`copy` in slices, for a value nobody changes until it is done."""
        ...

    def restore(self, checkpoint: Checkpoint) -> Checkpoint:
        """The checkpoint as callers see it, from one whose values were just decoded."""
        ...


class JsonValues:
    """The value stage that runs today: JSON values as they are (``docs/serialization.md``)."""

    copy = staticmethod(storable_copy)
    copy_work = staticmethod(storable_copy_work)

    def restore(self, checkpoint: Checkpoint) -> Checkpoint:
        """Decoded JSON values are what callers get back: ``checkpoint`` unchanged."""
        return checkpoint


JSON_VALUES: Final = JsonValues()


class BytesStage(Protocol):
    """Encoded bytes -> stored bytes, and back (for example encryption). None runs today."""

    def seal(self, data: bytes) -> bytes:
        """The bytes to store for an encoded record or blob."""
        ...

    def unseal(self, data: bytes) -> bytes:
        """The encoded bytes back from stored ones; a CheckpointCorruptedError if they fail."""
        ...
