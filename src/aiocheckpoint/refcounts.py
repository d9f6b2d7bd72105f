"""Reference counting of content-addressed blobs, for stores with transactions.

The scheme of ``docs/incremental.md`` §8, written once for every database backend: a blob's
count is the number of distinct parent nodes plus the number of records whose root
references it directly. A save adds references for the new record's root references,
descending only into blobs that were not stored yet (an existing blob's sub-tree is already
counted); removing a record releases its root references, and a blob whose count falls to 0
is deleted and releases its own children. A backend runs both walks inside the transaction
that writes or removes the record, adds before releases, so a blob shared by an old and a new
record never drops to 0 in between.

The walks work one tree level at a time over a small interface (:class:`RefCounts`, or
:class:`AsyncRefCounts` for async drivers), so each level is a few set-based statements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Generator, Mapping
from typing import Any, Protocol

from .errors import CheckpointCorruptedError, InvalidArgumentError
from .incremental import SplitResult, node_children

__all__ = [
    "AsyncRefCounts",
    "RefCounts",
    "add_references",
    "aadd_references",
    "arelease_references",
    "release_references",
]


class RefCounts(Protocol):
    """The three statements a backend provides, each over one tree level, in its transaction."""

    def add(self, counts: Mapping[bytes, int]) -> Collection[bytes]:
        """Add ``counts[h]`` to each stored blob ``h``; return the hashes not stored."""
        ...

    def insert(self, rows: Mapping[bytes, tuple[int, bytes]]) -> Collection[bytes]:
        """Store ``{h: (refs, data)}``; return the hashes actually inserted.

        A hash that another transaction inserted meanwhile gets ``refs`` added instead and is
        left out of the result (its sub-tree is already counted).
        """
        ...

    def subtract(self, counts: Mapping[bytes, int]) -> Mapping[bytes, bytes]:
        """Subtract ``counts[h]``; delete the blobs that reach 0 and return ``{h: data}``.

        Hashes not stored are ignored.
        """
        ...


class AsyncRefCounts(Protocol):
    """:class:`RefCounts` for async drivers."""

    async def add(self, counts: Mapping[bytes, int]) -> Collection[bytes]:
        """As :meth:`RefCounts.add`."""
        ...

    async def insert(self, rows: Mapping[bytes, tuple[int, bytes]]) -> Collection[bytes]:
        """As :meth:`RefCounts.insert`."""
        ...

    async def subtract(self, counts: Mapping[bytes, int]) -> Mapping[bytes, bytes]:
        """As :meth:`RefCounts.subtract`."""
        ...


# A walk yields (method name, argument) and receives that method's result.
_Walk = Generator[tuple[str, Any], Any, int]


def _add_walk(root_refs: Collection[bytes], split: SplitResult) -> _Walk:
    counts = Counter(root_refs)
    inserted_total = 0
    while counts:
        missing = yield "add", dict(counts)
        rows: dict[bytes, tuple[int, bytes]] = {}
        for h in missing:
            data = split.blobs.get(h)
            if data is None:
                # Only a split made with ``known`` can lack a blob: the caller believed the
                # store had it, and it does not (any more).
                raise InvalidArgumentError(
                    f"blob {h.hex()} is neither stored nor in the split (a stale 'known'?); "
                    "encode the checkpoint again without 'known'"
                )
            rows[h] = (counts[h], data)
        counts = Counter()
        if rows:
            inserted = yield "insert", rows
            inserted_total += len(inserted)
            for h in inserted:
                counts.update(split.children.get(h, ()))
    return inserted_total


def _release_walk(root_refs: Collection[bytes], digest_size: int) -> _Walk:
    counts = Counter(root_refs)
    freed_total = 0
    while counts:
        freed: Mapping[bytes, bytes] = yield "subtract", dict(counts)
        freed_total += len(freed)
        counts = Counter()
        for data in freed.values():
            try:
                counts.update(node_children(data, digest_size))
            except CheckpointCorruptedError:
                # A damaged blob's children cannot be named: they stay, counted, until a
                # full recount (they are garbage, never a missing blob).
                continue
    return freed_total


def _run(walk: _Walk, store: RefCounts) -> int:
    try:
        name, arg = next(walk)
        while True:
            name, arg = walk.send(getattr(store, name)(arg))
    except StopIteration as stop:
        done: int = stop.value
        return done


async def _arun(walk: _Walk, store: AsyncRefCounts) -> int:
    try:
        name, arg = next(walk)
        while True:
            name, arg = walk.send(await getattr(store, name)(arg))
    except StopIteration as stop:
        done: int = stop.value
        return done


def add_references(root_refs: Collection[bytes], split: SplitResult, store: RefCounts) -> int:
    """Count a new record's references (``root_refs``); store the blobs that are new.

    Returns how many blobs were inserted. Raises
    :class:`~aiocheckpoint.InvalidArgumentError` if a blob to insert is not in
    ``split.blobs``; the caller rolls its transaction back.
    """
    return _run(_add_walk(root_refs, split), store)


async def aadd_references(
    root_refs: Collection[bytes], split: SplitResult, store: AsyncRefCounts
) -> int:
    """:func:`add_references` over an async store."""
    return await _arun(_add_walk(root_refs, split), store)


def release_references(root_refs: Collection[bytes], store: RefCounts, digest_size: int) -> int:
    """Release a removed record's references; return how many blobs were freed."""
    return _run(_release_walk(root_refs, digest_size), store)


async def arelease_references(
    root_refs: Collection[bytes], store: AsyncRefCounts, digest_size: int
) -> int:
    """:func:`release_references` over an async store."""
    return await _arun(_release_walk(root_refs, digest_size), store)
