"""Stores made before records had a kind: the migration gives the LangGraph saver's records
theirs, and runners then claim only workflows.

The old store is built with the migrations of that schema (SQLite 1-5, PostgreSQL 1-6:
released migrations never change), holding the rows the saver and a runner wrote then.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import asyncpg

from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres import schema as pg_schema_module
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

#: (workflow id, latest agent): what the old code wrote; the saver's agent is "langgraph".
OLD_ROWS = [
    ("lg:6:thread:", "langgraph"),  # a thread's root namespace
    ("lg:6:thread:inner", "langgraph"),  # a subgraph's namespace
    ("lgp:6:thread", "langgraph"),  # the thread's pages
    ("lg:mine", "me"),  # a workflow of the user's that happens to start with lg:
    ("LG:upper", "langgraph"),  # not the saver's prefix
    ("job", "agent"),
]
SAVER_IDS = {"lg:6:thread:", "lg:6:thread:inner", "lgp:6:thread"}
WORKFLOW_IDS = {"lg:mine", "LG:upper", "job"}


async def check_migrated(manager: CheckpointManager) -> None:
    records = await manager.list_workflow_records(kind=None)
    kinds = {r.workflow_id: r.kind for r in records}
    assert kinds == {wf: "langgraph" if wf in SAVER_IDS else "workflow" for wf, _ in OLD_ROWS}
    assert {r.workflow_id for r in await manager.list_workflow_records()} == WORKFLOW_IDS
    claimed = set()
    while (lease := await manager.claim_workflow("runner")) is not None:
        claimed.add(lease.workflow_id)
    assert claimed == WORKFLOW_IDS
    data = await manager.get_checkpoint("job", 0)  # the old records read as before
    assert data.state_snapshot.data == {"n": 0}


async def record_bytes() -> bytes:
    """A checkpoint record as every version writes it (version 1)."""
    async with CheckpointManager() as manager:
        await manager.create_checkpoint("job", 0, "agent", "completed", {"n": 0})
        stored = await manager.storage.load("job", 0)
    assert stored is not None
    return stored.data


async def test_sqlite_store_of_schema_5_gets_kinds(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:5]) == 5
    now = time.time()
    data = await record_bytes()
    for wf, agent in OLD_ROWS:
        conn.execute(
            "INSERT INTO checkpoints (workflow_id, step, data) VALUES (?, 0, ?)", (wf, data)
        )
        conn.execute(
            "INSERT INTO workflows (workflow_id, created_at, updated_at, latest_step, "
            "latest_agent_id, latest_agent_status) VALUES (?, ?, ?, 0, ?, 'completed')",
            (wf, now, now, agent),
        )
    conn.close()
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
        await check_migrated(manager)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchall() == [(SCHEMA_VERSION,)]
    [(claimable,)] = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'workflows_claimable'"
    ).fetchall()
    assert "kind = 'workflow'" in claimable
    conn.close()
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as again:  # opens as it is
        assert len(await again.list_workflow_records(kind=None)) == len(OLD_ROWS)


async def test_postgres_store_of_schema_6_gets_kinds(pg_schema: str) -> None:
    quoted = f'"{pg_schema}"'
    admin = await asyncpg.connect(DSN)
    data = await record_bytes()
    try:
        await admin.execute(f"CREATE SCHEMA {quoted}")
        await admin.execute(
            f"CREATE TABLE {quoted}.meta (key text PRIMARY KEY, value text NOT NULL)"
        )
        for migration in pg_schema_module.MIGRATIONS[:6]:
            for statement in migration:
                await admin.execute(statement.format(s=quoted))
        await admin.execute(f"INSERT INTO {quoted}.meta VALUES ('schema_version', '6')")
        for wf, agent in OLD_ROWS:
            await admin.execute(
                f"INSERT INTO {quoted}.checkpoints (workflow_id, step, data) VALUES ($1, 0, $2)",
                wf,
                data,
            )
            await admin.execute(
                f"INSERT INTO {quoted}.workflows (workflow_id, latest_step, latest_agent_id, "
                "latest_agent_status) VALUES ($1, 0, $2, 'completed')",
                wf,
                agent,
            )
        storage = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2)
        async with CheckpointManager(storage) as manager:
            await check_migrated(manager)
        assert await admin.fetchval(f"SELECT value FROM {quoted}.meta") == str(
            pg_schema_module.SCHEMA_VERSION
        )
        claimable = await admin.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 "
            "AND indexname = 'workflows_claimable'",
            pg_schema,
        )
        assert "kind = 'workflow'" in claimable
    finally:
        await admin.close()
