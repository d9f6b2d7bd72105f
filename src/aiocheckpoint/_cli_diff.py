"""Differences between two states, path by path (``plan.items[2].title``)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "diff_states", "format_path"]

_PLAIN_KEY_BANNED = frozenset(".[]\"'")


@dataclass(frozen=True)
class Change:
    """One difference: ``op`` is ``added``, ``removed`` or ``changed``."""

    op: str
    keys: tuple[str | int, ...]
    old: Any = None
    new: Any = None

    @property
    def path(self) -> str:
        """The dot path of the value, as :class:`~aiocheckpoint.SharedState` spells it."""
        return format_path(self.keys)


def format_path(keys: tuple[str | int, ...]) -> str:
    """Dot path for dict keys, ``[i]`` for list indexes, ``["k.k"]`` for awkward keys."""
    out = ""
    for key in keys:
        if isinstance(key, int):
            out += f"[{key}]"
        elif key and key.isprintable() and not key.isspace() and not _PLAIN_KEY_BANNED & set(key):
            out += f".{key}" if out else key
        else:
            out += f"[{json.dumps(key, ensure_ascii=False)}]"
    return out


def diff_states(old: Any, new: Any) -> list[Change]:
    """Every added, removed and changed value between two JSON-like trees, in tree order."""
    return list(_walk(old, new, ()))


def _walk(old: Any, new: Any, keys: tuple[str | int, ...]) -> Iterator[Change]:
    if type(old) is dict and type(new) is dict:
        for key, value in old.items():
            if key not in new:
                yield Change("removed", (*keys, key), old=value)
            else:
                yield from _walk(value, new[key], (*keys, key))
        for key, value in new.items():
            if key not in old:
                yield Change("added", (*keys, key), new=value)
    elif type(old) is list and type(new) is list:
        for i in range(max(len(old), len(new))):
            if i >= len(new):
                yield Change("removed", (*keys, i), old=old[i])
            elif i >= len(old):
                yield Change("added", (*keys, i), new=new[i])
            else:
                yield from _walk(old[i], new[i], (*keys, i))
    elif not _same(old, new):
        yield Change("changed", keys, old=old, new=new)


def _same(a: Any, b: Any) -> bool:
    # Stricter than ==: True is not 1, 1 is not 1.0; NaN equals NaN (it did not change).
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)
