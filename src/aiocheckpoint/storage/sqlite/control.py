"""Cancel and retry in SQLite (``storage/lifecycle.py``), and the migration they need.

Like :mod:`.records`, these run in the writer's ``BEGIN IMMEDIATE`` transaction: the status
check and the write are one atomic step, and a refusal writes nothing.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Final

from ...leases import WorkflowRecord
from ..events import EventKind
from ..lifecycle import cancel_error, check_cancel, check_retry
from . import events, records

__all__ = ["MIGRATION_STATEMENTS", "cancel", "retry"]

#: A CHECK constraint cannot be altered: the table is rebuilt with the ``cancelled`` status,
#: its columns as of version 6, and the indexes and trigger it had.
MIGRATION_STATEMENTS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE workflows_v7 (
        workflow_id         TEXT    PRIMARY KEY NOT NULL CHECK (typeof(workflow_id) = 'text'),
        status              TEXT    NOT NULL DEFAULT 'unfinished'
                            CHECK (status IN ('unfinished', 'finished', 'failed', 'paused',
                                              'cancelled')),
        created_at          REAL    NOT NULL,
        updated_at          REAL    NOT NULL,
        finished_at         REAL,
        lease_owner         TEXT,
        lease_expires_at    REAL,
        fencing_token       INTEGER NOT NULL DEFAULT 0,
        metadata            TEXT    NOT NULL DEFAULT '{}',
        latest_step         INTEGER,
        latest_agent_id     TEXT,
        latest_agent_status TEXT,
        attempts            INTEGER NOT NULL DEFAULT 0,
        last_error          TEXT,
        retry_at            REAL,
        resume_input        TEXT,
        kind                TEXT    NOT NULL DEFAULT 'workflow'
                            CHECK (typeof(kind) = 'text' AND length(kind) BETWEEN 1 AND 32),
        CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
    )
    """,
    "INSERT INTO workflows_v7 SELECT workflow_id, status, created_at, updated_at, finished_at, "
    "lease_owner, lease_expires_at, fencing_token, metadata, latest_step, latest_agent_id, "
    "latest_agent_status, attempts, last_error, retry_at, resume_input, kind FROM workflows",
    # Dropping the table drops its trigger too; the metadata rows stay (same ids).
    "DROP TABLE workflows",
    "ALTER TABLE workflows_v7 RENAME TO workflows",
    "CREATE INDEX workflows_claimable ON workflows (created_at, workflow_id) "
    "WHERE status = 'unfinished' AND kind = 'workflow'",
    "CREATE INDEX workflows_status ON workflows (status, workflow_id)",
    "CREATE INDEX workflows_agent_status ON workflows (latest_agent_status, workflow_id)",
    "CREATE INDEX workflows_kind ON workflows (kind, status, workflow_id)",
    """
    CREATE TRIGGER workflows_metadata_on_delete AFTER DELETE ON workflows
    BEGIN DELETE FROM workflow_metadata WHERE workflow_id = old.workflow_id; END
    """,
)

# The token comes from the store-wide counter, so it is newer than any lease ever granted.
_CANCEL: Final = (
    "UPDATE workflows SET status = 'cancelled', last_error = ?, finished_at = ?, "
    "retry_at = NULL, lease_owner = NULL, lease_expires_at = NULL, fencing_token = ?, "
    "updated_at = ? WHERE workflow_id = ?"
)
_RETRY: Final = (
    "UPDATE workflows SET status = 'unfinished', attempts = 0, retry_at = NULL, "
    "finished_at = NULL, updated_at = ? WHERE workflow_id = ?"
)
_NEXT_TOKEN: Final = (
    "UPDATE fencing SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token"
)


def cancel(
    conn: sqlite3.Connection, now: float, workflow_id: str, reason: str | None
) -> WorkflowRecord:
    """Cancel an UNFINISHED or PAUSED workflow and revoke its lease; else refuse."""
    check_cancel(records.read_record(conn, workflow_id), workflow_id)
    token = int(conn.execute(_NEXT_TOKEN).fetchall()[0][0])
    conn.execute(_CANCEL, (cancel_error(reason), now, token, now, workflow_id))
    events.append(conn, now, workflow_id, EventKind.CANCELLED, json.dumps({"reason": reason}))
    return _read(conn, workflow_id)


def retry(conn: sqlite3.Connection, now: float, workflow_id: str) -> WorkflowRecord:
    """Make a FAILED or CANCELLED workflow UNFINISHED with attempts back to 0; else refuse."""
    record = records.read_record(conn, workflow_id)
    check_retry(record, workflow_id)
    assert record is not None
    conn.execute(_RETRY, (now, workflow_id))
    previous = json.dumps({"previous": record.status.value})
    events.append(conn, now, workflow_id, EventKind.RETRIED, previous)
    return _read(conn, workflow_id)


def _read(conn: sqlite3.Connection, workflow_id: str) -> WorkflowRecord:
    record = records.read_record(conn, workflow_id)
    assert record is not None  # written in this transaction
    return record
