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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...format import SplitResult
from ..base import check_record_size
from ..refcounts import Rows, aadd_references, arelease_references, held_root_refs, missing_blob
from .connection import Raced
from .sql import Sql
from .stats import WriteStats

__all__ = ["BlobLockBusy", "Blobs"]


class BlobLockBusy(Raced):
    """The blob lock is taken, and this transaction holds row locks: run it again, lock first."""


class Blobs:
    """The blob statements of one store, run on a connection inside the caller's transaction."""

    def __init__(self, sql: Sql, schema: str, stats: WriteStats, max_blob_bytes: int) -> None:
        self._sql = sql
        self._schema = schema
        self._stats = stats
        self._max_blob_bytes = max_blob_bytes

    async def lock(self, con: Any) -> None:
        """Serialise this transaction's blob counting with every other writer's.

        Only before the transaction's first row lock (the lock order, above).
        """
        await con.execute(self._sql.blob_lock, self._schema)

    async def lock_late(self, con: Any) -> None:
        """Take the blob lock after row locks if it is free; else raise :class:`BlobLockBusy`."""
        if not await con.fetchval(self._sql.blob_try_lock, self._schema):
            raise BlobLockBusy("the blob lock is taken; the transaction runs again, lock first")

    async def add(
        self, con: Any, splits: Iterable[SplitResult], upsert: Sequence[Any]
    ) -> list[Any]:
        """Take the blob lock, add the references of the trees ``splits``, write the records.

        ``upsert`` holds the arguments of the batch's upsert (:attr:`.Sql.upsert`), whose rows
        this returns. The lock, the trees' first level and the upsert are one statement
        (:attr:`.Sql.upsert_tree`: the lock before any row lock, the first level's rows before
        the records'); the deeper levels follow it, before any release. The blobs not stored
        are inserted. A blob sent over ``max_blob_bytes`` raises
        :class:`~aiocheckpoint.InvalidArgumentError` (the caller's transaction rolls back):
        the walk sends only the levels it descends into, so a save checks what it may store,
        not every blob of its tree.
        """
        levels = _Levels(con, self._sql, self._stats, self._max_blob_bytes, (*upsert, self._schema))
        await aadd_references(list(splits), levels)
        if levels.upsert_with is not None:  # no level to add: the lock, then the upsert
            await self.lock(con)
            return list(await con.fetch(self._sql.upsert, *upsert))
        return levels.records

    async def release(self, con: Any, released: Iterable[bytes]) -> None:
        """Release the counted hashes level by level, then drop the blobs that reached 0."""
        freed = await arelease_references(
            released, _Levels(con, self._sql, self._stats, self._max_blob_bytes)
        )
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

    def __init__(
        self,
        con: Any,
        sql: Sql,
        stats: WriteStats,
        max_bytes: int,
        upsert_with: tuple[Any, ...] | None = None,
    ) -> None:
        self._con = con
        self._sql = sql
        self._stats = stats
        #: The largest blob an upsert may send.
        self._max_bytes = max_bytes
        #: The batch upsert's arguments and the schema: the next level goes with them, in
        #: :attr:`.Sql.upsert_tree` (then None).
        self.upsert_with = upsert_with
        #: The rows of that upsert, once it ran.
        self.records: list[Any] = []

    async def upsert(self, rows: Rows) -> list[bytes]:
        """One ``INSERT ... ON CONFLICT DO UPDATE`` for the level; return the hashes inserted."""
        hashes = sorted(rows)
        counts: list[int] = []
        data: list[bytes] = []
        for h in hashes:
            n, blob = rows[h]
            if blob is None:  # the statement needs every blob's bytes, stored or not
                raise missing_blob(h)
            check_record_size(blob, self._max_bytes)
            counts.append(n)
            data.append(blob)
        if self.upsert_with is None:
            result = [
                (r[0], r[1])
                for r in await self._con.fetch(self._sql.blob_add, hashes, counts, data)
            ]
        else:
            both = await self._con.fetch(
                self._sql.upsert_tree, *self.upsert_with, hashes, counts, data
            )
            self.upsert_with = None
            # The level's rows are those without a workflow id (columns 6 and 7).
            self.records = [r for r in both if r[0] is not None]
            result = [(r[5], r[6]) for r in both if r[0] is None]
        self._stats.blob_statements += 1
        # Inserted now if its count is what was sent: an existing blob ends above that.
        return [bytes(h) for h, n in result if n == rows[bytes(h)][0]]

    async def subtract(self, counts: Mapping[bytes, int]) -> dict[bytes, bytes]:
        """One ``UPDATE`` for the level; return the blobs at 0 (dropped after the walk)."""
        hashes = sorted(counts)
        result = await self._con.fetch(self._sql.blob_release, hashes, [counts[h] for h in hashes])
        self._stats.blob_statements += 1
        return {bytes(r[0]): bytes(r[2]) for r in result if r[1] <= 0}
