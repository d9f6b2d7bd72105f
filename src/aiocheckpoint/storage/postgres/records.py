"""Reads and deletes of the PostgreSQL store's checkpoint records (writes: :mod:`.batching`).

Every read is one primary-key lookup or range scan, and a record's length is checked on the
server (``octet_length``) before any of its bytes are sent: a record over
``max_record_bytes`` comes back as its size only, and reads as corrupted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime
from typing import Any, TypeVar

from ...errors import CheckpointCorruptedError
from ..base import StoredCheckpoint
from .blobs import BlobLockBusy, Blobs
from .connection import Connection
from .sql import Sql

__all__ = ["MAX_STEP", "Records"]

MAX_STEP = 2**63 - 1

_T = TypeVar("_T")


class Records:
    """The record statements of one store; arguments are checked already."""

    def __init__(
        self, connection: Connection, sql: Sql, blobs: Blobs, max_record_bytes: int
    ) -> None:
        self._connection = connection
        self._sql = sql
        self._blobs = blobs
        self._max_record_bytes = max_record_bytes

    async def load(self, workflow_id: str, step: int | None) -> StoredCheckpoint | None:
        """One step's record (the highest when ``step`` is None), or None."""
        args: list[object]
        if step is None:
            sql, args = self._sql.latest, [workflow_id, self._max_record_bytes]
        else:
            sql, args = self._sql.at_step, [workflow_id, step, self._max_record_bytes]
        row = await self._connection.run("load", lambda con: con.fetchrow(sql, *args))
        return None if row is None else self._record(workflow_id, row)

    async def scan(
        self,
        workflow_id: str,
        after: int | None,
        before: int | None,
        limit: int | None,
        descending: bool,
    ) -> list[StoredCheckpoint]:
        """Records with ``after < step < before`` in step order, at most ``limit``."""
        upper = MAX_STEP if before is None else before - 1
        sql = self._sql.scan_desc if descending else self._sql.scan_asc
        args = (workflow_id, -1 if after is None else after, upper, limit, self._max_record_bytes)
        rows = await self._connection.run("scan", lambda con: con.fetch(sql, *args))
        return [self._record(workflow_id, row) for row in rows]

    async def exists(self, workflow_id: str, step: int | None) -> bool:
        """Whether the step (or any step) is stored."""
        args: list[object]
        if step is None:
            sql, args = self._sql.exists_any, [workflow_id]
        else:
            sql, args = self._sql.exists_step, [workflow_id, step]
        return bool(await self._connection.run("exists", lambda con: con.fetchval(sql, *args)))

    async def delete(self, workflow_id: str, step: int | None) -> bool:
        """Delete one step, or the workflow with its record; their effects, their blobs' refs."""

        async def delete_all(con: Any) -> tuple[bool, list[bytes] | None]:
            count, records = await con.fetchrow(self._sql.delete_all, workflow_id)
            return bool(count), records

        async def delete_step(con: Any) -> tuple[bool, list[bytes] | None]:
            rows = await con.fetch(self._sql.delete_step, workflow_id, step)
            return bool(rows), [row[0] for row in rows]

        return await self.releasing("delete", delete_all if step is None else delete_step)

    async def delete_untouched(self, workflow_id: str, updated_at: datetime) -> int | None:
        """Delete the workflow whole if its record is untouched since ``updated_at``.

        Returns its checkpoint records' bytes, or None when nothing was deleted.
        """

        async def delete(con: Any) -> tuple[int | None, list[bytes] | None]:
            size, records = await con.fetchrow(self._sql.delete_untouched, workflow_id, updated_at)
            return (None if size is None else int(size)), records

        return await self.releasing("conditional delete", delete)

    async def releasing(
        self, what: str, run: Callable[[Any], Awaitable[tuple[_T, list[bytes] | None]]]
    ) -> _T:
        """``run``'s delete in a transaction that releases the deleted records' blob refs."""

        async def attempt(con: Any, lock_first: bool) -> _T:
            async with con.transaction():
                if lock_first:
                    await self._blobs.lock(con)
                result, records = await run(con)
                if records:
                    if not lock_first:
                        await self._blobs.lock_late(con)
                    await self._blobs.release_records(con, records)
            return result

        async def in_lock_order(con: Any) -> _T:
            try:
                return await attempt(con, lock_first=False)
            except BlobLockBusy:  # rolled back: nothing was deleted yet
                return await attempt(con, lock_first=True)

        return await self._connection.run(what, in_lock_order, retry=False)

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, in code point order."""
        sql = self._sql.workflows
        rows = await self._connection.run("list_workflows", lambda con: con.fetch(sql))
        return [str(row[0]) for row in rows]

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """The stored blobs among ``hashes`` (one statement); those over the limit left out."""
        wanted = list(hashes)
        if not wanted:
            return {}
        sql, cap = self._sql.blob_fetch, self._max_record_bytes
        rows = await self._connection.run("fetch_blobs", lambda con: con.fetch(sql, wanted, cap))
        return {bytes(row[0]): bytes(row[1]) for row in rows}

    def _record(self, workflow_id: str, row: Any) -> StoredCheckpoint:
        step, size, data = row[0], row[1], row[2]
        if data is None:
            raise CheckpointCorruptedError(
                f"record of {size} bytes exceeds max_record_bytes={self._max_record_bytes}",
                workflow_id=workflow_id,
                step=step,
            )
        return StoredCheckpoint(int(step), bytes(data))
