"""A store written before the ``cancelled`` status opens, keeps every record, and cancels.

SQLite rebuilds ``workflows`` (its CHECK cannot be altered): the rows, the metadata index
rows, the indexes and the delete trigger must all come through. PostgreSQL swaps the
constraint.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import asyncpg

from aiocheckpoint import CheckpointManager, WorkflowStatus
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres import schema as pg_schema_module
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

_ROWS = [
    ("job", "failed", "workflow"),
    ("lg:t:", "unfinished", "langgraph"),
    ("run", "paused", "workflow"),
]


async def _check(manager: CheckpointManager) -> None:
    records = {r.workflow_id: r for r in await manager.list_workflow_records(kind=None)}
    assert {wf: (r.status.value, r.kind) for wf, r in records.items()} == {
        wf: (status, kind) for wf, status, kind in _ROWS
    }
    assert records["job"].metadata == {"tenant": "acme"}
    assert records["job"].attempts == 2
    assert [
        r.workflow_id for r in await manager.list_workflow_records(metadata={"tenant": "acme"})
    ] == ["job"]
    cancelled = await manager.cancel_workflow("run", reason="old store")
    assert cancelled.status is WorkflowStatus.CANCELLED
    assert (await manager.retry_workflow("job")).status is WorkflowStatus.UNFINISHED
    lease = await manager.claim_workflow("runner")
    assert lease is not None and lease.workflow_id == "job"  # never the thread, nor "run"
    await manager.release_lease(lease)
    assert await manager.delete_checkpoints("job")


async def test_sqlite_store_of_schema_6_gets_the_cancelled_status(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:6]) == 6
    now = time.time()
    for wf, status, kind in _ROWS:
        conn.execute(
            "INSERT INTO workflows (workflow_id, status, created_at, updated_at, kind, attempts) "
            "VALUES (?, ?, ?, ?, ?, 2)",
            (wf, status, now, now, kind),
        )
    conn.execute(
        "UPDATE workflows SET metadata = '{\"tenant\": \"acme\"}' WHERE workflow_id = 'job'"
    )
    conn.execute("INSERT INTO workflow_metadata VALUES ('job', 'tenant', '\"acme\"')")
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
        await _check(manager)
    assert conn.execute("PRAGMA user_version").fetchall() == [(SCHEMA_VERSION,)]
    # The delete trigger came through the rebuild: the metadata rows went with the record.
    assert conn.execute("SELECT count(*) FROM workflow_metadata").fetchall() == [(0,)]
    indexes = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
    }
    assert {
        "workflows_claimable",
        "workflows_status",
        "workflows_agent_status",
        "workflows_kind",
    } <= indexes
    conn.close()


async def test_postgres_store_of_schema_7_gets_the_cancelled_status(pg_schema: str) -> None:
    quoted = f'"{pg_schema}"'
    admin = await asyncpg.connect(DSN)
    try:
        await admin.execute(f"CREATE SCHEMA {quoted}")
        await admin.execute(
            f"CREATE TABLE {quoted}.meta (key text PRIMARY KEY, value text NOT NULL)"
        )
        for migration in pg_schema_module.MIGRATIONS[:7]:
            for statement in migration:
                await admin.execute(statement.format(s=quoted))
        await admin.execute(f"INSERT INTO {quoted}.meta VALUES ('schema_version', '7')")
        for wf, status, kind in _ROWS:
            await admin.execute(
                f"INSERT INTO {quoted}.workflows (workflow_id, status, kind, attempts) "
                "VALUES ($1, $2, $3, 2)",
                wf,
                status,
                kind,
            )
        await admin.execute(
            f'UPDATE {quoted}.workflows SET metadata = \'{{"tenant": "acme"}}\' '
            "WHERE workflow_id = 'job'"
        )
        await admin.execute(
            f"INSERT INTO {quoted}.workflow_metadata VALUES ('job', 'tenant', '\"acme\"')"
        )
        storage = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2)
        async with CheckpointManager(storage) as manager:
            await _check(manager)
        version = await admin.fetchval(f"SELECT value FROM {quoted}.meta")
        assert version == str(pg_schema_module.SCHEMA_VERSION)
    finally:
        await admin.close()
