"""What changed between two states, path by path (``plan.items[2].title``).

Shared by ``aiocheckpoint diff`` and the web inspector's diff page. :func:`iter_changes`
yields the changes lazily, in tree order, so a reader that shows one page of them stops
walking once it has it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "diff_states", "format_path", "iter_changes"]

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
    return list(iter_changes(old, new))


def iter_changes(
    old: Any, new: Any, atomic: Callable[[Any], bool] | None = None
) -> Iterator[Change]:
    """The changes of :func:`diff_states`, one at a time.

    A value for which ``atomic`` is true (a typed value in its tagged form, say) is compared
    whole: one ``changed`` at its path, never a change inside it.
    """
    return _walk(old, new, (), atomic or _never)


def _never(value: Any) -> bool:
    return False


def _walk(
    old: Any, new: Any, keys: tuple[str | int, ...], atomic: Callable[[Any], bool]
) -> Iterator[Change]:
    whole = atomic(old) or atomic(new)
    if type(old) is dict and type(new) is dict and not whole:
        for key, value in old.items():
            if key not in new:
                yield Change("removed", (*keys, key), old=value)
            else:
                yield from _walk(value, new[key], (*keys, key), atomic)
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
                yield from _walk(old[i], new[i], (*keys, i), atomic)
    elif not _same(old, new):
        yield Change("changed", keys, old=old, new=new)


def _same(a: Any, b: Any) -> bool:
    # Stricter than ==: True is not 1, 1 is not 1.0; NaN equals NaN (it did not change).
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)
