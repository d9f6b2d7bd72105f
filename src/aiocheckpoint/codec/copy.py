"""The value stage's copy: a validated, independent copy of a value in the tagged JSON form.

What can be stored
------------------
dicts, lists, ``str``, ``int`` (of up to
:data:`~aiocheckpoint.format.limits.MAX_INT_DIGITS` digits), ``float`` (NaN and infinities
included), ``bool`` and ``None`` are stored as JSON, key order included; the standard types
(``datetime``, ``date``, ``time``, ``timedelta``, ``UUID``, ``Decimal``, ``bytes``,
``bytearray``, ``tuple``, ``set``, ``frozenset``, dicts with non-``str`` keys) and the
classes of the manager's :class:`~aiocheckpoint.TypeRegistry` are stored tagged
(:mod:`aiocheckpoint.format.tags`), and each comes back as itself. Anything else -- an
unregistered class, a cycle, nesting deeper than
:data:`~aiocheckpoint.format.limits.MAX_DEPTH`, a longer int, a set of more than
:data:`~aiocheckpoint.format.limits.MAX_SHARED_HASH` items of one hash -- raises
:class:`CheckpointSerializationError` naming the offending path, and nothing is written.

The copy is taken before the first await of ``create_checkpoint``: later changes by the
caller never alter what is stored. :func:`storable_copy` also tells whether every float is
finite, which lets the encoders use orjson.
"""

from __future__ import annotations

from collections.abc import Generator
from time import perf_counter
from typing import Any, Final

from ..format.jsonread import SHORT_INT_BOUND
from ..format.limits import MAX_DEPTH
from ..format.tags import TAG_START, TYPED
from .paths import child_path
from .registry import EMPTY, TypeEntry, TypeRegistry
from .sizes import text_bound
from .typed import COLLECTIONS, SCALARS, Encoder, crowded, needs_map, ordered

__all__ = [
    "child_path",
    "json_copy",
    "storable_copy",
    "storable_copy_sized",
    "storable_copy_work",
    "to_storable",
]


class _Unstorable(Exception):
    """Internal: the fast copy met something it does not handle."""


# Ints are plain too, up to a size: a longer one bails out to the Encoder, which names it
# if it is longer than a store keeps (format/limits.py).
_PLAIN: Final = frozenset({str, bool, type(None)})
_SCALARS: Final = _PLAIN | {int, float}
_SHORT: Final = SHORT_INT_BOUND
_LOW: Final = -SHORT_INT_BOUND  # computed once: negating the bound copies ~40 KB
_LAST_DEPTH: Final = MAX_DEPTH - 1  # a tag's data sits one level below it
_Types = dict[type, TypeEntry]


def _fast_copy(value: Any, depth: int, nonfinite: list[float], types: _Types) -> Any:
    # The hot path: plain JSON data, the standard types and registered ones, no paths
    # kept, no cycle set (a cycle ends at the depth limit). Anything unusual bails out to
    # the Encoder, which finds and names the problem.
    kind = type(value)
    if kind in _PLAIN or (kind is int and _LOW < value < _SHORT):
        return value
    if kind is float:
        if value - value != 0.0:  # NaN or an infinity
            nonfinite.append(value)
        return value
    if depth >= _LAST_DEPTH:
        raise _Unstorable
    if kind is dict:
        out = {}
        depth += 1
        for key, item in value.items():
            if type(key) is not str:
                raise _Unstorable
            kind = type(item)
            if kind is int:
                if not _LOW < item < _SHORT:
                    raise _Unstorable  # the Encoder names it, if it is too long
                out[key] = item
            elif kind in _PLAIN:
                out[key] = item
            elif kind is float:
                if item - item != 0.0:
                    nonfinite.append(item)
                out[key] = item
            else:
                out[key] = _fast_copy(item, depth, nonfinite, types)
        if len(out) == 1 and key[:1] == TAG_START:  # would read as a tag: escaped
            raise _Unstorable
        return out
    if kind is list:
        # Copy first (in C), then replace the containers by their copies; scalars stay.
        items = list(value)
        depth += 1
        for index, item in enumerate(items):
            kind = type(item)
            if kind is int:
                if _LOW < item < _SHORT:
                    continue
                raise _Unstorable
            if kind in _PLAIN:
                continue
            if kind is float:
                if item - item != 0.0:
                    nonfinite.append(item)
            else:
                items[index] = _fast_copy(item, depth, nonfinite, types)
        return items
    return _fast_tagged(value, depth, nonfinite, types)


def _fast_tagged(value: Any, depth: int, nonfinite: list[float], types: _Types) -> Any:
    kind = type(value)
    scalar = SCALARS.get(kind)
    if scalar is not None:
        return {scalar[0]: scalar[1](value)}
    tag = COLLECTIONS.get(kind)
    if tag is not None:
        if kind is not tuple and crowded(value):
            raise _Unstorable
        items = list(value) if kind is tuple else ordered(value)
        return {tag: _fast_copy(items, depth + 1, nonfinite, types)}
    entry = types.get(kind)
    if entry is None:
        raise _Unstorable
    try:
        dumped = entry.dump(value)
    except Exception:
        raise _Unstorable from None
    return {TYPED: [entry.name, entry.version, _fast_copy(dumped, depth + 2, nonfinite, types)]}


def _counted_copy(
    value: Any, depth: int, nonfinite: list[float], types: _Types, size: list[int]
) -> Any:
    # _fast_copy, also adding to size[0] what split.exceeds counts for the copy (less the
    # 1 its parent counts for each item) until size[0] passes size[1]; _fast_copy does the
    # rest. Two functions, not one with a switch: the switch cost every other copy ~10%.
    kind = type(value)
    if kind is not dict and kind is not list:  # a tag (or a scalar at the root)
        copy = _fast_copy(value, depth, nonfinite, types)
        size[0] += text_bound(copy, size[1]) - 1
        return copy
    if depth >= _LAST_DEPTH:
        raise _Unstorable
    depth += 1
    if kind is dict:
        out = {}
        extra = 4 * len(value)
        for key, item in value.items():
            if type(key) is not str:
                raise _Unstorable
            kind = type(item)
            if kind is str:
                extra += len(item) + 1
                out[key] = item
            elif kind in _PLAIN or (kind is int and _LOW < item < _SHORT):
                out[key] = item
            elif kind is float:
                if item - item != 0.0:
                    nonfinite.append(item)
                out[key] = item
            elif size[0] <= size[1]:
                out[key] = _counted_copy(item, depth, nonfinite, types, size)
            else:  # past the limit: nothing more to count
                out[key] = _fast_copy(item, depth, nonfinite, types)
        if len(out) == 1 and key[:1] == TAG_START:  # would read as a tag: escaped
            raise _Unstorable
        size[0] += extra + sum(map(len, out))
        return out
    items = list(value)
    extra = 2 * len(items)
    for index, item in enumerate(items):
        kind = type(item)
        if kind is str:
            extra += len(item) + 1
        elif kind is float:
            if item - item != 0.0:
                nonfinite.append(item)
        elif kind in _PLAIN or (kind is int and _LOW < item < _SHORT):
            continue
        elif size[0] <= size[1]:
            items[index] = _counted_copy(item, depth, nonfinite, types, size)
        else:  # past the limit: the rest in one piece, uncounted
            items[index:] = _fast_copy(items[index:], depth - 1, nonfinite, types)
            break
    size[0] += extra
    return items


def storable_copy(value: Any, path: str = "state", types: TypeRegistry = EMPTY) -> tuple[Any, bool]:
    """Like :func:`to_storable`, also telling whether every float in it is finite."""
    nonfinite: list[float] = []
    try:
        return _fast_copy(value, 0, nonfinite, types.classes), not nonfinite
    except (_Unstorable, RecursionError):
        encoder = Encoder(types)
        return encoder.walk(value, path, 0), not encoder.nonfinite


def storable_copy_sized(
    value: Any, limit: int, path: str = "state", types: TypeRegistry = EMPTY
) -> tuple[Any, bool, int | None]:
    """:func:`storable_copy`, and a lower bound on the length of the copy's JSON text.

    The bound is the count :func:`~aiocheckpoint.codec.sizes.exceeds` makes, taken while
    copying and given up once past ``limit``: ``exceeds(copy, limit)`` is
    ``bound > limit``. None when the copy was not taken by the fast path (then ask
    ``exceeds``).
    """
    nonfinite: list[float] = []
    size = [1, limit]
    try:
        return _counted_copy(value, 0, nonfinite, types.classes, size), not nonfinite, size[0]
    except (_Unstorable, RecursionError):
        encoder = Encoder(types)
        return encoder.walk(value, path, 0), not encoder.nonfinite, None


#: How long (seconds of work) :func:`storable_copy_work` goes between two yields.
_COPY_SLICE: Final = 0.00015
_COPY_BATCH: Final = 16  # elements copied between two looks at the clock
_CONTAINERS: Final = (dict, list)


def storable_copy_work(
    value: Any, path: str = "state", types: TypeRegistry = EMPTY
) -> Generator[None, None, tuple[Any, bool]]:
    """:func:`storable_copy` as a generator that yields every ~0.15 ms of work.

    Only for a value that nobody changes until the generator is done (a ``SharedState``
    tree, which is copy-on-write): the copy is taken piece by piece. The top-level
    container's elements, and the elements of any large container among them, are copied
    in batches; anything else in one piece. A value the fast copy does not handle (an
    unstorable one, or one that needs converting) is copied again whole by
    :func:`storable_copy`, which names the problem.
    """
    kind = type(value)
    items = value.values() if kind is dict else value if kind is list else ()
    if len(items) <= _COPY_BATCH and not any(
        type(item) in _CONTAINERS and len(item) > _COPY_BATCH for item in items
    ):
        return storable_copy(value, path, types)  # nothing to slice: one piece, no generator work
    nonfinite: list[float] = []
    try:
        copied = yield from _fast_copy_work(value, 0, nonfinite, [perf_counter()], types.classes)
    except (_Unstorable, RecursionError):
        return storable_copy(value, path, types)
    return copied, not nonfinite


def _fast_copy_work(
    value: Any, depth: int, nonfinite: list[float], last: list[float], types: _Types
) -> Generator[None, None, Any]:
    kind = type(value)
    if (kind is not dict and kind is not list) or (depth and len(value) <= _COPY_BATCH):
        return _fast_copy(value, depth, nonfinite, types)
    if kind is dict and needs_map(value):
        raise _Unstorable  # a "$map" (as _fast_copy would): the Encoder makes it
    keys = list(value) if kind is dict else None
    items = list(value.values()) if kind is dict else value
    copies: list[Any] = []
    for start in range(0, len(items), _COPY_BATCH):
        for item in items[start : start + _COPY_BATCH]:
            if depth == 0 and type(item) in (dict, list) and len(item) > _COPY_BATCH:
                copies.append((yield from _fast_copy_work(item, 1, nonfinite, last, types)))
            else:
                copies.append(_fast_copy(item, depth + 1, nonfinite, types))
        now = perf_counter()
        if now - last[0] > _COPY_SLICE:
            yield
            last[0] = perf_counter()
    if keys is None:
        return copies
    return dict(zip(keys, copies, strict=True))


def to_storable(value: Any, path: str = "state", types: TypeRegistry = EMPTY) -> Any:
    """Return a validated, independent copy of ``value`` in the tagged JSON form.

    Raises :class:`CheckpointSerializationError` naming the first offending path.
    """
    return storable_copy(value, path, types)[0]


def json_copy(value: Any) -> Any:
    """Deep-copy a JSON-compatible value quickly; other values fall back to ``copy.deepcopy``."""
    kind = type(value)
    # Scalars are taken inline, not by a call each: a third of the time on 1 MB of documents.
    if kind is dict:
        return {k: v if type(v) in _SCALARS else json_copy(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _SCALARS else json_copy(v) for v in value]
    if kind in _SCALARS:
        return value
    import copy

    return copy.deepcopy(value)
