"""The value stage's default: a validated, independent, JSON-compatible copy of a value.

What can be stored
------------------
dicts with ``str`` keys, lists, tuples (stored as lists), ``str``, ``int`` of any size,
``float`` (NaN and infinities included), ``bool`` and ``None`` round-trip exactly, key order
included. Pydantic models, ``datetime``/``date``/``time`` and ``UUID`` are accepted and stored
as their JSON form (a model comes back as a dict, the others as ISO strings or the UUID's
string). Anything else -- sets, bytes, non-``str`` keys, enums, other objects, cycles, or
nesting deeper than :data:`~aiocheckpoint.format.limits.MAX_DEPTH` -- raises
:class:`CheckpointSerializationError` naming the offending path, and nothing is written.

The copy is taken before the first await of ``create_checkpoint``: later changes by the
caller never alter what is stored. :func:`storable_copy` also tells whether every float is
finite, which lets the encoders use orjson.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from datetime import date, datetime, time
from time import perf_counter
from typing import Any, Final

from pydantic import BaseModel

from ..errors import CheckpointSerializationError
from ..format.limits import MAX_DEPTH

__all__ = [
    "child_path",
    "json_copy",
    "storable_copy",
    "storable_copy_work",
    "to_storable",
]

_IDENTIFIER_CHARS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
)


def child_path(path: str, key: str | int) -> str:
    """The path of ``key`` in the container at ``path`` (as error messages name it)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key and not key[0].isdigit() and set(key) <= _IDENTIFIER_CHARS:
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


class _Walker:
    """Validates a value and returns a fresh JSON-compatible copy of it."""

    __slots__ = ("_active", "nonfinite")

    def __init__(self) -> None:
        self._active: set[int] = set()
        self.nonfinite = False

    def walk(self, value: Any, path: str, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            return _checked_text(value, path)
        if kind is bool or value is None:
            return value
        if kind is int:
            return value
        if kind is float:
            self.nonfinite = self.nonfinite or value - value != 0.0
            return value
        if depth >= MAX_DEPTH:
            raise CheckpointSerializationError(path, f"nesting deeper than {MAX_DEPTH} levels")
        if kind is dict or kind is list or kind is tuple:
            return self._container(value, path, depth)
        if isinstance(value, BaseModel):
            try:
                dumped = value.model_dump(mode="json")
            except Exception as exc:
                raise CheckpointSerializationError(
                    path,
                    f"model_dump() of {kind.__qualname__} raised {type(exc).__qualname__}",
                ) from exc
            return self.walk(dumped, path, depth)
        if isinstance(value, (datetime, date, time)):
            return value.isoformat()
        if isinstance(value, uuid.UUID):
            return str(value)
        raise CheckpointSerializationError(
            path, f"values of type {kind.__qualname__} are not JSON-compatible"
        )

    def _container(self, value: Any, path: str, depth: int) -> Any:
        marker = id(value)
        if marker in self._active:
            raise CheckpointSerializationError(path, "the value contains itself (a cycle)")
        self._active.add(marker)
        try:
            if type(value) is dict:
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if type(key) is not str:
                        raise CheckpointSerializationError(
                            f"{path}[{_safe_repr(key)}]",
                            f"dict keys must be str, not {type(key).__qualname__}",
                        )
                    child = child_path(path, key)
                    out[_checked_text(key, child)] = self.walk(item, child, depth + 1)
                return out
            return [self.walk(item, child_path(path, i), depth + 1) for i, item in enumerate(value)]
        finally:
            self._active.discard(marker)


class _Unstorable(Exception):
    """Internal: the fast copy met something it does not handle."""


_PLAIN: Final = frozenset({str, int, bool, type(None)})


def _fast_copy(value: Any, depth: int, nonfinite: list[float]) -> Any:
    # The hot path: plain JSON data, no paths kept, no cycle set (a cycle ends at the depth
    # limit). Anything unusual bails out to _Walker, which finds and names the problem.
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        if value - value != 0.0:  # NaN or an infinity
            nonfinite.append(value)
        return value
    if depth >= MAX_DEPTH:
        raise _Unstorable
    depth += 1
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Unstorable
            kind = type(item)
            if kind in _PLAIN:
                out[key] = item
            elif kind is float:
                if item - item != 0.0:
                    nonfinite.append(item)
                out[key] = item
            else:
                out[key] = _fast_copy(item, depth, nonfinite)
        return out
    if kind is list or kind is tuple:
        # Copy first (in C), then replace the containers by their copies; scalars stay.
        items = list(value)
        for index, item in enumerate(items):
            kind = type(item)
            if kind in _PLAIN:
                continue
            if kind is float:
                if item - item != 0.0:
                    nonfinite.append(item)
            else:
                items[index] = _fast_copy(item, depth, nonfinite)
        return items
    raise _Unstorable


def storable_copy(value: Any, path: str = "state") -> tuple[Any, bool]:
    """Like :func:`to_storable`, also telling whether every float in it is finite."""
    nonfinite: list[float] = []
    try:
        return _fast_copy(value, 0, nonfinite), not nonfinite
    except (_Unstorable, RecursionError):
        walker = _Walker()
        return walker.walk(value, path, 0), not walker.nonfinite


#: How long (seconds of work) :func:`storable_copy_work` goes between two yields.
_COPY_SLICE: Final = 0.00015
_COPY_BATCH: Final = 16  # elements copied between two looks at the clock
_CONTAINERS: Final = (dict, list)


def storable_copy_work(value: Any, path: str = "state") -> Generator[None, None, tuple[Any, bool]]:
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
        return storable_copy(value, path)  # nothing to slice: one piece, no generator work
    nonfinite: list[float] = []
    try:
        copied = yield from _fast_copy_work(value, 0, nonfinite, [perf_counter()])
    except (_Unstorable, RecursionError):
        return storable_copy(value, path)
    return copied, not nonfinite


def _fast_copy_work(
    value: Any, depth: int, nonfinite: list[float], last: list[float]
) -> Generator[None, None, Any]:
    kind = type(value)
    if (kind is not dict and kind is not list) or (depth and len(value) <= _COPY_BATCH):
        return _fast_copy(value, depth, nonfinite)
    keys = list(value) if kind is dict else None
    items = list(value.values()) if kind is dict else value
    copies: list[Any] = []
    for start in range(0, len(items), _COPY_BATCH):
        for item in items[start : start + _COPY_BATCH]:
            if depth == 0 and type(item) in (dict, list) and len(item) > _COPY_BATCH:
                copies.append((yield from _fast_copy_work(item, 1, nonfinite, last)))
            else:
                copies.append(_fast_copy(item, depth + 1, nonfinite))
        now = perf_counter()
        if now - last[0] > _COPY_SLICE:
            yield
            last[0] = perf_counter()
    if keys is None:
        return copies
    if any(type(key) is not str for key in keys):
        raise _Unstorable
    return dict(zip(keys, copies, strict=True))


def _checked_text(text: str, path: str) -> str:
    """Return ``text`` if it can be stored as UTF-8 (no lone surrogates), else raise."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CheckpointSerializationError(
                path, "the string is not valid Unicode (it holds a lone surrogate)"
            ) from exc
    return text


def _safe_repr(value: object) -> str:
    """``repr(value)``, or a stand-in when the object's ``__repr__`` raises."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__qualname__} object>"


def to_storable(value: Any, path: str = "state") -> Any:
    """Return a validated, independent JSON-compatible copy of ``value``.

    Raises :class:`CheckpointSerializationError` naming the first offending path.
    """
    return storable_copy(value, path)[0]


def json_copy(value: Any) -> Any:
    """Deep-copy a JSON-compatible value quickly; other values fall back to ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if kind is list:
        return [json_copy(v) for v in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    import copy

    return copy.deepcopy(value)
