"""What changed between two version-2 trees, read only where they differ.

:func:`diff_trees` yields the changes :func:`~aiocheckpoint.format.statediff.iter_changes`
yields for the two states, in the same order, walking both trees from their roots: a value
stored apart under the same hash in both is the same value and is skipped unread; a large
dict's chunks held by both (the same hash, at any place) hold the same keys with the same
values and are skipped unread too, so an edit deep in a 50 MB state reads the nodes on the
way to it and the chunks that differ. Each node fetched is checked against its hash, or
authenticated as it is unsealed in an encrypted tree (the node reading is
:mod:`~aiocheckpoint.codec.tree.peek`'s). Names are keyed there: equal content under one
name key has one name, so what both trees hold is skipped as it is in a plain tree (two
records named under different keys share no name: their trees are read where they meet).

Costs: a dict's differing chunks are read whole (memory grows with what changed, not with
the state); two large lists are walked in step, a batch of chunks at a time, each run of
elements compared by the plain walk (time grows with the lists, about as the whole read's,
memory does not: an element's index needs the lengths of the chunks before it, so chunks
both hold are read too), their equal elements stored apart skipped unread; a value
compared whole (a typed value, or a changed one shown in a change) is read whole, or, with
``expand``, up to that many bytes (:func:`~aiocheckpoint.codec.tree.peek.peek_state`'s
:class:`Apart` and :class:`Cut` for the rest). Records it cannot walk (version 1, a state
kept inline, a record still sealed or otherwise flagged, two digest sizes) give None: the caller
reads both states whole, as before.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

from ...errors import CheckpointCorruptedError
from ...format.statediff import Change, iter_changes
from ...format.tree import KIND_DICT, KIND_LIST, KIND_VALUE, node_refs
from .peek import BATCH, Apart, AsyncFetch, Walker, cut, expanded, open_tree, opened

__all__ = ["diff_trees"]

Keys = tuple[str | int, ...]


def diff_trees(
    old: bytes | None,
    new: bytes,
    fetch: AsyncFetch,
    *,
    workflow_id: str,
    old_step: int | None,
    step: int,
    max_bytes: int,
    atomic: Callable[[Any], bool] | None = None,
    expand: int | None = None,
    count: int = 300,
    offset: int = 0,
    authenticated: bool = False,
) -> AsyncIterator[Change] | None:
    """The changes from record ``old`` (None: an empty state) to record ``new``.

    ``atomic`` is :func:`~aiocheckpoint.format.statediff.iter_changes`'s. A change's values
    are read whole, or with ``expand`` up to that many bytes each (a large container then a
    :class:`Cut` of its first ``count`` entries, values beyond :class:`Apart`). Blobs count
    against ``max_bytes`` per record, as the whole reads' do. The first ``offset`` changes
    are skipped, their values unread. None: the records cannot be walked (module
    docstring); the caller diffs the whole states. Damage raises
    :class:`~aiocheckpoint.errors.CheckpointCorruptedError`. ``authenticated`` is
    :func:`~aiocheckpoint.codec.tree.peek.peek_state`'s (both records opened by one codec).
    """
    opened_new = open_tree(new, workflow_id, step)
    if opened_new is None:
        return None
    _, digest, new_root = opened_new
    old_root: bytes | None = None
    if old is not None:
        opened_old = open_tree(old, workflow_id, old_step if old_step is not None else -1)
        if opened_old is None or opened_old[1] != digest:
            return None
        old_root = opened_old[2]
    walker = Walker(fetch, digest, max_bytes * 2, authenticated)
    differ = _Differ(walker, atomic or (lambda value: False), expand, count)
    return differ.run(old_root, new_root, offset)


def _holds_apart(value: Any) -> bool:
    if isinstance(value, Apart):
        return True
    if type(value) is list:
        return any(map(_holds_apart, value))
    return type(value) is dict and any(map(_holds_apart, value.values()))


class _Differ:
    def __init__(
        self, walker: Walker, atomic: Callable[[Any], bool], expand: int | None, count: int
    ) -> None:
        self.walker = walker
        self.atomic = atomic
        self.expand = expand
        self.count = count

    async def run(
        self, old_root: bytes | None, new_root: bytes, offset: int
    ) -> AsyncIterator[Change]:
        if old_root == new_root:
            return  # the same root (checked by both records' checksums): the same state
        try:
            old = {} if old_root is None else self._top(old_root)
            async for change in self.diff(old, self._top(new_root), ()):
                if offset:
                    offset -= 1
                    continue
                yield Change(
                    change.op,
                    change.keys,
                    None if change.op == "added" else await self._value(change.old),
                    None if change.op == "removed" else await self._value(change.new),
                )
        except (ValueError, TypeError, struct.error, RecursionError) as exc:
            raise CheckpointCorruptedError(f"malformed node ({type(exc).__name__})") from exc

    def _top(self, root: bytes) -> Any:
        top = self.walker.unwrap(root)  # covered by the record's checksum
        return self.walker.value(top) if top[0] == KIND_VALUE else top

    async def diff(self, old: Any, new: Any, keys: Keys) -> AsyncIterator[Change]:
        """``iter_changes``'s walk, over values whose parts may be stored apart.

        A change's values are left as found (stored apart, or an index node): :meth:`run`
        reads those of the changes it yields.
        """
        if isinstance(old, Apart) and isinstance(new, Apart) and old.name == new.name:
            return  # the same node: the same value
        if isinstance(old, Apart | bytes) or isinstance(new, Apart | bytes):
            async for change in self._nodes(old, new, keys):
                yield change
            return
        # Two values as found: the plain walk, which sees two nodes of the same hash as equal
        # (the same value); where it meets one otherwise, the walk goes on into it.
        for change in iter_changes(old, new, self.atomic):
            at = (*keys, *change.keys)
            if change.op == "changed" and self._refers(change.old, change.new):
                async for inner in self._nodes(change.old, change.new, at):
                    yield inner
            else:
                yield Change(change.op, at, change.old, change.new)

    def _refers(self, old: Any, new: Any) -> bool:
        """Whether a change the plain walk saw may hold a value stored apart."""
        if isinstance(old, Apart) or isinstance(new, Apart):
            return True
        typed = self.atomic(old) or self.atomic(new)
        return typed and (_holds_apart(old) or _holds_apart(new))

    async def _nodes(self, old: Any, new: Any, keys: Keys) -> AsyncIterator[Change]:
        """:meth:`diff` of two values, either stored apart or an index node."""
        a, b = await opened(self.walker, old), await opened(self.walker, new)
        kind_a, kind_b = self._kind(a), self._kind(b)
        if kind_a == kind_b == KIND_DICT:
            async for change in self._dicts(a, b, keys):
                yield change
        elif kind_a == kind_b == KIND_LIST:
            async for change in self._lists(a, b, keys):
                yield change
        elif kind_a is None and kind_b is None:  # plain values or typed ones: compared whole
            whole_a, whole_b = await self._whole(a), await self._whole(b)
            for change in iter_changes(whole_a, whole_b, self.atomic):
                if change.op != "changed" or change.keys:
                    raise CheckpointCorruptedError(
                        "a value compared whole changed inside"
                    )  # cannot happen
                yield Change("changed", keys, old, new)
        else:  # a dict against a list or a value: changed whole
            yield Change("changed", keys, old, new)

    def _kind(self, value: Any) -> int | None:
        """KIND_DICT, KIND_LIST for a container walked entry by entry, else None."""
        if isinstance(value, bytes):
            return value[0]
        if type(value) is dict and not self.atomic(value):
            return KIND_DICT
        return KIND_LIST if type(value) is list else None

    async def _dicts(self, a: Any, b: Any, keys: Keys) -> AsyncIterator[Change]:
        if a == {} or b == {}:  # all added or all removed (a first step): streamed
            op = "added" if a == {} else "removed"
            async for key, value in self._entries(b if a == {} else a):
                yield Change(op, (*keys, key), **{"new" if a == {} else "old": value})
            return
        if isinstance(a, bytes) and isinstance(b, bytes):
            old, new = await self._unshared(a, b)
        else:
            old, new = await self._all(a), await self._all(b)
        for key, value in old.items():
            if key not in new:
                yield Change("removed", (*keys, key), old=value)
            else:
                async for change in self.diff(value, new[key], (*keys, key)):
                    yield change
        for key, value in new.items():
            if key not in old:
                yield Change("added", (*keys, key), new=value)

    async def _all(self, value: Any) -> dict[Any, Any]:
        return {key: entry async for key, entry in self._entries(value)}

    async def _entries(self, value: Any) -> AsyncIterator[tuple[Any, Any]]:
        """A dict's entries, a large one's read a batch of chunks at a time."""
        if isinstance(value, bytes):
            async for entry in self.walker.entries(value):
                yield entry
        else:
            for entry in value.items():
                yield entry

    async def _unshared(self, a: bytes, b: bytes) -> tuple[dict[Any, Any], dict[Any, Any]]:
        """The entries of two large dicts' chunks, less the chunks both hold.

        A chunk both hold holds keys both have, with the same values; a dict's keys being
        unique, none of them is in a chunk only one holds, so leaving those chunks out
        changes nothing the walk yields. Index nodes both hold are left out unread.
        """
        sides: list[list[tuple[bytes, bytes | None]]] = [
            [(ref, None) for ref in node_refs(node, self.walker.digest)] for node in (a, b)
        ]
        while True:
            both = {ref for ref, _ in sides[0]} & {ref for ref, _ in sides[1]}
            sides = [[item for item in side if item[0] not in both] for side in sides]
            wanted = [ref for side in sides for ref, node in side if node is None]
            if not wanted:
                break
            got: dict[bytes, bytes] = {}
            for start in range(0, len(wanted), BATCH):
                part = wanted[start : start + BATCH]
                got.update(zip(part, await self.walker.nodes(part), strict=True))
            for n, side in enumerate(sides):
                out: list[tuple[bytes, bytes | None]] = []
                for ref, node in side:
                    node = got[ref] if node is None else node
                    if node[0] == KIND_DICT:  # an index node: its children, still unread
                        out += [(child, None) for child in node_refs(node, self.walker.digest)]
                    elif node[0] == KIND_VALUE:
                        out.append((ref, node))
                    else:
                        raise CheckpointCorruptedError("index node of the wrong kind")
                sides[n] = out
        entries: list[dict[Any, Any]] = []
        for side in sides:
            merged: dict[Any, Any] = {}
            for _, node in side:
                chunk = self.walker.value(node or b"")
                if type(chunk) is not dict:
                    raise CheckpointCorruptedError("chunk of the wrong kind")
                merged.update(chunk)
            entries.append(merged)
        return entries[0], entries[1]

    async def _lists(self, a: Any, b: Any, keys: Keys) -> AsyncIterator[Change]:
        """Two lists compared a run of elements at a time (as many as both chunks have left)."""
        old, new = self._chunks(a), self._chunks(b)
        left: list[Any] = []
        right: list[Any] = []
        index = 0
        while True:
            if not left:
                left = await anext(old, [])
            if not right:
                right = await anext(new, [])
            if not left and not right:
                break
            if not left or not right:  # one list ended: the rest of the other added or removed
                op, rest = ("added", right) if left == [] else ("removed", left)
                for value in rest:
                    yield Change(op, (*keys, index), **{"new" if op == "added" else "old": value})
                    index += 1
                left, right = [], []
                continue
            run = min(len(left), len(right))
            async for change in self.diff(left[:run], right[:run], ()):
                position, *inside = change.keys
                assert isinstance(position, int)
                yield Change(change.op, (*keys, index + position, *inside), change.old, change.new)
            left, right, index = left[run:], right[run:], index + run

    async def _chunks(self, value: Any) -> AsyncIterator[list[Any]]:
        if isinstance(value, bytes):
            async for chunk in self.walker.chunks(value):
                yield chunk
        else:
            yield value

    async def _value(self, value: Any) -> Any:
        """A change's value: whole, or read up to ``expand`` bytes."""
        if self.expand is None:
            return await self._whole(value)
        if isinstance(value, bytes):
            value = await cut(self.walker, value, 0, self.count)
        return await expanded(self.walker, value, self.count, self.walker.fetched + self.expand)

    async def _whole(self, value: Any) -> Any:
        """``value`` with every part stored apart read (an index node: its entries)."""
        value = await opened(self.walker, value)
        if isinstance(value, bytes):
            if value[0] == KIND_LIST:
                return [await self._whole(v) async for _, v in self.walker.entries(value)]
            return {k: await self._whole(v) async for k, v in self.walker.entries(value)}
        if type(value) is list:
            return [await self._whole(v) for v in value]
        if type(value) is dict:
            return {k: await self._whole(v) for k, v in value.items()}
        return value
