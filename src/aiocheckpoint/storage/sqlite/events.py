"""A workflow's event history in SQLite (:mod:`aiocheckpoint.storage.events`).

Events are appended by the functions of :mod:`.records` and :mod:`.control` in the
writer's transaction, right after the change they describe: atomic with it, and no round
trip of their own. A workflow's events go with its record (a trigger), however it goes.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from typing import Final

from ...leases import WorkflowRecord
from ..events import EventKind, Reseal, StoredEvent, reseal_fields

__all__ = ["MIGRATION_STATEMENTS", "append", "append_for", "page", "put", "reseal"]

MIGRATION_STATEMENTS: Final[tuple[str, ...]] = (
    # AUTOINCREMENT: a sequence number is never handed out twice, even after deletes.
    """
    CREATE TABLE workflow_events (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        workflow_id TEXT    NOT NULL CHECK (typeof(workflow_id) = 'text'),
        kind        TEXT    NOT NULL,
        at          REAL    NOT NULL,
        step        INTEGER,
        attempt     INTEGER,
        data        TEXT    NOT NULL
    )
    """,
    "CREATE INDEX workflow_events_workflow ON workflow_events (workflow_id, seq)",
    """
    CREATE TRIGGER workflows_events_on_delete AFTER DELETE ON workflows
    BEGIN DELETE FROM workflow_events WHERE workflow_id = old.workflow_id; END
    """,
)

#: The kinds whose ``attempt`` is the record's count of failed runs.
_COUNTED: Final = frozenset(
    {
        EventKind.STEP_FAILED,
        EventKind.RETRY_SCHEDULED,
        EventKind.FAILED,
        EventKind.EFFECT_IN_DOUBT,
    }
)
_APPEND: Final = (
    "INSERT INTO workflow_events (workflow_id, kind, at, step, attempt, data) "
    "SELECT workflow_id, ?2, ?3, latest_step, CASE WHEN ?4 THEN attempts END, ?5 "
    "FROM workflows WHERE workflow_id = ?1"
)
_DROP: Final = "DELETE FROM workflow_events WHERE workflow_id = ?"
_PUT: Final = (
    "INSERT INTO workflow_events (workflow_id, kind, at, step, attempt, data) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_RESEAL_EVENT: Final = (
    "UPDATE workflow_events SET data = ? WHERE seq = ? AND workflow_id = ? AND data = ?"
)
_FIELDS: Final = "SELECT resume_input, last_error FROM workflows WHERE workflow_id = ?"
_SET_FIELDS: Final = "UPDATE workflows SET resume_input = ?, last_error = ? WHERE workflow_id = ?"
_PAGE: Final = (
    "SELECT seq, kind, at, step, attempt, data FROM workflow_events "
    "WHERE workflow_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)


def append(
    conn: sqlite3.Connection, now: float, workflow_id: str, kind: EventKind, data: str
) -> None:
    """Append an event of the workflow, with its record's latest step (and attempts)."""
    conn.execute(_APPEND, (workflow_id, kind.value, now, kind in _COUNTED, data))


def append_for(
    conn: sqlite3.Connection, now: float, record: WorkflowRecord, kind: EventKind, data: str
) -> None:
    """Append an event of ``record``, just written: its step and attempts as they are now.

    No look-up of the record (:func:`append` reads it in its statement).
    """
    attempt = record.attempts if kind in _COUNTED else None
    row = (record.workflow_id, kind.value, now, record.latest_step, attempt, data)
    conn.execute(_PUT, row)


def put(
    conn: sqlite3.Connection,
    now: float,
    workflow_id: str,
    events: list[StoredEvent],
    replace: bool,
) -> None:
    """Append carried events as they are (after deleting the workflow's, with ``replace``)."""
    if replace:
        conn.execute(_DROP, (workflow_id,))
    conn.executemany(
        _PUT,
        [(workflow_id, e.kind, e.at.timestamp(), e.step, e.attempt, e.data) for e in events],
    )


def page(
    conn: sqlite3.Connection, workflow_id: str, after: int | None, limit: int
) -> list[StoredEvent]:
    """The workflow's events after ``after``, oldest first, at most ``limit``."""
    rows = conn.execute(_PAGE, (workflow_id, -1 if after is None else after, limit)).fetchall()
    return [
        StoredEvent(seq, kind, datetime.fromtimestamp(at, timezone.utc), step, attempt, data)
        for seq, kind, at, step, attempt, data in rows
    ]


def reseal(conn: sqlite3.Connection, now: float, workflow_id: str, changes: list[Reseal]) -> int:
    """Replace each change's text that still holds its ``old``; how many were replaced.

    A record field is compared as a JSON value (its stored text may be spelled otherwise).
    """
    done = 0
    for c in changes:
        if c.field == "event":
            done += conn.execute(_RESEAL_EVENT, (c.new, c.seq, workflow_id, c.old)).rowcount
    fields = [c for c in changes if c.field != "event"]
    row = conn.execute(_FIELDS, (workflow_id,)).fetchone() if fields else None
    if row is None:
        return done
    resume, error, changed = reseal_fields(row[0], row[1], fields)
    if changed:
        conn.execute(_SET_FIELDS, (resume, error, workflow_id))
    return done + changed
