"""Reference counting of content-addressed blobs, for stores with transactions.

The scheme of ``docs/incremental.md`` §8, written once for every database backend: a blob's
count is the number of distinct parent nodes plus the number of records whose root
references it directly. A save adds references for the new records' root references,
descending only into blobs that were not stored yet (an existing blob's sub-tree is already
counted); removing a record releases its root references, and a blob whose count falls to 0
is deleted and releases its own children. A backend runs both walks inside the transaction
that writes or removes the records, adds before releases, so a blob shared by an old and a
new record never drops to 0 in between.

The walks work one tree level at a time, for any number of trees at once, over two
operations a backend provides (:class:`RefCounts`, or :class:`AsyncRefCounts` for async
drivers), so each level costs a few set-based statements (PostgreSQL: one).
"""

from __future__ import annotations

from collections import ChainMap, Counter
from collections.abc import Collection, Generator, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ..errors import CheckpointCorruptedError, CheckpointError, InvalidArgumentError
from ..format import SplitResult, node_children, record_root_refs

__all__ = [
    "AsyncRefCounts",
    "RefCounts",
    "aadd_references",
    "add_references",
    "arelease_references",
    "blob_children",
    "checked_tree",
    "held_root_refs",
    "missing_blob",
    "release_references",
]

#: ``{hash: (references to add, the blob's bytes or None if the splits lack it)}``.
Rows = Mapping[bytes, tuple[int, bytes | None]]


class RefCounts(Protocol):
    """The two operations a backend provides, each over one tree level, in its transaction."""

    def upsert(self, rows: Rows) -> Collection[bytes]:
        """Add ``n`` to each stored blob's count, insert the others; return those inserted.

        A blob to insert whose bytes are ``None`` raises :func:`missing_blob`. A hash that
        another transaction inserted meanwhile gets ``n`` added and is left out of the
        result (its sub-tree is counted already).
        """
        ...

    def subtract(self, counts: Mapping[bytes, int]) -> Mapping[bytes, bytes]:
        """Subtract ``counts[h]``; return ``{h: data}`` of the blobs that reached 0.

        Hashes not stored are ignored. The store deletes the freed blobs now or, once the
        walk is over, those :func:`release_references` returns.
        """
        ...


class AsyncRefCounts(Protocol):
    """:class:`RefCounts` for async drivers."""

    async def upsert(self, rows: Rows) -> Collection[bytes]:
        """As :meth:`RefCounts.upsert`."""
        ...

    async def subtract(self, counts: Mapping[bytes, int]) -> Mapping[bytes, bytes]:
        """As :meth:`RefCounts.subtract`."""
        ...


def missing_blob(h: bytes) -> InvalidArgumentError:
    """The error for a blob to insert that the split lacks (one cut with a stale ``known``)."""
    return InvalidArgumentError(
        f"blob {h.hex()} is not stored and not in the split (cut with a stale 'known'?); "
        "encode the checkpoint again without 'known'"
    )


def checked_tree(record: bytes, split: object) -> tuple[bytes, ...]:
    """The root references of a ``save_tree`` call's version-2 ``record``, checked.

    Raises :class:`~aiocheckpoint.InvalidArgumentError` if ``split`` is not a
    :class:`~aiocheckpoint.format.tree.SplitResult`, if ``record`` is not a valid version-2
    record, or if it does not reference exactly ``split.root_refs``.
    """
    if not isinstance(split, SplitResult):
        raise InvalidArgumentError(f"split must be a SplitResult, not {type(split).__name__}")
    try:
        refs = record_root_refs(record)
    except CheckpointCorruptedError as exc:
        raise InvalidArgumentError(f"record is not a valid version-2 record: {exc}") from exc
    if refs != split.root_refs:
        raise InvalidArgumentError("record does not reference the root of split")
    return refs


def held_root_refs(record: bytes) -> tuple[bytes, ...]:
    """The refs a stored record holds (none for version 1); none if it cannot be read.

    A damaged record's blobs stay, counted too high (never freed, never missing), rather
    than making every later delete or replacement of it fail.
    """
    if len(record) > 4 and record[4] == 1:
        return ()  # version 1 (as record_root_refs finds, or a damaged one): every small save
    try:
        return record_root_refs(bytes(record))
    except CheckpointError:
        return ()


def blob_children(blob: bytes, digest_size: int) -> tuple[bytes, ...]:
    """A stored blob's children; none if it is damaged (they stay counted: garbage, not loss)."""
    try:
        return node_children(blob, digest_size)
    except CheckpointError:
        return ()


R = TypeVar("R")
# A walk yields (operation name, argument) and receives that operation's result.
_Walk = Generator[tuple[str, Any], Any, R]


def _add_walk(splits: Sequence[SplitResult]) -> _Walk[None]:
    blobs: Mapping[bytes, bytes]
    children: Mapping[bytes, tuple[bytes, ...]]
    if len(splits) == 1:  # the usual save: a ChainMap's lookups cost ~1 us each in Python
        blobs, children = splits[0].blobs, splits[0].children
    else:
        blobs = ChainMap(*(split.blobs for split in splits))
        children = ChainMap(*(split.children for split in splits))
    counts = Counter(h for split in splits for h in split.root_refs)
    while counts:
        inserted = yield "upsert", {h: (n, blobs.get(h)) for h, n in counts.items()}
        counts = Counter()
        for h in inserted:
            counts.update(children.get(h, ()))


def _release_walk(root_refs: Iterable[bytes]) -> _Walk[list[bytes]]:
    counts = Counter(root_refs)
    freed_all: list[bytes] = []
    while counts:
        freed: Mapping[bytes, bytes] = yield "subtract", dict(counts)
        freed_all.extend(freed)
        counts = Counter()
        for h, data in freed.items():
            counts.update(blob_children(data, len(h)))
    return freed_all


def _run(walk: _Walk[R], store: RefCounts) -> R:
    try:
        name, arg = next(walk)
        while True:
            name, arg = walk.send(getattr(store, name)(arg))
    except StopIteration as stop:
        done: R = stop.value
        return done


async def _arun(walk: _Walk[R], store: AsyncRefCounts) -> R:
    try:
        name, arg = next(walk)
        while True:
            name, arg = walk.send(await getattr(store, name)(arg))
    except StopIteration as stop:
        done: R = stop.value
        return done


def add_references(splits: Sequence[SplitResult], store: RefCounts) -> None:
    """Count the new records' references (each split's ``root_refs``); store the new blobs.

    One :meth:`~RefCounts.upsert` per tree level for all ``splits`` together. Raises
    :func:`missing_blob` if a blob to insert is in none of them; the caller rolls its
    transaction back.
    """
    _run(_add_walk(splits), store)


async def aadd_references(splits: Sequence[SplitResult], store: AsyncRefCounts) -> None:
    """:func:`add_references` over an async store."""
    await _arun(_add_walk(splits), store)


def release_references(root_refs: Iterable[bytes], store: RefCounts) -> list[bytes]:
    """Release removed records' references (``root_refs``); return the blobs freed."""
    return _run(_release_walk(root_refs), store)


async def arelease_references(root_refs: Iterable[bytes], store: AsyncRefCounts) -> list[bytes]:
    """:func:`release_references` over an async store."""
    return await _arun(_release_walk(root_refs), store)
