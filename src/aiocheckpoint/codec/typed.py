"""Typed values <-> their tagged JSON form (:mod:`aiocheckpoint.format.tags`).

:class:`Encoder` is the value stage's full walk: it validates a value, names the path of
anything it cannot store, and returns a fresh JSON-able copy in which every standard type
and every registered type is tagged (:mod:`aiocheckpoint.codec.copy` runs a faster walk
first and falls back to it). :class:`Decoder` turns decoded JSON back into the values: it
constructs only the standard types and the registry's classes, through their normal
validation, and refuses any tag it does not know.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import operator
import re
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Container, Iterable
from datetime import date, datetime, time, timedelta, timezone
from typing import Any, Final, TypeVar

from pydantic_core import to_jsonable_python

from ..errors import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    CheckpointTypeError,
    TypeVersionError,
    UnknownTypeError,
)
from ..format import tags
from ..format.jsonread import int_too_long
from ..format.limits import MAX_DEPTH, MAX_INT_DIGITS, MAX_SHARED_HASH
from .paths import checked_text, child_path, safe_repr
from .registry import TaggedValue, TypeEntry, TypeRegistry

__all__ = [
    "COLLECTIONS",
    "SCALARS",
    "Decoder",
    "Encoder",
    "crowded",
    "has_tags",
    "needs_map",
    "ordered",
]


def _b64(value: bytes | bytearray) -> str:
    return base64.b64encode(value).decode("ascii")


def _timedelta(value: timedelta) -> list[int]:
    return [value.days, value.seconds, value.microseconds]


#: The standard types stored as one tag over a scalar: their tag and their data.
SCALARS: Final[dict[type, tuple[str, Callable[[Any], Any]]]] = {
    datetime: (tags.DATETIME, datetime.isoformat),
    date: (tags.DATE, date.isoformat),
    time: (tags.TIME, time.isoformat),
    timedelta: (tags.TIMEDELTA, _timedelta),
    uuid.UUID: (tags.UUID, operator.attrgetter("hex")),
    decimal.Decimal: (tags.DECIMAL, str),
    bytes: (tags.BYTES, _b64),
    bytearray: (tags.BYTEARRAY, _b64),
}
#: The standard collections stored as one tag over an array of their items.
COLLECTIONS: Final[dict[type, str]] = {
    tuple: tags.TUPLE,
    set: tags.SET,
    frozenset: tags.FROZENSET,
}


def ordered(items: Iterable[Any]) -> list[Any]:
    """A set's items in a stable order where they compare (unchanged sets dedupe)."""
    try:
        return sorted(items)
    except TypeError:
        return list(items)


def crowded(items: Collection[Any]) -> bool:
    """Whether more than ``MAX_SHARED_HASH`` of ``items`` (hashable) share one hash value."""
    if len(items) <= MAX_SHARED_HASH:
        return False
    return max(Counter(map(hash, items)).values()) > MAX_SHARED_HASH


_CROWDED: Final = (
    f"more than {MAX_SHARED_HASH} of its items share one hash value "
    "(building it takes time quadratic in their number)"
)


def needs_map(value: dict[Any, Any]) -> bool:
    """Whether a dict must be stored as ``$map``: a non-str key, or it would read as a tag."""
    if len(value) == 1:
        key = next(iter(value))
        return type(key) is not str or key[:1] == tags.TAG_START
    return not all(type(key) is str for key in value)


def _short_int(value: int, path: str) -> int:
    if int_too_long(value):
        raise CheckpointSerializationError(
            path,
            f"an int of more than {MAX_INT_DIGITS} digits is longer than a store keeps "
            "(reading one takes time that grows faster than its length)",
        )
    return value


class Encoder:
    """Validates a value and returns a fresh copy of it in the tagged JSON form."""

    __slots__ = ("_active", "_lenient", "_types", "nonfinite")

    def __init__(self, types: TypeRegistry) -> None:
        self._types = types
        self._active: set[int] = set()
        self._lenient = False  # inside a pydantic model's dump
        self.nonfinite = False

    def walk(self, value: Any, path: str, depth: int) -> Any:
        """The tagged JSON form of ``value`` at ``path``, a container at ``depth``."""
        kind = type(value)
        if kind is str:
            return checked_text(value, path)
        if kind is bool or value is None:
            return value
        if kind is int:
            return _short_int(value, path)
        if kind is float:
            self.nonfinite = self.nonfinite or value - value != 0.0
            return value
        scalar = SCALARS.get(kind)
        if scalar is not None:
            _room(path, depth + 1)
            return {scalar[0]: scalar[1](value)}
        if kind is dict or kind is list:
            return self._container(value, path, depth)
        tag = COLLECTIONS.get(kind)
        if tag is not None:
            _room(path, depth)
            if kind is not tuple and crowded(value):
                raise CheckpointSerializationError(path, _CROWDED)
            items = value if kind is tuple else ordered(value)
            return {tag: self._container(list(items), path, depth + 1)}
        return self._typed(value, path, depth)

    def _typed(self, value: Any, path: str, depth: int) -> Any:
        kind = type(value)
        entry = self._types.by_class(kind)
        if entry is not None:
            return self._entry(entry, value, path, depth)
        if kind is TaggedValue:
            return self._tagged(value, path, depth)
        if self._lenient:  # the model's own JSON form, which its validation reads back
            return self.walk(_jsonable(value, path), path, depth)
        raise CheckpointSerializationError(
            path,
            f"{kind.__module__}.{kind.__qualname__} is not a registered type "
            "(register it with TypeRegistry.register and pass types= to the manager)",
        )

    def _tagged(self, value: TaggedValue, path: str, depth: int) -> Any:
        name, version = value.type_name, value.version
        if type(name) is not str or not name or type(version) is not int or version < 1:
            raise CheckpointSerializationError(
                path, "a TaggedValue needs a non-empty str type_name and an int version >= 1"
            )
        _room(path, depth + 1)
        return {tags.TYPED: [name, version, self.walk(value.data, path, depth + 2)]}

    def _entry(self, entry: TypeEntry, value: Any, path: str, depth: int) -> Any:
        _room(path, depth + 1)
        marker = id(value)
        if marker in self._active:
            raise CheckpointSerializationError(path, "the value contains itself (a cycle)")
        self._active.add(marker)
        lenient = self._lenient
        self._lenient = lenient or entry.model
        try:
            dumped = entry.dump(value)
            return {tags.TYPED: [entry.name, entry.version, self.walk(dumped, path, depth + 2)]}
        except CheckpointSerializationError:
            raise
        except Exception as exc:
            raise CheckpointSerializationError(
                path, f"dumping {entry.name} raised {type(exc).__qualname__}: {exc}"
            ) from exc
        finally:
            self._lenient = lenient
            self._active.discard(marker)

    def _container(self, value: Any, path: str, depth: int) -> Any:
        _room(path, depth)
        marker = id(value)
        if marker in self._active:
            raise CheckpointSerializationError(path, "the value contains itself (a cycle)")
        self._active.add(marker)
        try:
            if type(value) is not dict:
                walk = self.walk
                return [walk(item, child_path(path, i), depth + 1) for i, item in enumerate(value)]
            if needs_map(value):
                if crowded(value):
                    raise CheckpointSerializationError(path, _CROWDED)
                return {tags.MAP: self._pairs(value, path, depth)}
            out: dict[str, Any] = {}
            for key, item in value.items():
                child = child_path(path, key)
                out[checked_text(key, child)] = self.walk(item, child, depth + 1)
            return out
        finally:
            self._active.discard(marker)

    def _pairs(self, value: dict[Any, Any], path: str, depth: int) -> list[list[Any]]:
        # {"$map": [[key, value], ...]}: the pairs sit two levels below the dict.
        _room(path, depth + 2)
        pairs = []
        for key, item in value.items():
            where = f"{path}[{safe_repr(key)}]"
            pairs.append([self.walk(key, where, depth + 3), self.walk(item, where, depth + 3)])
        return pairs


def _room(path: str, depth: int) -> None:
    """Refuse a container the stored form would nest at ``depth`` >= the limit."""
    if depth >= MAX_DEPTH:
        raise CheckpointSerializationError(path, f"nesting deeper than {MAX_DEPTH} levels")


def _jsonable(value: Any, path: str) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception as exc:
        raise CheckpointSerializationError(
            path, f"values of type {type(value).__qualname__} are not storable"
        ) from exc


#: Whether compact JSON text may hold a tag (it does unless this is False).
has_tags: Final = tags.may_hold_tag


#: A path as the decoder carries it: (parent, key), formatted only for an error.
_Path = tuple[Any, Any]


def _format(path: _Path | str) -> str:
    keys: list[Any] = []
    while type(path) is tuple:
        path, key = path
        keys.append(key)
    text = str(path)
    for key in reversed(keys):
        text = child_path(text, key) if type(key) in (str, int) else f"{text}[{key}]"
    return text


_WALKED: Final = frozenset((dict, list))


class Decoder:
    """Turns decoded JSON values back into the values they stand for.

    Dicts and lists are changed in place (they are the decoder's own fresh values).
    A stored type the registry lacks raises :class:`~aiocheckpoint.UnknownTypeError`, or
    comes back as a :class:`TaggedValue` when ``raw`` is true.
    """

    __slots__ = ("_names", "_raw")

    def __init__(self, types: TypeRegistry, raw: bool) -> None:
        self._names = types.names
        self._raw = raw or types.raw

    def value(self, value: Any, path: _Path | str) -> Any:
        """The value ``value`` (decoded JSON at ``path``) stands for."""
        kind = type(value)
        if kind is dict:
            if len(value) == 1:
                key = next(iter(value))
                if key[:1] == tags.TAG_START:
                    return self._tag(key, value[key], path)
            walk = self.value
            for key, item in value.items():
                if type(item) in _WALKED:
                    value[key] = walk(item, (path, key))
        elif kind is list:
            walk = self.value
            for index, item in enumerate(value):
                if type(item) in _WALKED:
                    value[index] = walk(item, (path, index))
        return value

    def private(self, value: Any, path: _Path | str, plain: Container[int]) -> Any:
        """:meth:`value` of decoded JSON shared with others, into a copy of its own.

        Nothing it is given changes, and nothing it returns is shared with it: a tag is
        decoded from a copy of its data, and a container whose id is in ``plain`` (known
        to hold no tag) is copied without looking for tags in it.
        """
        kind = type(value)
        if kind is dict:
            if len(value) == 1:
                key = next(iter(value))
                if key[:1] == tags.TAG_START:
                    return self._tag(key, _fresh(value[key]), path)
            out = {}
            for key, item in value.items():
                if type(item) not in _WALKED:
                    out[key] = item
                elif id(item) in plain:
                    out[key] = _fresh(item)
                else:
                    out[key] = self.private(item, (path, key), plain)
            return out
        if kind is list:
            items = []
            for index, item in enumerate(value):
                if type(item) not in _WALKED:
                    items.append(item)
                elif id(item) in plain:
                    items.append(_fresh(item))
                else:
                    items.append(self.private(item, (path, index), plain))
            return items
        return value

    def _tag(self, tag: str, data: Any, path: _Path | str) -> Any:
        scalar = _SCALAR_READERS.get(tag)
        try:
            if scalar is not None:
                return scalar(data)
            if tag == tags.TYPED:
                return self._typed(data, path)
            collection = _COLLECTIONS_READ.get(tag)
            if collection is not None:
                items = self._items(data, path)
                if tag != tags.TUPLE and crowded(items):
                    raise CheckpointCorruptedError(f"{_format(path)}: {tag}: {_CROWDED}")
                return collection(items)
            if tag == tags.MAP:
                return self._map(data, path)
        except (CheckpointTypeError, CheckpointCorruptedError):
            raise
        except (ValueError, TypeError, ArithmeticError, binascii.Error, KeyError) as exc:
            raise CheckpointCorruptedError(
                f"{_format(path)}: malformed {tag} value ({type(exc).__name__})"
            ) from None
        raise CheckpointCorruptedError(f"{_format(path)}: unknown tag {tag!r}")

    def _items(self, data: Any, path: _Path | str) -> list[Any]:
        if type(data) is not list:
            raise TypeError("not an array")
        return [self.value(item, (path, index)) for index, item in enumerate(data)]

    def _map(self, data: Any, path: _Path | str) -> dict[Any, Any]:
        pairs = self._items(data, path)
        if any(type(pair) is not list or len(pair) != 2 for pair in pairs):
            raise TypeError("not a [key, value] pair")
        if crowded([key for key, _ in pairs]):
            raise CheckpointCorruptedError(f"{_format(path)}: {tags.MAP}: {_CROWDED}")
        return dict(pairs)

    def _typed(self, data: Any, path: _Path | str) -> Any:
        if type(data) is not list or len(data) != 3:
            raise TypeError("not [name, version, data]")
        name, version, stored = data
        if type(name) is not str or type(version) is not int or version < 1:
            raise TypeError("not [name, version, data]")
        entry = self._names.get(name)
        if entry is None and not self._raw:
            raise UnknownTypeError(_format(path), name, "the type is not registered")
        stored = self.value(stored, path)
        if entry is None or (version > entry.version and self._raw):
            return TaggedValue(name, version, stored)
        return _loaded(entry, version, stored, path)


def _fresh(data: Any) -> Any:
    """A copy of decoded JSON's containers (its scalars are immutable): the decoder's own."""
    kind = type(data)
    if kind is dict:
        return {key: _fresh(item) if type(item) in _WALKED else item for key, item in data.items()}
    if kind is list:
        return [_fresh(item) if type(item) in _WALKED else item for item in data]
    return data


def _loaded(entry: TypeEntry, version: int, data: Any, path: _Path | str) -> Any:
    """Upgrade stored ``data`` of ``version`` to the entry's version, then load it."""
    if version == entry.version:  # the common case first
        try:
            return entry.load(data)
        except Exception as exc:
            raise _load_error(entry, exc, path) from exc
    if version > entry.version:
        raise TypeVersionError(
            _format(path),
            entry.name,
            f"written by version {version}; this registry knows up to {entry.version}",
        )
    try:
        for step in range(version, entry.version):
            upgrade = entry.upgrade.get(step)
            if upgrade is None:
                raise TypeVersionError(_format(path), entry.name, f"no upgrade from version {step}")
            data = upgrade(data)
        return entry.load(data)
    except CheckpointTypeError:
        raise
    except Exception as exc:
        raise _load_error(entry, exc, path) from exc


def _load_error(entry: TypeEntry, exc: Exception, path: _Path | str) -> CheckpointTypeError:
    reason = f"{type(exc).__qualname__} while loading it: {exc}"
    return CheckpointTypeError(_format(path), entry.name, reason)


def _text(data: Any) -> str:
    if type(data) is not str:
        raise TypeError("not a string")
    return data


def _bytes(data: Any) -> bytes:
    return base64.b64decode(_text(data), validate=True)


def _delta(data: Any) -> timedelta:
    if type(data) is not list or len(data) != 3 or any(type(part) is not int for part in data):
        raise TypeError("not [days, seconds, microseconds]")
    return timedelta(days=data[0], seconds=data[1], microseconds=data[2])


def _uuid(data: Any) -> uuid.UUID:
    text = _text(data)
    if len(text) != 32:
        raise ValueError("not 32 hex digits")
    return uuid.UUID(hex=text)


def _decimal(data: Any) -> decimal.Decimal:
    return decimal.Decimal(_text(data))


_Clock = TypeVar("_Clock", datetime, time)

#: An offset of whole hours and minutes and a sub-second part: "+00:00:00.000001".
_FINE_OFFSET: Final = re.compile(r"([+-])(\d\d):(\d\d):(\d\d)\.(\d{6})\Z")


def _with_fine_offset(value: _Clock, text: str) -> _Clock:
    """``value`` with the offset ``text`` ends in, where ``fromisoformat`` dropped it.

    Python 3.11 reads an offset of zero hours, minutes and seconds and a sub-second part
    (``+00:00:00.000001``, which ``isoformat`` writes) as UTC.
    """
    if value.tzinfo is not timezone.utc:
        return value
    fine = _FINE_OFFSET.search(text)
    if fine is None:
        return value
    sign, hours, minutes, seconds, micros = fine.groups()
    offset = timedelta(
        hours=int(hours), minutes=int(minutes), seconds=int(seconds), microseconds=int(micros)
    )
    return value.replace(tzinfo=timezone(-offset if sign == "-" else offset))


def _datetime(data: Any) -> datetime:
    return _with_fine_offset(datetime.fromisoformat(data), data)


def _time(data: Any) -> time:
    return _with_fine_offset(time.fromisoformat(data), data)


#: The tags over a scalar and how each is read (a non-str raises TypeError: corruption).
_SCALAR_READERS: Final[dict[str, Callable[[Any], Any]]] = {
    tags.DATETIME: _datetime,
    tags.DATE: date.fromisoformat,
    tags.TIME: _time,
    tags.TIMEDELTA: _delta,
    tags.UUID: _uuid,
    tags.DECIMAL: _decimal,
    tags.BYTES: _bytes,
    tags.BYTEARRAY: lambda data: bytearray(_bytes(data)),
}
_COLLECTIONS_READ: Final[dict[str, Callable[[list[Any]], Any]]] = {
    tags.TUPLE: tuple,
    tags.SET: set,
    tags.FROZENSET: frozenset,
}
