"""The SQLite schema, its version, and the migrations that bring an older database up to date.

The database records its schema version in ``PRAGMA user_version`` and marks itself as an
aiocheckpoint database with ``PRAGMA application_id``. Opening runs every migration newer than
the recorded version, in order, inside one ``BEGIN IMMEDIATE`` transaction (SQLite DDL is
transactional), so a crash or a concurrent opener never sees a half-migrated schema. Version 2
adds workflow records and leases; version 3 adds content-addressed blobs with reference
counts (``docs/sqlite-storage.md``); version 4 the ``paused`` status, retries, metadata and
the latest step on workflow records, with the indexes their queries walk; version 5 the effect
journal (``docs/effects.md``); version 6 the kind of a workflow record, so that runners claim
only workflows and never a LangGraph thread (``docs/leases.md``); version 7 the ``cancelled``
status (``docs/resuming.md``); version 8 each workflow's event history
(``docs/operating.md``); version 9 the indexes that keep a listing's page and the inspector's
time ranges flat at a million workflows (``docs/performance.md``); version 10 moves the
time ranges to an index of the minute of ``updated_at``, which a save changes once a minute
at most (``docs/sqlite-storage.md``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ...errors import StorageSchemaError
from .control import MIGRATION_STATEMENTS as CANCELLED_MIGRATION
from .effects import MIGRATION_STATEMENTS as EFFECTS_MIGRATION
from .events import MIGRATION_STATEMENTS as EVENTS_MIGRATION
from .minute import MIGRATION_STATEMENTS as MINUTE_MIGRATION

__all__ = ["APPLICATION_ID", "MIGRATIONS", "SCHEMA_VERSION", "Migration", "migrate"]

#: ``PRAGMA application_id`` of an aiocheckpoint database: the bytes "ACKP".
APPLICATION_ID: Final = 0x41434B50


@dataclass(frozen=True)
class Migration:
    """One schema step: the version it produces and the statements (or function) that do it."""

    version: int
    description: str
    apply: Sequence[str] | Callable[[sqlite3.Connection], None]

    def run(self, conn: sqlite3.Connection) -> None:
        """Apply this migration inside the caller's open transaction."""
        if callable(self.apply):
            self.apply(conn)
            return
        # One execute() per statement: executescript() would COMMIT the open transaction.
        for statement in self.apply:
            conn.execute(statement)


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "checkpoints: one row per (workflow_id, step)",
        (
            # A rowid table: large blobs belong in rowid tables, not WITHOUT ROWID ones.
            """
            CREATE TABLE checkpoints (
                id          INTEGER PRIMARY KEY,
                workflow_id TEXT    NOT NULL CHECK (typeof(workflow_id) = 'text'),
                step        INTEGER NOT NULL CHECK (typeof(step) = 'integer' AND step >= 0),
                data        BLOB    NOT NULL CHECK (typeof(data) = 'blob')
            )
            """,
            # Serves latest / one step / exists / pages / retention / list_workflows.
            "CREATE UNIQUE INDEX checkpoints_workflow_step ON checkpoints (workflow_id, step)",
        ),
    ),
    Migration(
        2,
        "workflows: one record per workflow (status, timestamps, lease); fencing counter",
        (
            # Times are seconds since the epoch by this host's clock (time.time()).
            """
            CREATE TABLE workflows (
                workflow_id      TEXT    PRIMARY KEY NOT NULL
                                 CHECK (typeof(workflow_id) = 'text'),
                status           TEXT    NOT NULL DEFAULT 'unfinished'
                                 CHECK (status IN ('unfinished', 'finished', 'failed')),
                created_at       REAL    NOT NULL,
                updated_at       REAL    NOT NULL,
                finished_at      REAL,
                lease_owner      TEXT,
                lease_expires_at REAL,
                fencing_token    INTEGER NOT NULL DEFAULT 0,
                CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
            )
            """,
            # What claim_next_workflow walks: unfinished workflows, oldest first.
            "CREATE INDEX workflows_claimable ON workflows (created_at, workflow_id) "
            "WHERE status = 'unfinished'",
            # One counter for every grant: a workflow deleted and created again never gets
            # a token it had before.
            """
            CREATE TABLE fencing (
                id         INTEGER PRIMARY KEY CHECK (id = 1),
                last_token INTEGER NOT NULL
            )
            """,
            "INSERT INTO fencing (id, last_token) VALUES (1, 0)",
            # Workflows stored before this migration get an UNFINISHED record now, so that
            # every workflow with a checkpoint has a record (and runners can resume them).
            "INSERT INTO workflows (workflow_id, created_at, updated_at) "
            "SELECT DISTINCT workflow_id, (julianday('now') - 2440587.5) * 86400.0, "
            "(julianday('now') - 2440587.5) * 86400.0 FROM checkpoints",
        ),
    ),
    Migration(
        3,
        "blobs: content-addressed blobs with reference counts; the references each record holds",
        (
            # A rowid table (hash has its own index): blobs up to chunk_max bytes and more.
            """
            CREATE TABLE blobs (
                hash BLOB    PRIMARY KEY NOT NULL,
                refs INTEGER NOT NULL,
                data BLOB    NOT NULL
            )
            """,
            # The blob hashes a record's root references and holds a count on (one digest-size
            # byte, then the hashes); NULL for records that hold none. Releasing reads this,
            # not the record, so even a damaged record can be deleted.
            "ALTER TABLE checkpoints ADD COLUMN refs BLOB",
            # Every way a record goes (delete, keep_last, replacement, or a statement typed
            # into the sqlite3 shell) queues its references here, in the same transaction;
            # the writer releases them before it commits.
            "CREATE TABLE blob_releases (refs BLOB NOT NULL)",
            """
            CREATE TRIGGER checkpoints_release_on_delete AFTER DELETE ON checkpoints
            WHEN old.refs IS NOT NULL
            BEGIN INSERT INTO blob_releases (refs) VALUES (old.refs); END
            """,
            """
            CREATE TRIGGER checkpoints_release_on_update AFTER UPDATE ON checkpoints
            WHEN old.refs IS NOT NULL
            BEGIN INSERT INTO blob_releases (refs) VALUES (old.refs); END
            """,
        ),
    ),
    Migration(
        4,
        "workflows: paused status, attempts and retry time, metadata, latest step; indexes",
        (
            # A CHECK constraint cannot be altered: the table is rebuilt with the new status.
            """
            CREATE TABLE workflows_v4 (
                workflow_id         TEXT    PRIMARY KEY NOT NULL
                                    CHECK (typeof(workflow_id) = 'text'),
                status              TEXT    NOT NULL DEFAULT 'unfinished'
                                    CHECK (status IN ('unfinished', 'finished', 'failed',
                                                      'paused')),
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
                CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
            )
            """,
            "INSERT INTO workflows_v4 (workflow_id, status, created_at, updated_at, finished_at, "
            "lease_owner, lease_expires_at, fencing_token) SELECT workflow_id, status, "
            "created_at, updated_at, finished_at, lease_owner, lease_expires_at, fencing_token "
            "FROM workflows",
            "DROP TABLE workflows",
            "ALTER TABLE workflows_v4 RENAME TO workflows",
            "CREATE INDEX workflows_claimable ON workflows (created_at, workflow_id) "
            "WHERE status = 'unfinished'",
            # Pages of a listing filtered by status or by the latest step's agent status.
            "CREATE INDEX workflows_status ON workflows (status, workflow_id)",
            "CREATE INDEX workflows_agent_status ON workflows (latest_agent_status, workflow_id)",
            # One row per top-level metadata key (value: canonical JSON text), so that a
            # filter on a key walks an index in workflow id order.
            """
            CREATE TABLE workflow_metadata (
                workflow_id TEXT NOT NULL,
                key         TEXT NOT NULL,
                value       TEXT NOT NULL,
                PRIMARY KEY (workflow_id, key)
            ) WITHOUT ROWID
            """,
            "CREATE INDEX workflow_metadata_value ON workflow_metadata (key, value, workflow_id)",
            """
            CREATE TRIGGER workflows_metadata_on_delete AFTER DELETE ON workflows
            BEGIN DELETE FROM workflow_metadata WHERE workflow_id = old.workflow_id; END
            """,
        ),
    ),
    # Version 4 is the workflow life cycle's; this one depends on no other new one.
    Migration(
        5,
        "effects: the effect journal of durable effects (docs/effects.md)",
        EFFECTS_MIGRATION,
    ),
    Migration(
        6,
        "workflows: the kind of a record (runners claim only the 'workflow' kind)",
        (
            "ALTER TABLE workflows ADD COLUMN kind TEXT NOT NULL DEFAULT 'workflow' "
            "CHECK (typeof(kind) = 'text' AND length(kind) BETWEEN 1 AND 32)",
            # The records the LangGraph saver wrote before records had a kind: its thread
            # and page workflows (``lg:`` and ``lgp:`` ids), whose latest step it wrote.
            "UPDATE workflows SET kind = 'langgraph' WHERE latest_agent_id = 'langgraph' "
            "AND (substr(workflow_id, 1, 3) = 'lg:' OR substr(workflow_id, 1, 4) = 'lgp:')",
            "DROP INDEX workflows_claimable",
            "CREATE INDEX workflows_claimable ON workflows (created_at, workflow_id) "
            "WHERE status = 'unfinished' AND kind = 'workflow'",
            # Pages of a listing filtered by kind (and status): the default listing's.
            "CREATE INDEX workflows_kind ON workflows (kind, status, workflow_id)",
        ),
    ),
    # Depends on no other new migration: it rebuilds the table with its columns as of 6.
    Migration(7, "workflows: the cancelled status", CANCELLED_MIGRATION),
    # Depends on no other new migration: a table of its own and a trigger on workflows.
    Migration(8, "workflow_events: each workflow's event history", EVENTS_MIGRATION),
    # Depends on no other new migration: two indexes on workflows.
    Migration(
        9,
        "workflows: indexes for the default listing and for time ranges",
        (
            # The default listing (kind 'workflow', any status) in workflow id order: without
            # it a page sorted every workflow of the kind.
            "CREATE INDEX workflows_kind_id ON workflows (kind, workflow_id)",
            # Records updated in a time range (the inspector's throughput, updated_after /
            # updated_before): a range of this index, not a scan of every record.
            "CREATE INDEX workflows_updated ON workflows (updated_at)",
        ),
    ),
    # Depends on migration 9 (the index it replaces).
    Migration(10, "workflows: the minute of updated_at, indexed in its place", MINUTE_MIGRATION),
)

#: The schema version this code writes.
SCHEMA_VERSION: Final = MIGRATIONS[-1].version


def _pragma_int(conn: sqlite3.Connection, name: str) -> int:
    value = conn.execute(f"PRAGMA {name}").fetchall()[0][0]
    return int(value)


def _check(conn: sqlite3.Connection, latest: int) -> int:
    app_id = _pragma_int(conn, "application_id")
    version = _pragma_int(conn, "user_version")
    if app_id not in (0, APPLICATION_ID):
        raise StorageSchemaError(
            f"not an aiocheckpoint database (application_id {app_id:#x}, expected "
            f"{APPLICATION_ID:#x})"
        )
    if version > latest:
        raise StorageSchemaError(
            f"database schema version {version} is newer than this aiocheckpoint "
            f"understands ({latest}); upgrade aiocheckpoint to open it"
        )
    if version == 0:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchall()[
            0
        ][0]
        if tables:
            raise StorageSchemaError(
                "not an aiocheckpoint database: it has tables but no schema version"
            )
    return version


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the database up to the newest version in ``migrations``; return that version.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Raises
    :class:`~aiocheckpoint.StorageSchemaError` for a newer or a foreign database, leaving it
    unchanged.
    """
    latest = migrations[-1].version
    if _check(conn, latest) == latest:
        return latest
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _check(conn, latest)  # another process may have migrated meanwhile
        for migration in migrations:
            if migration.version > version:
                migration.run(conn)
        conn.execute(f"PRAGMA user_version = {int(latest)}")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return latest
