"""A state as a tree of nodes for the step page, cut to a budget.

States arrive in their stored view: typed values are one-key objects whose key is a tag
(``{"$dt": "..."}``, ``{"$": [name, version, data]}``, see
:mod:`aiocheckpoint.format.tags`), shown by their type, so no application class is needed.
A page shows at most :data:`NODES` nodes, :data:`CHILDREN` children per container and
:data:`TEXT` characters per string; what is cut says how much, and a container cut short
links to the page that continues it (its path and the offset of its next child). A state
looked into rather than read whole (:func:`~aiocheckpoint.codec.peek_state`) has values
stored apart (:class:`~aiocheckpoint.codec.Apart`, a link to their page) and large
containers read in part (:class:`~aiocheckpoint.codec.Cut`: how many entries come after
is not known, the link says "more").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Final

from ..codec import Apart, Cut
from ..errors import InvalidArgumentError
from ..format import tags

__all__ = [
    "CHILDREN",
    "NODES",
    "PREVIEW",
    "TEXT",
    "Node",
    "build_tree",
    "describe",
    "is_typed",
    "parse_path",
    "subtree",
]

NODES: Final = 2000
CHILDREN: Final = 200
TEXT: Final = 2000
#: How deep the tree is drawn; deeper containers are links to their own page.
DEPTH: Final = 24
#: Characters of a value's one-line preview (a diff's old and new values).
PREVIEW: Final = 300

#: How each tag is named on the page.
_NAMES: Final = {
    tags.DATETIME: "datetime",
    tags.DATE: "date",
    tags.TIME: "time",
    tags.TIMEDELTA: "timedelta",
    tags.UUID: "uuid",
    tags.DECIMAL: "decimal",
    tags.BYTES: "bytes",
    tags.BYTEARRAY: "bytearray",
    tags.TUPLE: "tuple",
    tags.SET: "set",
    tags.FROZENSET: "frozenset",
    tags.MAP: "dict",
}


@dataclass
class Node:
    """One value: its key in its parent, its type and either its text or its children."""

    key: str
    kind: str
    text: str = ""
    children: list[Node] = field(default_factory=list)
    #: (path, offset) of the page that continues this container, when it was cut short
    more: tuple[str, int] | None = None
    #: how many children or characters were left out
    left_out: int = 0
    #: whether it holds children (a dict, list, tuple, set, registered value...)
    container: bool = False


@dataclass
class _Budget:
    nodes: int = NODES


def parse_path(text: str) -> list[str | int]:
    """A subtree's path from its query parameter (a JSON array of keys and indexes)."""
    if not text:
        return []
    try:
        path = json.loads(text)
    except ValueError:
        raise InvalidArgumentError("not a state path") from None
    if not isinstance(path, list) or not all(
        isinstance(p, (str, int)) and not isinstance(p, bool) for p in path
    ):
        raise InvalidArgumentError("a state path is a JSON array of keys and indexes")
    return path


def subtree(value: Any, path: list[str | int]) -> Any:
    """The value at ``path`` (keys of objects, indexes of arrays and of tagged containers)."""
    for part in path:
        value = _entries_of(value)
        found = dict(_items(value))
        if part not in found:
            raise InvalidArgumentError(f"no {part!r} in this state")
        value = found[part]
    return value


def build_tree(value: Any, path: list[str | int], offset: int = 0) -> Node:
    """The tree of ``value`` (found at ``path``), its top container from child ``offset``."""
    key = "state" if not path else str(path[-1])
    return _node(key, value, path, _Budget(), offset, 0)


def _node(
    key: str, value: Any, path: list[str | int], budget: _Budget, offset: int, depth: int
) -> Node:
    budget.nodes -= 1
    if isinstance(value, Apart):  # stored in a node of its own: its page reads it
        return Node(
            key, "stored apart", "not read here", more=(json.dumps(path), 0), container=True
        )
    if isinstance(value, Cut):
        return _cut(Node(key, value.kind), value, path, budget, depth)
    if isinstance(value, dict) and len(value) == 1:
        tag, inner = next(iter(value.items()))
        if isinstance(tag, str) and tag.startswith(tags.TAG_START):
            return _typed(key, tag, inner, path, budget, offset, depth)
    if isinstance(value, (dict, list)):
        kind = "dict" if isinstance(value, dict) else "list"
        return _container(Node(key, kind), value, path, budget, offset, depth)
    return _leaf(key, value)


def _typed(
    key: str, tag: str, inner: Any, path: list[str | int], budget: _Budget, offset: int, depth: int
) -> Node:
    if isinstance(inner, Apart):  # its inside is stored apart: its own page reads it
        node = _node(key, inner, path, budget, offset, depth)
        node.kind = f"{_NAMES.get(tag, 'registered value')} (stored apart)"
        return node
    if isinstance(inner, Cut) and tag in (tags.TUPLE, tags.SET, tags.FROZENSET, tags.MAP):
        return _cut(Node(key, _NAMES[tag]), inner, path, budget, depth)
    if tag == tags.TYPED and isinstance(inner, list) and len(inner) == 3:
        name, version, data = inner
        node = Node(key, f"{name} v{version}")
        return _container(node, {"data": data}, path, budget, offset, depth)
    if tag in (tags.TUPLE, tags.SET, tags.FROZENSET, tags.MAP) and isinstance(inner, list):
        return _container(Node(key, _NAMES[tag]), inner, path, budget, offset, depth, tag)
    if tag in (tags.BYTES, tags.BYTEARRAY) and isinstance(inner, str):
        leaf = _leaf(key, inner)
        leaf.kind = f"{_NAMES[tag]} ({len(inner) * 3 // 4 - inner[-2:].count('=')} bytes, base64)"
        return leaf
    leaf = _leaf(key, inner if isinstance(inner, str) else json.dumps(inner))
    leaf.kind = _NAMES.get(tag, f"unknown tag {tag}")
    return leaf


def _leaf(key: str, value: Any) -> Node:
    if value is None or isinstance(value, bool):
        return Node(key, "null" if value is None else "bool", json.dumps(value))
    if isinstance(value, (int, float)):
        text = str(value) if isinstance(value, float) or abs(value) < 10**100 else "(huge int)"
        return Node(key, type(value).__name__, text)
    text = str(value)
    node = Node(key, "str", text[:TEXT])
    node.left_out = max(0, len(text) - TEXT)
    return node


def _container(
    node: Node,
    value: Any,
    path: list[str | int],
    budget: _Budget,
    offset: int,
    depth: int,
    tag: str = "",
) -> Node:
    node.container = True
    inner = _entries_of(value if not tag else {tag: value})
    total = len(inner) if isinstance(inner, (dict, list)) else 0
    node.text = f"{total} items"
    entries = islice(_items(inner), offset, None)
    for index, (child_key, child) in enumerate(entries, offset):
        if budget.nodes <= 0 or index - offset >= CHILDREN or depth >= DEPTH:
            node.more = (json.dumps(path), index)
            node.left_out = total - index
            break
        child_path = [*path, child_key]
        node.children.append(_node(str(child_key), child, child_path, budget, 0, depth + 1))
    return node


def _cut(node: Node, cut: Cut, path: list[str | int], budget: _Budget, depth: int) -> Node:
    """A large container read in part: its entries from ``cut.start``, and a link on."""
    node.container = True
    end = cut.start + len(cut.entries)
    node.text = f"{end}+ items" if cut.more else f"{end} items"
    for child_key, child in cut.entries:
        if budget.nodes <= 0 or depth >= DEPTH:
            end = cut.start + len(node.children)
            cut.more = True
            break
        child_path = [*path, child_key]
        node.children.append(_node(str(child_key), child, child_path, budget, 0, depth + 1))
    if cut.more:
        node.more = (json.dumps(path), end)
    return node


def _entries_of(value: Any) -> Any:
    """A typed container's inside (a registered value's data, a tuple's items), or itself."""
    if isinstance(value, dict) and len(value) == 1:
        tag, inner = next(iter(value.items()))
        if tag == tags.TYPED and isinstance(inner, list) and len(inner) == 3:
            return {"data": inner[2]}
        if (
            isinstance(tag, str)
            and tag.startswith(tags.TAG_START)
            and isinstance(inner, list | Cut)
        ):
            return inner  # (a Cut: its inside read in part, a diff's change)
    return value


def _items(value: Any) -> Iterator[tuple[str | int, Any]]:
    value = _entries_of(value)
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, list):
        yield from enumerate(value)


def is_typed(value: Any) -> bool:
    """Whether ``value`` is a typed value in its tagged form (``{"$dt": "..."}``)."""
    if isinstance(value, dict) and len(value) == 1:
        tag = next(iter(value))
        return isinstance(tag, str) and tag.startswith(tags.TAG_START)
    return False


def describe(value: Any) -> Node:
    """``value`` as one line: its type and a preview cut at :data:`PREVIEW` characters.

    The preview is written a piece at a time and stops at the limit, so a huge value costs
    no more than the limit.
    """
    node = _node("", value, [], _Budget(1), 0, DEPTH)
    if node.container:
        pieces: list[str] = []
        left = _preview(_entries_of(value), pieces, PREVIEW)
        node.text = f"{node.text}: {''.join(pieces)}"
        node.left_out = 0 if left >= 0 else 1
        node.more = None
    elif len(node.text) > PREVIEW:
        node.left_out += len(node.text) - PREVIEW
        node.text = node.text[:PREVIEW]
    return node


def _preview(value: Any, out: list[str], room: int) -> int:
    """Append compact JSON of ``value`` to ``out`` until ``room`` runs out; what is left."""
    if room < 0:
        return room
    if isinstance(value, Apart):  # a value not read (a diff's change read in part)
        out.append("(stored apart)")
        return room - 14
    if isinstance(value, Cut):  # its first entries, and more
        entries = value.entries
        room = _preview(
            [v for _, v in entries] if value.kind == "list" else dict(entries), out, room
        )
        return room if not value.more else -1
    if isinstance(value, dict):
        out.append("{")
        room -= 1
        for n, (key, child) in enumerate(value.items()):
            if room < 0:
                break
            head = (", " if n else "") + json.dumps(str(key)[:room], ensure_ascii=False) + ": "
            out.append(head)
            room = _preview(child, out, room - len(head))
        out.append("}")
        return room - 1
    if isinstance(value, list):
        out.append("[")
        room -= 1
        for n, child in enumerate(value):
            if room < 0:
                break
            if n:
                out.append(", ")
                room -= 2
            room = _preview(child, out, room)
        out.append("]")
        return room - 1
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**100:
        text = "(huge int)"
    else:
        text = json.dumps(value[: room + 1] if isinstance(value, str) else value)
    out.append(text[: max(room, 0) + 1])
    return room - len(text)
