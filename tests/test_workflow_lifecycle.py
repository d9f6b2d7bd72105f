"""Workflow lifecycle and queries (issue 15): migrations, query plans, policies.

The behaviour itself is in the conformance suite (``WorkflowLifecycleConformance``, run by
every backend with workflow records); this module checks what is backend-specific: that
stores of the previous schema upgrade in place, and that a filtered page is an index walk.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from aiocheckpoint import (
    CheckpointManager,
    InvalidArgumentError,
    PostgresCheckpointStorage,
    RetryPolicy,
    SQLiteCheckpointStorage,
    WorkflowStatus,
)
from aiocheckpoint.cli.store import open_store
from aiocheckpoint.storage.postgres import schema as _pg_schema
from aiocheckpoint.storage.queries import WorkflowQuery, metadata_pairs, query_sql
from aiocheckpoint.storage.sqlite.schema import MIGRATIONS, migrate
from tests.pg_support import DSN, pg_schema
from tests.test_cli import NewStore, cli, new_store

__all__ = ["new_store", "pg_schema"]


@pytest.fixture
async def admin() -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection for building an old store."""
    con = await asyncpg.connect(DSN)
    yield con
    await con.close()


async def _check_upgraded(manager: CheckpointManager) -> None:
    record = await manager.get_workflow("old")
    assert record is not None
    assert (record.status, record.attempts, record.metadata) == (WorkflowStatus.FAILED, 0, {})
    await manager.create_checkpoint("old", 1, "agent", "blocked", {"n": 1})
    await manager.mark_workflow("old", "paused")
    await manager.register_workflow("old", metadata={"tenant": "t"})
    assert await manager.list_workflows("paused", metadata={"tenant": "t"}) == ["old"]
    resumed = await manager.resume_workflow("old", input="go")
    assert (resumed.status, resumed.resume_input, resumed.latest_step) == (
        WorkflowStatus.UNFINISHED,
        "go",
        1,
    )


async def test_sqlite_version_3_store_upgrades_in_place(tmp_path: Path) -> None:
    """A version-3 database (no paused status, no metadata) opens and takes the new fields."""
    path = tmp_path / "v3.db"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:3]) == 3
    conn.execute(
        "INSERT INTO workflows (workflow_id, status, created_at, updated_at, finished_at) "
        "VALUES ('old', 'failed', 1, 2, 2)"
    )
    conn.close()
    async with CheckpointManager(SQLiteCheckpointStorage(path)) as manager:
        await _check_upgraded(manager)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchall() == [(MIGRATIONS[-1].version,)]
    conn.close()


async def test_postgres_version_4_store_upgrades_in_place(
    pg_schema: str, admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version-4 store opens, migrates to version 5 and takes the new fields."""
    monkeypatch.setattr(_pg_schema, "MIGRATIONS", _pg_schema.MIGRATIONS[:4])
    monkeypatch.setattr(_pg_schema, "SCHEMA_VERSION", 4)
    async with PostgresCheckpointStorage(DSN, schema=pg_schema) as old:
        await old.list_workflows()  # creates the version-4 schema
    await admin.execute(
        f'INSERT INTO "{pg_schema}".workflows (workflow_id, status, finished_at) '
        "VALUES ('old', 'failed', now())"
    )
    monkeypatch.undo()
    storage = PostgresCheckpointStorage(DSN, schema=pg_schema)
    async with CheckpointManager(storage) as manager:
        await _check_upgraded(manager)
    version = await admin.fetchval(f'SELECT value FROM "{pg_schema}".meta')
    assert version == str(_pg_schema.SCHEMA_VERSION)


def _sqlite_plan(tmp_path: Path, query: WorkflowQuery) -> str:
    conn = sqlite3.connect(tmp_path / "plan.db", isolation_level=None)
    migrate(conn)
    columns = ["workflow_id", "status"]
    sql, args = query_sql(query, columns, "workflows", "workflow_metadata", lambda _: "?", float)
    rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}", args).fetchall()
    conn.close()
    return " | ".join(str(row[-1]) for row in rows)


@pytest.mark.parametrize(
    "query",
    [
        WorkflowQuery(status=WorkflowStatus.UNFINISHED, limit=50),
        WorkflowQuery(agent_status="blocked", limit=50),
        WorkflowQuery(
            status=WorkflowStatus.PAUSED, metadata=metadata_pairs({"tenant": "t"}), limit=50
        ),
    ],
)
def test_sqlite_filtered_page_walks_an_index_in_order(tmp_path: Path, query: WorkflowQuery) -> None:
    """No full scan and no sort: the page is read from an index in workflow id order."""
    plan = _sqlite_plan(tmp_path, query)
    assert "USE TEMP B-TREE" not in plan, plan
    assert "USING" in plan and "INDEX" in plan, plan
    assert "SCAN w " not in plan + " ", plan


def test_retry_policy_validates_and_schedules() -> None:
    """Delays grow by the factor up to the cap; names or types choose retryable errors."""
    policy = RetryPolicy(max_attempts=4, backoff=1, backoff_factor=3, max_backoff=5)
    assert policy.delays() == [1, 3, 5]
    assert RetryPolicy(retry_on=[TimeoutError]).retry_on == ("TimeoutError",)
    assert RetryPolicy(retry_on=("OSError",)).retryable(TimeoutError())
    assert not RetryPolicy(retry_on=("OSError",)).retryable(ValueError())
    assert not RetryPolicy().retryable(KeyboardInterrupt())
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


async def test_bad_listing_arguments_are_typed_errors() -> None:
    """limit, times and metadata filters are checked before the store is asked."""
    async with CheckpointManager() as manager:
        for kwargs in (
            {"limit": 0},
            {"limit": 10_001},
            {"updated_after": "yesterday"},
            {"metadata": {"k": float("inf")}},
            {"metadata": {f"k{n}": n for n in range(9)}},
            {"agent_status": "sleeping"},
        ):
            with pytest.raises(InvalidArgumentError):
                await manager.list_workflow_records(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_cli_workflows_filters_and_pages(new_store: NewStore, kind: str) -> None:
    """``workflows --status --meta --limit`` pages through the records with a cursor."""
    url = new_store(kind)
    async with open_store(url, must_exist=False) as manager:
        for n in range(5):
            tenant = "a" if n != 2 else "b"
            await manager.register_workflow(f"wf-{n}", metadata={"tenant": tenant, "n": n})
        await manager.mark_workflow("wf-4", "finished")
    first = cli("workflows", url, "--status", "unfinished", "--meta", "tenant=a", "--limit", "2")
    assert first.code == 0, first.err
    assert "wf-0" in first.out and "wf-1" in first.out and "wf-3" not in first.out
    assert "more: aiocheckpoint workflows" in first.err and "--cursor" in first.err
    page = cli("workflows", url, "--status", "unfinished", "--meta", "tenant=a", "--json")
    got = page.json()
    assert isinstance(got, dict)
    assert [w["workflow_id"] for w in got["workflows"]] == ["wf-0", "wf-1", "wf-3"]
    assert got["next_cursor"] is None
    args = ["workflows", url, "--meta", "n=1", "--limit", "1", "--json"]
    one = cli(*args).json()
    assert isinstance(one, dict) and [w["workflow_id"] for w in one["workflows"]] == ["wf-1"]
    rest = cli(*args, "--cursor", one["next_cursor"]).json()
    assert isinstance(rest, dict) and rest["workflows"] == [] and rest["next_cursor"] is None
    assert "cursor" in cli("workflows", url, "--cursor", "junk").error_line()


def test_cli_filters_need_workflow_records(new_store: NewStore) -> None:
    """The file store keeps no workflow records: a filter is a clear error."""
    url = new_store("file")
    Path(url.removeprefix("file:")).mkdir()
    assert "workflow records" in cli("workflows", url, "--status", "paused").error_line()
