"""The effect journal in SQLite: the ``effects`` table (schema version 5) and its statements.

Effect records are written by the writer thread as :class:`~.writer.RecordOp` operations,
so they join the group commit of the checkpoints (one transaction and one fsync for a
batch of both). A trigger deletes a step's effects with its checkpoint row (``delete``,
retention, or a statement typed into the sqlite3 shell); deleting a workflow or a step
also deletes the effects of steps that have no checkpoint.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ...errors import CheckpointCorruptedError
from ..base import MAX_EFFECTS_PER_STEP, StoredEffect
from . import records

__all__ = [
    "DELETE_STEP",
    "MIGRATION_STATEMENTS",
    "delete",
    "put",
    "read_any",
    "read_effects",
    "read_in_doubt",
    "read_in_doubt_effects",
    "read_steps",
    "read_workflows",
]

#: Schema version 5. ``IF NOT EXISTS`` throughout: it depends on no other new migration.
MIGRATION_STATEMENTS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE IF NOT EXISTS effects (
        id          INTEGER PRIMARY KEY,
        workflow_id TEXT    NOT NULL CHECK (typeof(workflow_id) = 'text'),
        step        INTEGER NOT NULL CHECK (typeof(step) = 'integer' AND step >= 0),
        key         TEXT    NOT NULL CHECK (typeof(key) = 'text'),
        in_doubt    INTEGER NOT NULL CHECK (in_doubt IN (0, 1)),
        data        BLOB    NOT NULL CHECK (typeof(data) = 'blob')
    )
    """,
    "CREATE UNIQUE INDEX IF NOT EXISTS effects_step_key ON effects (workflow_id, step, key)",
    # What in_doubt_workflows reads: only the rows in doubt (few), in id order.
    "CREATE INDEX IF NOT EXISTS effects_in_doubt ON effects (workflow_id) WHERE in_doubt = 1",
    """
    CREATE TRIGGER IF NOT EXISTS effects_go_with_checkpoints AFTER DELETE ON checkpoints
    BEGIN DELETE FROM effects WHERE workflow_id = old.workflow_id AND step = old.step; END
    """,
)

_PUT: Final = (
    "INSERT INTO effects (workflow_id, step, key, in_doubt, data) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (workflow_id, step, key) DO UPDATE "
    "SET in_doubt = excluded.in_doubt, data = excluded.data"
)
_READ: Final = (
    "SELECT key, in_doubt, length(data), CASE WHEN length(data) <= ? THEN data END "
    "FROM effects WHERE workflow_id = ? AND step = ? ORDER BY key LIMIT ?"
)
_IN_DOUBT: Final = "SELECT DISTINCT workflow_id FROM effects WHERE in_doubt = 1 ORDER BY 1"
#: A range of the partial index ``effects_in_doubt`` (ids are never empty).
_IN_DOUBT_PAGE: Final = (
    "SELECT DISTINCT workflow_id FROM effects WHERE in_doubt = 1 AND workflow_id > ? "
    "ORDER BY 1 LIMIT ?"
)
#: A prefix of the unique index ``effects_step_key``: one probe.
_ANY: Final = "SELECT EXISTS (SELECT 1 FROM effects WHERE workflow_id = ?)"
_IN_DOUBT_OF: Final = (
    "SELECT step, key, length(data), CASE WHEN length(data) <= ? THEN data END "
    "FROM effects WHERE workflow_id = ? AND in_doubt = 1 ORDER BY step, key LIMIT ?"
)
_WORKFLOWS: Final = "SELECT DISTINCT workflow_id FROM effects ORDER BY 1"
_STEPS: Final = "SELECT DISTINCT step FROM effects WHERE workflow_id = ? ORDER BY 1"
DELETE_STEP: Final = "DELETE FROM effects WHERE workflow_id = ? AND step = ?"
_DELETE_ALL: Final = "DELETE FROM effects WHERE workflow_id = ?"
_DELETE_ORPHANS: Final = (
    "DELETE FROM effects WHERE workflow_id = ?1 AND step < ?2 AND NOT EXISTS "
    "(SELECT 1 FROM checkpoints AS c WHERE c.workflow_id = ?1 AND c.step = effects.step)"
)

#: A sweep's thinning of the events below the oldest kept checkpoint's step.
_THIN_EVENTS: Final = "DELETE FROM workflow_events WHERE workflow_id = ? AND step < ?"


def put(
    conn: sqlite3.Connection,
    now: float,
    *,
    workflow_id: str,
    step: int,
    key: str,
    data: bytes,
    in_doubt: bool,
    token: int | None,
) -> None:
    """Store one effect record in the writer's transaction; fenced by ``token`` if given."""
    if token is not None and records.current_tokens(conn, [workflow_id]).get(workflow_id) != token:
        raise records.lost(workflow_id, token)
    conn.execute(_PUT, (workflow_id, step, key, int(in_doubt), data))


def delete(conn: sqlite3.Connection, workflow_id: str, step: int | None) -> None:
    """Delete one step's effects, or the whole workflow's (``step`` None)."""
    if step is None:
        conn.execute(_DELETE_ALL, (workflow_id,))
    else:
        conn.execute(DELETE_STEP, (workflow_id, step))


def drop_orphans(conn: sqlite3.Connection, _now: float, *, workflow_id: str, below: int) -> int:
    """Delete the effect records of steps below ``below`` without a checkpoint; how many.

    The workflow's events of steps below ``below`` go too (a sweep thins them with the
    checkpoints they describe), in the same transaction; they are not counted.
    """
    conn.execute(_THIN_EVENTS, (workflow_id, below))
    return conn.execute(_DELETE_ORPHANS, (workflow_id, below)).rowcount


def read_effects(
    conn: sqlite3.Connection, workflow_id: str, step: int, max_bytes: int
) -> list[StoredEffect]:
    """One step's effect records, ordered by key; an oversized or odd one is corruption."""
    rows = conn.execute(_READ, (max_bytes, workflow_id, step, MAX_EFFECTS_PER_STEP)).fetchall()
    return [_effect(workflow_id, step, k, d, n, b, max_bytes) for k, d, n, b in rows]


def read_in_doubt_effects(
    conn: sqlite3.Connection, workflow_id: str, max_bytes: int
) -> list[StoredEffect]:
    """One workflow's effect records in doubt, ordered by step then key."""
    args = (max_bytes, workflow_id, MAX_EFFECTS_PER_STEP)
    rows = conn.execute(_IN_DOUBT_OF, args).fetchall()
    return [
        _effect(workflow_id, step, key, 1, size, data, max_bytes) for step, key, size, data in rows
    ]


def _effect(
    workflow_id: str, step: int, key: object, in_doubt: int, size: int, data: object, max_bytes: int
) -> StoredEffect:
    """A row as a record; an oversized or odd one is corruption."""
    if not isinstance(data, bytes) or not isinstance(key, str):
        raise CheckpointCorruptedError(
            f"effect record {key!r} is {size} bytes (max_record_bytes={max_bytes}) or not a blob",
            workflow_id=workflow_id,
            step=step,
        )
    return StoredEffect(step, key, bool(in_doubt), data)


def read_any(conn: sqlite3.Connection, workflow_id: str) -> bool:
    """Whether the workflow has any effect record."""
    return bool(conn.execute(_ANY, (workflow_id,)).fetchone()[0])


def read_in_doubt(conn: sqlite3.Connection) -> list[str]:
    """Every workflow with an effect in doubt, sorted."""
    return [row[0] for row in conn.execute(_IN_DOUBT).fetchall() if isinstance(row[0], str)]


def read_in_doubt_page(conn: sqlite3.Connection, after: str | None, limit: int) -> list[str]:
    """Up to ``limit`` workflows with an effect in doubt after ``after``, sorted."""
    rows = conn.execute(_IN_DOUBT_PAGE, (after or "", limit)).fetchall()
    return [row[0] for row in rows if isinstance(row[0], str)]


def read_workflows(conn: sqlite3.Connection) -> list[str]:
    """Every workflow with an effect record, sorted (the unique index, in order)."""
    return [row[0] for row in conn.execute(_WORKFLOWS).fetchall() if isinstance(row[0], str)]


def read_steps(conn: sqlite3.Connection, workflow_id: str) -> list[int]:
    """The steps of ``workflow_id`` with effect records, ascending."""
    return [int(row[0]) for row in conn.execute(_STEPS, (workflow_id,)).fetchall()]
