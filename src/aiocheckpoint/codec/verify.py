"""The writer's limits, applied by readers to what they decode.

A record the writer could not have made is corruption, even when its checksums hold: a
state nested deeper than :data:`~aiocheckpoint.format.limits.MAX_DEPTH` read back as a
resume point would make every later save of it fail. The format's own checks (headers,
hashes, UTF-8 and lone surrogates in :func:`~aiocheckpoint.format.jsonread.loads`) come
first; this module adds what needs the decoded values.
"""

from __future__ import annotations

import gc
from typing import Any, Final

from ..errors import CheckpointCorruptedError
from ..format.limits import MAX_DEPTH

__all__ = ["check_depth", "may_nest_deeply"]

_is_container: Final = frozenset((dict, list)).__contains__
# The objects some lists and dicts refer to: their items, or their values. One C call per
# nesting level instead of a Python loop over every element.
_referents: Final = gc.get_referents
# Lists are always tracked by the garbage collector, and so is every dict that holds a
# list or a dict (CPython untracks only dicts of scalars, which cannot be in a cycle): the
# tracked referents of a level are all the containers that may have containers inside.
_tracked: Final = gc.is_tracked
#: Texts up to this size are counted first: too few brackets, no walk.
_SMALL: Final = 64 * 1024


def may_nest_deeply(text: bytes | bytearray) -> bool:
    """Whether values parsed from ``text`` need :func:`check_depth` (a cheap test)."""
    return len(text) > _SMALL or text.count(b"[") + text.count(b"{") > MAX_DEPTH


def check_depth(value: Any, path: str) -> None:
    """Refuse containers nested deeper than writers allow (the top-level one is depth 0).

    The same rule as the writer's copy: a container at depth :data:`MAX_DEPTH` is refused.
    Only the containers that hold containers are followed down, a level at a time.
    """
    if not _is_container(type(value)) or not _tracked(value):
        return  # an untracked dict holds no containers (a dict of 100,000 strings: no walk)
    level = [value]
    for _ in range(MAX_DEPTH - 1):
        level = list(filter(_tracked, _referents(*level)))
        if not level:
            return
    # ``level``: the containers at depth MAX_DEPTH - 1 that may hold containers.
    if any(map(_is_container, map(type, _referents(*level)))):
        raise CheckpointCorruptedError(f"{path} nests deeper than {MAX_DEPTH} levels")
