"""Blobs of incremental checkpoints in PostgreSQL: the blob lock and the reference counts.

A blob's count in ``blob_refs`` is kept exact in the transaction that writes or removes the
records referencing it (docs/incremental.md, section 8): the level walks are those of
:mod:`aiocheckpoint.storage.refcounts`, shared with the SQLite store; :class:`_Levels` gives
each level its one statement. A blob is deleted in the transaction that drops its count to
0, so there is nothing for ``collect_garbage`` to do.

**Lock order.** A transaction that changes counts holds the store's blob lock (an advisory
lock) from before its first row lock to its commit: blob lock, then rows. A transaction that
learns only after locking rows that it must change counts (a delete, or a save that replaced
or pruned a version-2 record) may not wait for the lock, since its holder may be waiting for
those rows: it tries the lock, and if it is taken, :meth:`Blobs.lock_late` raises
:class:`BlobLockBusy`, the transaction rolls back and runs again taking the lock first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...format import SplitResult
from ..refcounts import Rows, aadd_references, arelease_references, held_root_refs, missing_blob
from .connection import Raced
from .sql import Sql
from .stats import WriteStats

__all__ = ["BlobLockBusy", "Blobs"]


class BlobLockBusy(Raced):
    """The blob lock is taken, and this transaction holds row locks: run it again, lock first."""


class Blobs:
    """The blob statements of one store, run on a connection inside the caller's transaction."""

    def __init__(self, sql: Sql, schema: str, stats: WriteStats) -> None:
        self._sql = sql
        self._schema = schema
        self._stats = stats

    async def lock(self, con: Any) -> None:
        """Serialise this transaction's blob counting with every other writer's.

        Only before the transaction's first row lock (the lock order, above).
        """
        await con.execute(self._sql.blob_lock, self._schema)

    async def lock_late(self, con: Any) -> None:
        """Take the blob lock after row locks if it is free; else raise :class:`BlobLockBusy`."""
        if not await con.fetchval(self._sql.blob_try_lock, self._schema):
            raise BlobLockBusy("the blob lock is taken; the transaction runs again, lock first")

    async def add(self, con: Any, splits: Iterable[SplitResult]) -> None:
        """Add the references of the new trees ``splits``, inserting the blobs not stored."""
        await aadd_references(list(splits), _Levels(con, self._sql, self._stats))

    async def release(self, con: Any, released: Iterable[bytes]) -> None:
        """Release the counted hashes level by level, then drop the blobs that reached 0."""
        freed = await arelease_references(released, _Levels(con, self._sql, self._stats))
        if freed:
            await con.execute(self._sql.blob_drop, freed)

    async def release_records(self, con: Any, records: Iterable[bytes | None]) -> None:
        """Release the references of removed records (None: a version-1 record, none held)."""
        await self.release(
            con, [h for data in records if data is not None for h in held_root_refs(data)]
        )


class _Levels:
    """:class:`~aiocheckpoint.storage.refcounts.AsyncRefCounts`: one statement per tree level.

    Hashes go in sorted, so concurrent transactions lock blob rows in the same order.
    """

    def __init__(self, con: Any, sql: Sql, stats: WriteStats) -> None:
        self._con = con
        self._sql = sql
        self._stats = stats

    async def upsert(self, rows: Rows) -> list[bytes]:
        """One ``INSERT ... ON CONFLICT DO UPDATE`` for the level; return the hashes inserted."""
        hashes = sorted(rows)
        counts: list[int] = []
        data: list[bytes] = []
        for h in hashes:
            n, blob = rows[h]
            if blob is None:  # the statement needs every blob's bytes, stored or not
                raise missing_blob(h)
            counts.append(n)
            data.append(blob)
        result = await self._con.fetch(self._sql.blob_add, hashes, counts, data)
        self._stats.blob_statements += 1
        # Inserted now if its count is what was sent: an existing blob ends above that.
        return [bytes(r[0]) for r in result if r[1] == rows[bytes(r[0])][0]]

    async def subtract(self, counts: Mapping[bytes, int]) -> dict[bytes, bytes]:
        """One ``UPDATE`` for the level; return the blobs at 0 (dropped after the walk)."""
        hashes = sorted(counts)
        result = await self._con.fetch(self._sql.blob_release, hashes, [counts[h] for h in hashes])
        self._stats.blob_statements += 1
        return {bytes(r[0]): bytes(r[2]) for r in result if r[1] <= 0}
