"""A returned checkpoint's state that the sub-tree cache shares, copied when first read.

``create_checkpoint`` of a large :class:`~aiocheckpoint.SharedState` hands back the state it
just split, whose sub-trees are the cache's: the next checkpoint of the workflow reuses their
texts as long as they are the same objects. A caller changing them in place would change
what an earlier checkpoint returned and make the next record disagree with its checksum.
Copying the whole state for every checkpoint costs what the cache saves (a 1 MB state: ~1 ms
of the loop), while most callers never read the returned state. So the snapshot handed back
copies its ``data`` the first time it is read, and the cache's objects never reach the caller.
"""

from __future__ import annotations

from typing import Any

from pydantic.main import TupleGenerator

from ..models import StateSnapshot, built
from .copy import json_copy


class LentSnapshot(StateSnapshot):
    """A :class:`StateSnapshot` whose ``data`` is a copy of the shared state, made at first read.

    Reading ``data`` gives the caller's own copy (a plain JSON-able tree: the state holds no
    tag). It compares equal to a :class:`StateSnapshot` of the same fields, and shows as one.
    Serializing it (``model_dump``, ``model_dump_json``) reads the shared tree and changes
    nothing; iterating over it (``dict(snapshot)``) reads ``data``.
    """

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StateSnapshot):
            return NotImplemented
        mine, theirs = self.__dict__, other.__dict__
        return bool(
            mine["version"] == theirs["version"]
            and mine["metadata"] == theirs["metadata"]
            and mine["data"] == theirs["data"]
        )

    __hash__ = None  # type: ignore[assignment]

    def __iter__(self) -> TupleGenerator:
        """The fields as ``(name, value)`` pairs (``dict(snapshot)``), ``data`` copied first."""
        _ = self.data
        return super().__iter__()

    @classmethod
    def __repr_name__(cls) -> str:
        return StateSnapshot.__name__


def _data(self: LentSnapshot) -> Any:
    """The snapshot's data, copied from the shared tree at the first read."""
    fields, lent = self.__dict__, self.__pydantic_private__
    if lent is not None and fields["data"] is lent.get("shared"):
        fields["data"] = json_copy(fields["data"])
        lent.clear()
    return fields["data"]


# Set after the class is made: pydantic would take a property in the class body for a field.
LentSnapshot.data = property(_data)  # type: ignore[assignment]


def lent_snapshot(snapshot: StateSnapshot) -> LentSnapshot:
    """``snapshot`` (holding the shared tree) as a :class:`LentSnapshot`."""
    lent = built(LentSnapshot, **snapshot.__dict__)
    object.__setattr__(lent, "__pydantic_private__", {"shared": lent.__dict__["data"]})
    return lent
