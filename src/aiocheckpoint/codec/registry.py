"""The types a manager may store and construct: :class:`TypeRegistry` and :class:`TaggedValue`.

A stored value of a registered type names it by its registered *name*, never by an import
path: reading looks the name up here and nothing else, so it never imports a module and
never constructs a class that was not registered (docs/serialization.md).
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from ..errors import InvalidArgumentError

__all__ = ["TaggedValue", "TypeEntry", "TypeRegistry"]

_T = TypeVar("_T", bound=type)

#: Upgrade functions: the stored data of version ``v`` -> the data of version ``v + 1``.
Upgrades = Mapping[int, Callable[[Any], Any]]


@dataclasses.dataclass(frozen=True)
class TaggedValue:
    """A stored value of a type the reader did not construct (a raw read).

    ``data`` is the value's stored data, itself decoded (datetimes, tuples and the other
    standard types come back as themselves). Writing a ``TaggedValue`` stores the same
    tagged value again, so a raw read, written back, keeps the stored value exactly.
    """

    type_name: str
    version: int
    data: Any


@dataclasses.dataclass(frozen=True)
class TypeEntry:
    """One registered type: how its values are dumped to data and loaded back."""

    cls: type
    name: str
    version: int
    upgrade: Upgrades
    dump: Callable[[Any], Any]
    load: Callable[[Any], Any]
    #: A pydantic model: values in its dump follow the model's own round trip.
    model: bool = False


class TypeRegistry:
    """The classes a :class:`~aiocheckpoint.CheckpointManager` stores and reads back.

    The standard types (``datetime``, ``Decimal``, ``bytes``, ``set``, ...) need no
    registration. ``raw=True`` makes reads return a :class:`TaggedValue` for a stored type
    that is not registered, instead of raising :class:`~aiocheckpoint.UnknownTypeError`.
    """

    def __init__(self, *, raw: bool = False) -> None:
        self.raw = raw
        #: Each registered class's entry (read it; change it only through register()).
        self.classes: dict[type, TypeEntry] = {}
        #: Each registered name's entry (read it; change it only through register()).
        self.names: dict[str, TypeEntry] = {}

    def register(
        self,
        cls: _T,
        *,
        name: str | None = None,
        version: int = 1,
        upgrade: Upgrades | None = None,
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any], Any] | None = None,
    ) -> _T:
        """Allow ``cls`` in states and metadata; return ``cls`` (usable as a decorator).

        Pydantic models, dataclasses and enums need nothing more; any other class needs
        ``encode`` (value -> storable data) and ``decode`` (data -> value). ``name`` (by
        default ``module.QualName``) is what records store; ``version`` is the version of
        the data this code writes, and ``upgrade[v]`` turns data of version ``v`` into
        data of version ``v + 1`` when older records are read.
        """
        if not isinstance(cls, type):
            raise InvalidArgumentError(f"register() takes a class, not {cls!r}")
        name = f"{cls.__module__}.{cls.__qualname__}" if name is None else name
        if type(name) is not str or not name:
            raise InvalidArgumentError(f"a type name must be a non-empty str, got {name!r}")
        if type(version) is not int or version < 1:
            raise InvalidArgumentError(f"version must be an int >= 1, got {version!r}")
        steps = dict(upgrade or {})
        if any(type(v) is not int or not 1 <= v < version or not callable(steps[v]) for v in steps):
            raise InvalidArgumentError(
                f"upgrade maps versions 1..{version - 1} to functions, got {sorted(steps)!r}"
            )
        if cls in self.classes or name in self.names:
            raise InvalidArgumentError(f"{cls.__qualname__} or the name {name!r} is registered")
        entry = _entry(cls, name, version, steps, encode, decode)
        self.classes[cls] = self.names[name] = entry
        return cls

    def by_class(self, cls: type) -> TypeEntry | None:
        """The entry of exactly ``cls`` (a subclass is not its base), or None."""
        return self.classes.get(cls)

    def by_name(self, name: str) -> TypeEntry | None:
        """The entry registered under ``name``, or None."""
        return self.names.get(name)

    def __contains__(self, cls: object) -> bool:
        return cls in self.classes

    def __repr__(self) -> str:
        return f"TypeRegistry({sorted(self.names)!r})"


def _entry(
    cls: type,
    name: str,
    version: int,
    upgrade: Upgrades,
    encode: Callable[[Any], Any] | None,
    decode: Callable[[Any], Any] | None,
) -> TypeEntry:
    if (encode is None) != (decode is None):
        raise InvalidArgumentError("encode and decode go together: give both or neither")
    if encode is not None and decode is not None:
        return TypeEntry(cls, name, version, upgrade, encode, decode)
    if issubclass(cls, BaseModel):
        return TypeEntry(cls, name, version, upgrade, _model_dump, cls.model_validate, True)
    if dataclasses.is_dataclass(cls):
        return TypeEntry(cls, name, version, upgrade, _dataclass_dump, _keywords(cls))
    if issubclass(cls, enum.Enum):
        return TypeEntry(cls, name, version, upgrade, _enum_value, _member(cls))
    raise InvalidArgumentError(
        f"{cls.__qualname__} is not a pydantic model, dataclass or enum: "
        "register it with encode= and decode= functions"
    )


def _model_dump(value: BaseModel) -> Any:
    return value.model_dump(by_alias=True, round_trip=True)


def _dataclass_dump(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}


_enum_value: Final = operator.attrgetter("_value_")


def _member(cls: type[enum.Enum]) -> Callable[[Any], Any]:
    """Load an enum member from its value: a dict lookup, else ``cls(value)``."""
    members = cls._value2member_map_

    def load(value: Any) -> Any:
        try:
            return members[value]
        except (KeyError, TypeError):  # an unhashable or an aliased value: the slow path
            return cls(value)

    return load


def _keywords(cls: type) -> Callable[[Any], Any]:
    """Load a dataclass from a dict of its init fields, through its ``__init__``."""

    def load(data: Any) -> Any:
        if type(data) is not dict or not all(type(key) is str for key in data):
            raise TypeError(f"{cls.__qualname__} data must be a dict of its fields")
        return cls(**data)

    return load


EMPTY: Final = TypeRegistry()
