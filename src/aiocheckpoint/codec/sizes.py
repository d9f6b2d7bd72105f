"""Size estimates: a lower bound on a value's JSON text, counted without encoding it.

The record pipeline asks whether a state is surely too large for a record's root
(:func:`exceeds`) before it encodes anything, so that a large state is not encoded whole
just to learn that it goes to a tree of blobs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .typed import SCALARS

__all__ = ["exceeds", "text_bound"]


def exceeds(value: Any, limit: int) -> bool:
    """Whether the JSON text of ``value`` is surely longer than ``limit`` characters.

    Counts a lower bound and stops as soon as it passes ``limit``, so that a large state
    is not encoded whole just to learn that it does not fit in the root.
    """
    return text_bound(value, limit) > limit


def text_bound(value: Any, limit: int) -> int:
    """The lower bound :func:`exceeds` counts for ``value``, given up once past ``limit``.

    ``value`` is a storable copy, or a SharedState's tree before its copy: keys of any type
    and the standard types the copy tags, each counted at most as long as its tagged text.
    """
    try:
        return _text_bound(value, limit, len)
    except TypeError:  # a key of another type (stored in a "$map"): the hot loop is len's
        return _text_bound(value, limit, _key_length)


#: Types a SharedState's tree may hold and its copy tags: counted by their items.
_TAGGED_ITEMS: Final = frozenset({bytes, bytearray, tuple, set, frozenset})
#: Values counted as one character: JSON scalars, and the standard types tagged as scalars.
_ONE: Final = frozenset({int, float, bool, type(None), *SCALARS}) - _TAGGED_ITEMS
#: The shortest text of any other value the copy takes (a registered type, a TaggedValue):
#: a "$" tag over a name of one character, a version and the smallest data.
_TYPED_MIN: Final = len('{"$":["N",1,0]}')


def _key_length(key: Any) -> int:
    return len(key) if type(key) is str else 1


def _text_bound(value: Any, limit: int, key_length: Callable[[Any], int]) -> int:
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            total += len(item) + 2
        elif kind is dict:
            total += 1 + 3 * len(item)
            for key in item:
                total += key_length(key)
            stack.extend(item.values())
        elif kind is list:
            total += 1 + len(item)
            stack.extend(item)
        elif kind in _ONE:
            total += 1
        elif kind in _TAGGED_ITEMS:  # bytes in base64; the others as lists, tagged
            total += 1 + len(item)
            if kind is not bytes and kind is not bytearray:
                stack.extend(item)
        else:  # a registered type's value (a model: a chat of them is a large state)
            total += _TYPED_MIN
        if total > limit:
            break
    return total
