"""The throughput page's query is a bounded range scan of the index of the records'
``updated_at`` minute (``EXPLAIN``, never timings): the latest updates of the window, newest
first, ``LIMIT`` the sample, with no scan and no sort of every workflow, on SQLite and
PostgreSQL."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest

from aiocheckpoint.storage.postgres.leases import query_statement
from aiocheckpoint.storage.postgres.sql import Sql
from aiocheckpoint.storage.queries import WorkflowQuery, query_sql
from aiocheckpoint.storage.sqlite import records as sqlite_records
from aiocheckpoint.storage.sqlite.schema import migrate
from aiocheckpoint.web import timeline
from tests.test_scale_plans import _Fill, _filled, _plan, fill

__all__ = ["fill"]  # the fixture

_QUERY = WorkflowQuery(
    updated_after=datetime(2026, 1, 1, tzinfo=timezone.utc),
    limit=timeline.SAMPLE,
    newest_first=True,
)


def test_sqlite_throughput_reads_a_range_of_the_updated_minute_index(tmp_path: Path) -> None:
    """SEARCH on the minute index from the window's bound, newest minute first, each minute's
    rows sorted by ``updated_at`` (a sort of the right part of the order, stopped by the
    LIMIT): no scan, no sort of the whole range."""
    conn = sqlite3.connect(tmp_path / "plan.db", isolation_level=None)
    migrate(conn)
    sql, args = sqlite_records.query_statement(_QUERY, ["workflow_id", "updated_at"])
    plan = " | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
    conn.close()
    assert "SEARCH w USING INDEX workflows_updated_minute (updated_minute>?)" in plan, plan
    assert "SCAN w" not in plan, plan
    assert "TEMP B-TREE FOR ORDER BY" not in plan, plan  # only FOR RIGHT PART OF ORDER BY
    assert sql.rstrip().endswith("LIMIT ?") and args[-1] == timeline.SAMPLE


async def test_postgres_throughput_reads_a_range_of_the_updated_minute_index(
    fill: _Fill,
) -> None:
    """An index scan backward of the minute index bounded by the window, each minute's rows
    sorted by ``updated_at`` (an incremental sort) under the LIMIT: no Seq Scan, no sort
    of the whole range (20,000 workflows updated over 5.5 hours, with statistics)."""
    async with _filled(fill, "analyzed") as (con, s):
        page, args = query_statement(Sql.for_schema(s), _QUERY, ["workflow_id"])
        plan = await _plan(con, page, *args)
    assert "Index Scan Backward using workflows_updated_minute" in plan, plan
    assert "Index Cond: (updated_minute >=" in plan, plan
    assert "Incremental Sort" in plan and "Presorted Key: updated_minute" in plan, plan
    # Every sort an incremental one (a minute's rows at a time), none of the whole range.
    assert plan.count("Sort  (") == plan.count("Incremental Sort  ("), plan
    assert "Seq Scan" not in plan, plan
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
