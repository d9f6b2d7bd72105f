"""The effect journal in PostgreSQL: the ``effects`` table (schema version 6), batched puts.

Concurrent ``put_effect`` calls are queued and written by one writer task, a batch per
statement (``INSERT ... SELECT FROM unnest(...)``, committed before any caller returns),
with each fenced row's token checked in the same statement, as the checkpoints' batches
do (:mod:`.batching`). A trigger deletes a step's effects with its checkpoint row (delete,
retention); ``delete`` also removes the effects of steps without a checkpoint.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ...errors import CheckpointCorruptedError, LeaseLostError
from ..base import MAX_EFFECTS_PER_STEP, StoredEffect

if TYPE_CHECKING:  # connection imports the schema, which imports this module's migration
    from .connection import Connection

__all__ = ["MIGRATION", "Effects"]

#: Schema version 6. ``IF NOT EXISTS`` / ``OR REPLACE``: it depends on no other new migration.
MIGRATION: Final[tuple[str, ...]] = (
    """
    CREATE TABLE IF NOT EXISTS {s}.effects (
        workflow_id text COLLATE "C" NOT NULL
            CHECK (octet_length(workflow_id) BETWEEN 1 AND 255),
        step bigint NOT NULL CHECK (step >= 0),
        key text COLLATE "C" NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
        in_doubt boolean NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (workflow_id, step, key)
    )
    """,
    "CREATE INDEX IF NOT EXISTS effects_in_doubt ON {s}.effects (workflow_id) WHERE in_doubt",
    """
    CREATE OR REPLACE FUNCTION {s}.effects_go_with_checkpoints() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN
        DELETE FROM {s}.effects WHERE workflow_id = OLD.workflow_id AND step = OLD.step;
        RETURN NULL;
    END $$
    """,
    "DROP TRIGGER IF EXISTS effects_go_with_checkpoints ON {s}.checkpoints",
    """
    CREATE TRIGGER effects_go_with_checkpoints AFTER DELETE ON {s}.checkpoints
    FOR EACH ROW EXECUTE FUNCTION {s}.effects_go_with_checkpoints()
    """,
)

#: The most rows one batch writes.
_MAX_BATCH: Final = 500


@dataclass(eq=False)
class _Put:
    row: tuple[str, int, str, bool, bytes, int | None]
    future: asyncio.Future[None] = field(repr=False)


class Effects:
    """The effect statements of one store and its queue of puts; arguments are checked."""

    def __init__(self, connection: Connection, quoted: str, max_record_bytes: int) -> None:
        self._connection = connection
        self._max = max_record_bytes
        e, w = f"{quoted}.effects", f"{quoted}.workflows"
        self._put = (
            "WITH r AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::bigint[], "
            "$3::text[], $4::boolean[], $5::bytea[], $6::bigint[]) AS r(w, s, k, x, d, t)), "
            f"held AS MATERIALIZED (SELECT workflow_id, fencing_token FROM {w} "
            "WHERE workflow_id IN (SELECT w FROM r WHERE t IS NOT NULL) "
            "ORDER BY workflow_id FOR SHARE) "
            f"INSERT INTO {e} AS e (workflow_id, step, key, in_doubt, data) "
            "SELECT r.w, r.s, r.k, r.x, r.d FROM r LEFT JOIN held ON held.workflow_id = r.w "
            "WHERE r.t IS NULL OR held.fencing_token = r.t ORDER BY 1, 2, 3 "
            "ON CONFLICT (workflow_id, step, key) DO UPDATE "
            "SET in_doubt = EXCLUDED.in_doubt, data = EXCLUDED.data "
            "RETURNING workflow_id, step, key"
        )
        self._read = (
            "SELECT key, in_doubt, octet_length(data), "
            "CASE WHEN octet_length(data) <= $3 THEN data END "
            f"FROM {e} WHERE workflow_id = $1 AND step = $2 ORDER BY key LIMIT $4"
        )
        self._in_doubt = f"SELECT DISTINCT workflow_id FROM {e} WHERE in_doubt ORDER BY 1"
        self._delete = (
            f"DELETE FROM {e} WHERE workflow_id = $1 AND ($2::bigint IS NULL OR step = $2)"
        )
        self._queue: deque[_Put] = deque()
        self._writer: asyncio.Task[None] | None = None

    async def put(
        self, workflow_id: str, step: int, key: str, data: bytes, in_doubt: bool, token: int | None
    ) -> None:
        """Queue one record and return once its batch has committed (or raise its error)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Put((workflow_id, step, key, in_doubt, data, token), future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all())
        await future

    async def drain(self) -> None:
        """Wait for the queued puts."""
        while self._writer is not None:
            await asyncio.wait([self._writer])

    async def _write_all(self) -> None:
        try:
            while batch := self._take():
                await self._write(batch)
        finally:
            self._writer = None

    def _take(self) -> list[_Put]:
        """Queued puts for one statement, oldest first; a repeated key waits for the next."""
        batch: list[_Put] = []
        seen: set[tuple[str, int, str]] = set()
        left: deque[_Put] = deque()
        while self._queue:
            item = self._queue.popleft()
            if item.future.done():  # cancelled while queued: never written
                continue
            name = item.row[:3]
            if name in seen or len(batch) >= _MAX_BATCH:
                left.append(item)
                continue
            seen.add(name)
            batch.append(item)
        self._queue = left
        return batch

    async def _write(self, batch: list[_Put]) -> None:
        columns = [list(column) for column in zip(*(item.row for item in batch), strict=True)]
        try:
            rows = await self._connection.run(
                "effect record", lambda con: con.fetch(self._put, *columns)
            )
        except Exception as exc:
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        written = {(row[0], row[1], row[2]) for row in rows}
        for item in batch:
            if item.future.done():
                continue
            if item.row[:3] in written:
                item.future.set_result(None)
            else:
                workflow_id, token = item.row[0], item.row[5]
                item.future.set_exception(
                    LeaseLostError(
                        f"lease {token} on workflow {workflow_id!r} is no longer current; "
                        "the effect record was not written"
                    )
                )

    async def load(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """One step's records, ordered by key; an oversized one is corruption."""
        args = (workflow_id, step, self._max, MAX_EFFECTS_PER_STEP)
        rows = await self._connection.run("load_effects", lambda con: con.fetch(self._read, *args))
        out = []
        for key, in_doubt, size, data in rows:
            if data is None:
                raise CheckpointCorruptedError(
                    f"effect record {key!r} is {size} bytes, more than "
                    f"max_record_bytes={self._max}",
                    workflow_id=workflow_id,
                    step=step,
                )
            out.append(StoredEffect(step, key, in_doubt, bytes(data)))
        return out

    async def in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt, in code point order."""
        rows = await self._connection.run(
            "in_doubt_workflows", lambda con: con.fetch(self._in_doubt)
        )
        return [row[0] for row in rows]

    async def delete(self, workflow_id: str, step: int | None) -> None:
        """Delete one step's effects, or the workflow's (after its checkpoints went)."""
        await self._connection.run(
            "delete effects", lambda con: con.execute(self._delete, workflow_id, step), retry=True
        )
