"""The throughput page's query is a bounded range scan of the records' ``updated_at`` index
(``EXPLAIN``, never timings): the latest updates of the window, newest first, ``LIMIT`` the
sample, with no scan and no sort of every workflow, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import asyncpg
import pytest

from aiocheckpoint.storage.postgres.sql import Sql
from aiocheckpoint.storage.queries import WorkflowQuery, query_sql
from aiocheckpoint.storage.sqlite import records as sqlite_records
from aiocheckpoint.storage.sqlite.schema import migrate
from aiocheckpoint.web import timeline
from tests.test_scale_plans import _plan, filled, pg_schema

__all__ = ["filled", "pg_schema"]  # the fixtures

_QUERY = WorkflowQuery(
    updated_after=datetime(2026, 1, 1, tzinfo=timezone.utc),
    limit=timeline.SAMPLE,
    newest_first=True,
)
#: The index on the records' update time (the scale work adds it to the schema; created
#: here when the schema lacks one, so the plan is checked either way).
_INDEX = "CREATE INDEX IF NOT EXISTS {}workflows_updated ON {}workflows (updated_at)"


def test_sqlite_throughput_reads_a_range_of_the_updated_at_index(tmp_path: Path) -> None:
    """SEARCH on the index with the window's bound, newest first: no scan, no temp sort."""
    conn = sqlite3.connect(tmp_path / "plan.db", isolation_level=None)
    migrate(conn)
    conn.execute(_INDEX.format("", ""))
    sql, args = query_sql(
        _QUERY,
        ["workflow_id", "updated_at"],
        "workflows",
        "workflow_metadata",
        sqlite_records._placeholder,
        sqlite_records._seconds,
    )
    plan = " | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
    conn.close()
    assert "SEARCH w USING INDEX" in plan and "(updated_at>?)" in plan, plan
    assert "TEMP B-TREE" not in plan and "SCAN w" not in plan, plan
    assert sql.rstrip().endswith("LIMIT ?") and args[-1] == timeline.SAMPLE


async def test_postgres_throughput_reads_a_range_of_the_updated_at_index(
    filled: tuple[asyncpg.Connection, str],
) -> None:
    """An index scan backward bounded by the window and the LIMIT: no Seq Scan, no Sort
    (20,000 workflows, with statistics)."""
    con, s = filled
    await con.execute(_INDEX.format("", f"{s}."))
    await con.execute(f"ANALYZE {s}.workflows")
    sql = Sql.for_schema(s)
    page, args = query_sql(
        _QUERY,
        ["workflow_id"],
        sql.workflows_table,
        sql.metadata_table,
        "${}".format,
        lambda moment: moment,
    )
    plan = await _plan(con, page, *args)
    assert "Index Scan Backward" in plan and "Index Cond: (updated_at >" in plan, plan
    assert "Seq Scan" not in plan and "Sort" not in plan, plan
    assert "Limit" in plan, plan


def test_newest_first_takes_no_cursor() -> None:
    """A newest-first page has no id cursor to continue from: refused, not misread."""
    with pytest.raises(Exception, match="newest_first"):
        query_sql(
            WorkflowQuery(newest_first=True, after="x"),
            ["workflow_id"],
            "workflows",
            "workflow_metadata",
            sqlite_records._placeholder,
            sqlite_records._seconds,
        )
