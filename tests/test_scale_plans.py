"""Query plans that stay flat with the number of workflows (``EXPLAIN``, never timings).

A claim, a filtered page and a sweep's statements walk an index on SQLite and PostgreSQL,
with and without the planner's statistics: a plan that scans or sorts every workflow costs
nothing on a small store and seconds at a million (``bench/scale.py --queries``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from aiocheckpoint import WorkflowStatus
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres.sql import Sql
from aiocheckpoint.storage.postgres.sweeps import PAGE_SETTINGS, PLANNER_SETTINGS, Sweeps
from aiocheckpoint.storage.queries import WorkflowQuery, metadata_pairs, query_sql
from aiocheckpoint.storage.sqlite import records as sqlite_records
from aiocheckpoint.storage.sqlite.schema import migrate
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]  # the fixture

_WORKFLOWS = 20_000
_PAGE = WorkflowQuery(
    status=WorkflowStatus.UNFINISHED, metadata=metadata_pairs({"tenant": "t1"}), limit=50
)


def test_sqlite_claim_walks_the_claimable_index(tmp_path: Path) -> None:
    """A claim reads the oldest claimable workflow off its partial index: no sort of every
    unfinished workflow (the planner, without statistics, took the (kind, status) index)."""
    conn = sqlite3.connect(tmp_path / "plan.db", isolation_level=None)
    migrate(conn)
    rows = conn.execute(f"EXPLAIN QUERY PLAN {sqlite_records._CLAIMABLE}", (0.0,)).fetchall()
    conn.close()
    plan = " | ".join(str(row[-1]) for row in rows)
    assert "USING INDEX workflows_claimable" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


@pytest.fixture
async def filled(pg_schema: str) -> AsyncIterator[tuple[asyncpg.Connection, str]]:
    """A PostgreSQL store of 20,000 workflows of 3 checkpoints each, never analyzed."""
    async with PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2) as storage:
        await storage.exists("warm-up")  # creates the schema
    con = await asyncpg.connect(DSN)
    s = f'"{pg_schema}"'
    series = f"FROM generate_series(0, {_WORKFLOWS - 1}) AS i"
    name = "'w' || lpad(i::text, 6, '0')"
    await con.execute(
        f"INSERT INTO {s}.workflows (workflow_id, status, metadata) SELECT {name}, "
        "CASE WHEN i % 5 = 0 THEN 'unfinished' ELSE 'finished' END, "
        "'{\"tenant\":\"t' || (i % 4) || '\"}' " + series
    )
    await con.execute(
        f"INSERT INTO {s}.workflow_metadata (workflow_id, key, value) "
        f"SELECT {name}, 'tenant', '\"t' || (i % 4) || '\"' " + series
    )
    await con.execute(
        f"INSERT INTO {s}.checkpoints (workflow_id, step, data) "
        f"SELECT {name}, j, '\\x00'::bytea {series}, generate_series(0, 2) AS j"
    )
    try:
        yield con, s
    finally:
        await con.close()


async def _plan(con: asyncpg.Connection, sql: str, *args: object, settings: str = "") -> str:
    async with con.transaction():
        if settings:  # as a sweep's transactions run
            await con.execute(settings)
        rows = await con.fetch(f"EXPLAIN {sql}", *args)
    return "\n".join(row[0] for row in rows)


async def test_postgres_sweep_statements_walk_the_primary_key_without_statistics(
    filled: tuple[asyncpg.Connection, str],
) -> None:
    """A sweep's read of a page, of its records and its thinning probe the primary key on a
    table never analyzed (the page was a sequential scan of every checkpoint there), with
    no parallel workers (starting them cost a page 50-150 ms on a loaded machine)."""
    con, s = filled
    sweeps = Sweeps(None, s, None, 1 << 20)  # type: ignore[arg-type]  # statements only
    ids = [f"w{n:06}" for n in range(500, 700)]
    plans = [
        await _plan(con, sweeps._page, "w000500", 200, settings=PAGE_SETTINGS),
        await _plan(con, sweeps._records_of, ids, 1 << 20, settings=PLANNER_SETTINGS),
        await _plan(
            con, sweeps._thin, ids, [0] * len(ids), ids, [1] * len(ids), settings=PLANNER_SETTINGS
        ),
    ]
    for plan in plans:
        assert "checkpoints_pkey" in plan, plan
        assert "Seq Scan on checkpoints" not in plan and "Gather" not in plan, plan
    assert "HashAggregate" not in plans[0] and "Sort" not in plans[0], plans[0]


async def test_postgres_claim_and_filtered_page_walk_indexes(
    filled: tuple[asyncpg.Connection, str],
) -> None:
    """With statistics, a claim reads the claimable index in age order and a page filtered
    by status and a metadata key walks the metadata index in id order: no scan, no sort."""
    con, s = filled
    await con.execute(f"ANALYZE {s}.workflows")
    await con.execute(f"ANALYZE {s}.workflow_metadata")
    sql = Sql.for_schema(s)
    claim = await _plan(con, sql.claim, "owner", 30.0)
    assert "workflows_claimable" in claim, claim
    page, args = query_sql(
        _PAGE, ["workflow_id"], sql.workflows_table, sql.metadata_table, "${}".format, str
    )
    listing = await _plan(con, page, *args)
    assert "workflow_metadata_value" in listing, listing
    for plan in (claim, listing):
        assert "Seq Scan" not in plan and "Sort" not in plan, plan
