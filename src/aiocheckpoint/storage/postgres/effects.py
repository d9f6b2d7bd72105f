"""The effect journal in PostgreSQL: the ``effects`` table (schema version 6), its reads.

``put_effect`` rows go through the checkpoints' group commit (:mod:`.batching`): a batch's
effect records and checkpoints are written in one transaction (``Sql.effect_put``: one
``INSERT ... SELECT FROM unnest(...)``, each fenced row's token checked in it). A trigger
deletes a step's effects with its checkpoint row (retention, or a statement typed into
psql); the deletes of a step and of a workflow (:mod:`.sql`) also take the effects of steps
without a checkpoint, in the same statement.
"""

from __future__ import annotations

from typing import Final

from ...errors import CheckpointCorruptedError
from ..base import MAX_EFFECTS_PER_STEP, StoredEffect
from .protocols import Runner

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


class Effects:
    """The effect statements of one store (reads, orphan cleanup); arguments are checked."""

    def __init__(self, connection: Runner, quoted: str, max_record_bytes: int) -> None:
        self._connection = connection
        self._max = max_record_bytes
        e = f"{quoted}.effects"
        self._read = (
            "SELECT key, in_doubt, octet_length(data), "
            "CASE WHEN octet_length(data) <= $3 THEN data END "
            f"FROM {e} WHERE workflow_id = $1 AND step = $2 ORDER BY key LIMIT $4"
        )
        self._any = f"SELECT EXISTS (SELECT 1 FROM {e} WHERE workflow_id = $1)"
        self._in_doubt = f"SELECT DISTINCT workflow_id FROM {e} WHERE in_doubt ORDER BY 1"
        self._in_doubt_page = (
            f"SELECT DISTINCT workflow_id FROM {e} WHERE in_doubt AND workflow_id > $1 "
            "ORDER BY 1 LIMIT $2"
        )
        self._in_doubt_of = (
            "SELECT step, key, octet_length(data), "
            "CASE WHEN octet_length(data) <= $2 THEN data END "
            f"FROM {e} WHERE workflow_id = $1 AND in_doubt ORDER BY step, key LIMIT $3"
        )
        self._workflows = f"SELECT DISTINCT workflow_id FROM {e} ORDER BY 1"
        self._steps = f"SELECT DISTINCT step FROM {e} WHERE workflow_id = $1 ORDER BY 1"
        # The events below the oldest kept step go in the same statement (not counted).
        self._orphans = (
            f"WITH ev AS (DELETE FROM {quoted}.workflow_events "
            "WHERE workflow_id = $1 AND step < $2) "
            f"DELETE FROM {e} AS x WHERE workflow_id = $1 AND step < $2 AND NOT EXISTS "
            f"(SELECT 1 FROM {quoted}.checkpoints AS c "
            "WHERE c.workflow_id = $1 AND c.step = x.step)"
        )

    async def load(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """One step's records, ordered by key; an oversized one is corruption."""
        args = (workflow_id, step, self._max, MAX_EFFECTS_PER_STEP)
        rows = await self._connection.run("load_effects", lambda con: con.fetch(self._read, *args))
        return [self._effect(workflow_id, step, *row) for row in rows]

    async def in_doubt_of(self, workflow_id: str) -> list[StoredEffect]:
        """One workflow's records in doubt, ordered by step then key."""
        args = (workflow_id, self._max, MAX_EFFECTS_PER_STEP)
        rows = await self._connection.run(
            "in_doubt_effects", lambda con: con.fetch(self._in_doubt_of, *args)
        )
        return [
            self._effect(workflow_id, step, key, True, size, data) for step, key, size, data in rows
        ]

    def _effect(
        self, workflow_id: str, step: int, key: str, in_doubt: bool, size: int, data: bytes | None
    ) -> StoredEffect:
        """A row as a record; an oversized one is corruption."""
        if data is None:
            raise CheckpointCorruptedError(
                f"effect record {key!r} is {size} bytes, more than max_record_bytes={self._max}",
                workflow_id=workflow_id,
                step=step,
            )
        return StoredEffect(step, key, in_doubt, bytes(data))

    async def has_any(self, workflow_id: str) -> bool:
        """Whether the workflow has any effect record (a probe of the primary key)."""
        found = await self._connection.run(
            "has_effects", lambda con: con.fetchval(self._any, workflow_id)
        )
        return bool(found)

    async def in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt, in code point order."""
        rows = await self._connection.run(
            "in_doubt_workflows", lambda con: con.fetch(self._in_doubt)
        )
        return [row[0] for row in rows]

    async def in_doubt_page(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` workflows with an effect in doubt after ``after``, in order."""
        rows = await self._connection.run(
            "in_doubt_workflows", lambda con: con.fetch(self._in_doubt_page, after or "", limit)
        )
        return [row[0] for row in rows]

    async def workflows(self) -> list[str]:
        """Every workflow with an effect record, in code point order."""
        rows = await self._connection.run(
            "effect_workflows", lambda con: con.fetch(self._workflows)
        )
        return [row[0] for row in rows]

    async def steps(self, workflow_id: str) -> list[int]:
        """The steps of ``workflow_id`` with effect records, ascending."""
        rows = await self._connection.run(
            "effect_steps", lambda con: con.fetch(self._steps, workflow_id)
        )
        return [int(row[0]) for row in rows]

    async def drop_orphans(self, workflow_id: str, below: int) -> int:
        """Delete the records of steps below ``below`` without a checkpoint; how many.

        The workflow's events of steps below ``below`` go in the same statement.
        """
        status = await self._connection.run(
            "drop orphan effects",
            lambda con: con.execute(self._orphans, workflow_id, below),
            retry=True,
        )
        return int(status.split()[-1])
