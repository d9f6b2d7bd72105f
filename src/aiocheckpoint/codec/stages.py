"""The value stage: Python values <-> the JSON-able values the encoders take.

The path of a checkpoint through :class:`~aiocheckpoint.codec.pipeline.RecordCodec`::

    Python values --[value stage]--> JSON-able values --[encoding]--> record (+ blobs)
                                                                          |
                                            stored bytes <--[bytes stage]-+

and the reverse on reads. The *value stage* turns what callers pass into values the
encoders accept, and back: :class:`TypedValues`, the validated copy of
:mod:`aiocheckpoint.codec.copy` in the tagged JSON form of :mod:`aiocheckpoint.format.tags`,
and :mod:`aiocheckpoint.codec.typed`'s decoder in :meth:`ValueStage.restore`, both with the
manager's :class:`~aiocheckpoint.TypeRegistry`. The *bytes stage* is encryption at rest,
:class:`~aiocheckpoint.codec.sealing.Sealer` (``docs/encryption.md``), run by the pipeline
when the manager has ``encryption=``: it keeps a record's 20-byte header readable to the
backends, and an encrypted tree's references in the clear
(:mod:`aiocheckpoint.format.sealed`), so that backends read the version byte and cascade
reference counts without the key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Generator
from typing import Any, Final, Literal, Protocol

import orjson

from ..errors import CheckpointCorruptedError
from ..models import Checkpoint, StateSnapshot, built, rebuilt
from .copy import storable_copy, storable_copy_sized, storable_copy_work
from .registry import EMPTY, TypeRegistry
from .typed import Decoder, has_tags

__all__ = ["DEFAULT_VALUES", "TypedValues", "ValueStage", "View"]

#: How a read hands values back: ``"typed"`` as themselves (an unregistered type raises),
#: ``"raw"`` with a :class:`~aiocheckpoint.TaggedValue` for each unregistered type,
#: ``"stored"`` in the tagged JSON form records hold (what the command line shows).
View = Literal["typed", "raw", "stored"]


class ValueStage(Protocol):
    """Python values <-> JSON-able values: the stage before encoding and after decoding."""

    def copy(self, value: Any, path: str) -> tuple[Any, bool]:
        """A validated, independent JSON-able copy of ``value``; whether its floats are finite.

        Raises :class:`~aiocheckpoint.CheckpointSerializationError` naming ``path`` (or a
        path under it) for a value it cannot store.
        """
        ...

    def copy_sized(self, value: Any, limit: int, path: str) -> tuple[Any, bool, int | None]:
        """:meth:`copy`, and the size bound ``exceeds`` of the copy counts, or None.

        The bound is counted while copying and given up once past ``limit``:
        ``exceeds(copy, limit)`` (:func:`~aiocheckpoint.codec.sizes.exceeds`) is
        ``bound > limit``. None when it was not counted (then ask ``exceeds``).
        """
        ...

    def copy_work(self, value: Any, path: str) -> Generator[None, None, tuple[Any, bool]]:
        """:meth:`copy` in slices, for a value nobody changes until it is done."""
        ...

    def restore(self, checkpoint: Checkpoint, text: bytes | None, view: View) -> Checkpoint:
        """The checkpoint as callers see it, from one whose values were just decoded.

        ``text`` is the JSON text the values were decoded from when the caller has it (a
        hint: text without tags needs no walk; an empty text says the caller looked at
        every text they came from and found no tag), else None. ``checkpoint`` may be
        changed.
        """
        ...

    def decode_value(self, data: Any, path: str, view: View) -> Any:
        """One value back from its JSON-able form (``data`` may be changed)."""
        ...


class TypedValues:
    """The value stage: standard and registered types in the tagged JSON form, and back."""

    #: See :meth:`ValueStage.copy` (a partial: one Python call less on the hot path).
    copy: Callable[[Any, str], tuple[Any, bool]]
    #: See :meth:`ValueStage.copy_sized` (a partial, as ``copy``).
    copy_sized: Callable[[Any, int, str], tuple[Any, bool, int | None]]

    def __init__(self, types: TypeRegistry = EMPTY) -> None:
        self.types = types
        self.copy = (
            storable_copy if types is EMPTY else functools.partial(storable_copy, types=types)
        )
        self.copy_sized = (
            storable_copy_sized
            if types is EMPTY
            else functools.partial(storable_copy_sized, types=types)
        )

    def copy_work(self, value: Any, path: str) -> Generator[None, None, tuple[Any, bool]]:
        """See :meth:`ValueStage.copy_work`."""
        return storable_copy_work(value, path, self.types)

    def restore(self, checkpoint: Checkpoint, text: bytes | None, view: View) -> Checkpoint:
        """See :meth:`ValueStage.restore`."""
        if view == "stored":
            return checkpoint
        if text is None:
            text = _probe(checkpoint)
        if text is not None and not has_tags(text):
            return checkpoint
        decoder = Decoder(self.types, view == "raw")
        data = _mapping(decoder, checkpoint.state_snapshot.data, "state")
        return _with_state(decoder, checkpoint, data)

    def restore_shared(self, checkpoint: Checkpoint, plain: Container[int]) -> Checkpoint:
        """:meth:`restore` (``"raw"``) of a checkpoint whose state shares its containers.

        The state is decoded into a copy of its own (:meth:`~.typed.Decoder.private`),
        which changes nothing it is given; containers whose id is in ``plain`` (known to
        hold no tag) are copied without a look for tags. The metadata, the checkpoint's
        own, are decoded in place.
        """
        decoder = Decoder(self.types, True)
        data = decoder.private(checkpoint.state_snapshot.data, "state", plain)
        if type(data) is not dict:
            raise CheckpointCorruptedError("state is not an object")
        return _with_state(decoder, checkpoint, data)

    def decode_value(self, data: Any, path: str, view: View) -> Any:
        """See :meth:`ValueStage.decode_value`."""
        return data if view == "stored" else Decoder(self.types, view == "raw").value(data, path)


DEFAULT_VALUES: Final = TypedValues()


def _with_state(decoder: Decoder, checkpoint: Checkpoint, data: dict[str, Any]) -> Checkpoint:
    """``checkpoint`` with ``data`` (decoded) as its state's data, its metadata decoded."""
    snapshot = checkpoint.state_snapshot
    state = built(
        StateSnapshot,
        data=data,
        version=snapshot.version,
        metadata=_mapping(decoder, snapshot.metadata, "state.metadata"),
    )
    metadata = _mapping(decoder, checkpoint.metadata, "metadata")
    return rebuilt(checkpoint, state_snapshot=state, metadata=metadata)


def _probe(checkpoint: Checkpoint) -> bytes | None:
    """The compact text of a decoded checkpoint's values (orjson: ~1 ms per MB), or None.

    For a state rebuilt from a tree, whose text the pipeline does not keep: finding no tag
    in it is cheaper than walking it. None (an int beyond 64 bits) means: walk.
    """
    snapshot = checkpoint.state_snapshot
    try:
        return orjson.dumps((snapshot.data, snapshot.metadata, checkpoint.metadata))
    except TypeError:
        return None


def _mapping(decoder: Decoder, data: dict[str, Any], path: str) -> dict[str, Any]:
    """A decoded state or metadata dict, which must still be a dict (a crafted tag is not)."""
    value = decoder.value(data, path)
    if type(value) is not dict:
        raise CheckpointCorruptedError(f"{path} is not an object")
    return value
