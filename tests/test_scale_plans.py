"""Query plans that stay flat with the number of workflows (``EXPLAIN``, never timings).

A claim, a filtered page and a sweep's statements walk an index on SQLite and PostgreSQL,
with and without the planner's statistics: a plan that scans or sorts every workflow costs
nothing on a small store and seconds at a million (``bench/scale.py --queries``).

SQLite plans the same on an empty file as on a full one (it keeps no statistics unless
asked), so its plans are read off an empty store. PostgreSQL plans from statistics: its
pages are run with ``EXPLAIN ANALYZE`` on 20,000 analyzed workflows and the rows each plan
touched are counted, a measure that does not depend on the machine's load. A page anywhere
in the listing must touch a bounded number of rows: a plan whose work grows with the
cursor's position fails, whichever plan the statistics choose.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from aiocheckpoint import WorkflowStatus
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres.leases import query_statement
from aiocheckpoint.storage.postgres.sql import RECORD_COLUMNS, Sql
from aiocheckpoint.storage.postgres.sweeps import PAGE_SETTINGS, PLANNER_SETTINGS, Sweeps
from aiocheckpoint.storage.queries import WorkflowQuery, metadata_pairs, query_sql
from aiocheckpoint.storage.sqlite import records as sqlite_records
from aiocheckpoint.storage.sqlite.schema import migrate
from tests.pg_support import DSN, drop_schema, new_schema_name

# One worker builds the fill once for all the module's tests.
pytestmark = pytest.mark.xdist_group("scale-plans")

_WORKFLOWS = 20_000
_PAGE = WorkflowQuery(
    status=WorkflowStatus.UNFINISHED, metadata=metadata_pairs({"tenant": "t1"}), limit=50
)
_LATE = "w019000"  # a cursor near the end of the listing
#: The listing's pages the web inspector and the API ask for, each with a cursor; the kind
#: is the API's default ("workflow") unless None is named.
_PAGES: dict[str, WorkflowQuery] = {
    "status and a common metadata value": WorkflowQuery(
        status=WorkflowStatus.UNFINISHED, metadata=metadata_pairs({"tenant": "t1"})
    ),
    "status and a rare metadata value": WorkflowQuery(
        status=WorkflowStatus.UNFINISHED, metadata=metadata_pairs({"org": "o1"})
    ),
    "status": WorkflowQuery(status=WorkflowStatus.UNFINISHED),
    "the default listing": WorkflowQuery(),
    "a rare agent status": WorkflowQuery(agent_status="failed"),
    "in doubt": WorkflowQuery(in_doubt=True),
    "not in doubt": WorkflowQuery(in_doubt=False),
}


def _page(query: WorkflowQuery, after: str, kind: str | None = "workflow") -> WorkflowQuery:
    return dataclasses.replace(query, after=after, limit=50, kind=kind)


def _sqlite_plan(conn: sqlite3.Connection, query: WorkflowQuery) -> str:
    columns = [c.strip() for c in sqlite_records._COLUMNS.split(",")]
    sql, args = query_sql(
        query,
        columns,
        "workflows",
        "workflow_metadata",
        lambda _: "?",
        datetime.timestamp,
        sqlite_records._IN_DOUBT,
    )
    rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}", args).fetchall()
    return " | ".join(str(row[-1]) for row in rows)


@pytest.mark.parametrize("kind", ["workflow", None])
@pytest.mark.parametrize("name", list(_PAGES))
def test_sqlite_pages_walk_an_index_in_id_order(
    tmp_path: Path, name: str, kind: str | None
) -> None:
    """Each page of the listing walks an index from the cursor in workflow id order: no scan
    of the workflows, no sort (the default listing sorted every workflow of its kind, a page
    in doubt walked every workflow)."""
    conn = sqlite3.connect(tmp_path / "plan.db", isolation_level=None)
    migrate(conn)
    plan = _sqlite_plan(conn, _page(_PAGES[name], _LATE, kind))
    conn.close()
    assert "SCAN w" not in plan and "TEMP B-TREE" not in plan, plan
    if name == "a rare agent status":
        assert "workflows_agent_status" in plan, plan


def test_sqlite_updated_range_reads_the_updated_minute_index(tmp_path: Path) -> None:
    """The records updated since a time, newest first (the inspector's throughput), are a
    range of the ``updated_minute`` index, each minute's rows sorted apart: no scan, no
    sort of the range."""
    conn = sqlite3.connect(tmp_path / "plan.db", isolation_level=None)
    migrate(conn)
    query = WorkflowQuery(updated_after=datetime.now(timezone.utc), limit=50, newest_first=True)
    sql, args = sqlite_records.query_statement(query, ["workflow_id"])
    rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}", args).fetchall()
    conn.close()
    plan = " | ".join(str(row[-1]) for row in rows)
    assert "USING INDEX workflows_updated_minute (updated_minute>?)" in plan, plan
    assert "SCAN w" not in plan and "TEMP B-TREE FOR ORDER BY" not in plan, plan


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


class _Fill:
    """A PostgreSQL store of 20,000 workflows of 3 checkpoints each, built once for the module
    (the fill is most of these tests' time) and brought to the state each test asks for.

    A fifth unfinished, metadata ``tenant`` (a quarter each) and ``org`` (1 in 13 each: a page
    of the unfinished of one is full), the latest agent status ``failed`` for 1 in 100,
    updated a second apart (over 5.5 hours). Its states, in order: never analyzed,
    analyzed, vacuumed and analyzed; a test asking for an earlier state than the fill is in
    gets a new fill. Autovacuum is off on its tables: no statistics appear by themselves.
    """

    STATES = ("raw", "analyzed", "vacuumed")

    def __init__(self) -> None:
        self.schema: str | None = None
        self.state = "raw"

    async def at(self, state: str) -> str:
        """The fill's quoted schema, its tables brought to ``state`` (one of STATES)."""
        if self.schema is None or self.STATES.index(state) < self.STATES.index(self.state):
            await self.drop()
            self.schema = new_schema_name()
            await _fill(self.schema)
            self.state = "raw"
        s = f'"{self.schema}"'
        if state != self.state:
            con = await asyncpg.connect(DSN)
            try:
                for table in ("workflows", "workflow_metadata"):
                    command = "VACUUM ANALYZE" if state == "vacuumed" else "ANALYZE"
                    await con.execute(f"{command} {s}.{table}")
            finally:
                await con.close()
            self.state = state
        return s

    async def drop(self) -> None:
        if self.schema is not None:
            await drop_schema(self.schema)
            self.schema = None


async def _fill(schema: str) -> None:
    """Create the store's tables in ``schema`` and fill them (see :class:`_Fill`)."""
    async with PostgresCheckpointStorage(DSN, schema=schema, max_size=2) as storage:
        await storage.exists("warm-up")  # creates the schema
    con = await asyncpg.connect(DSN)
    s = f'"{schema}"'
    series = f"FROM generate_series(0, {_WORKFLOWS - 1}) AS i"
    name = "'w' || lpad(i::text, 6, '0')"
    try:
        for table in ("workflows", "workflow_metadata", "checkpoints"):
            await con.execute(f"ALTER TABLE {s}.{table} SET (autovacuum_enabled = false)")
        await con.execute(
            f"INSERT INTO {s}.workflows (workflow_id, status, metadata, latest_agent_status, "
            f"updated_at) SELECT {name}, "
            "CASE WHEN i % 5 = 0 THEN 'unfinished' ELSE 'finished' END, "
            "'{\"tenant\":\"t' || (i % 4) || '\"}', "
            "CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'running' END, "
            "now() - i * interval '1 second' " + series
        )
        await con.execute(
            f"INSERT INTO {s}.workflow_metadata (workflow_id, key, value) "
            f"SELECT {name}, 'tenant', '\"t' || (i % 4) || '\"' {series} UNION ALL "
            f"SELECT {name}, 'org', '\"o' || (i % 13) || '\"' " + series
        )
        await con.execute(
            f"INSERT INTO {s}.checkpoints (workflow_id, step, data) "
            f"SELECT {name}, j, '\\x00'::bytea {series}, generate_series(0, 2) AS j"
        )
    finally:
        await con.close()


@pytest.fixture(scope="module")
def fill() -> Iterator[_Fill]:
    """The module's fill (:class:`_Fill`), dropped after its last test."""
    made = _Fill()
    yield made
    asyncio.run(made.drop())


@contextlib.asynccontextmanager
async def _filled(fill: _Fill, state: str) -> AsyncIterator[tuple[asyncpg.Connection, str]]:
    """A connection and the fill's quoted schema, its tables in ``state``."""
    s = await fill.at(state)
    con = await asyncpg.connect(DSN)
    try:
        yield con, s
    finally:
        await con.close()


def _statement(s: str, query: WorkflowQuery) -> tuple[str, Any]:
    sql, args = query_statement(Sql.for_schema(s), query, ["workflow_id"])
    return sql, *args


async def _plan(con: asyncpg.Connection, sql: str, *args: object, settings: str = "") -> str:
    async with con.transaction():
        if settings:  # as a sweep's transactions run
            await con.execute(settings)
        rows = await con.fetch(f"EXPLAIN {sql}", *args)
    return "\n".join(row[0] for row in rows)


async def test_postgres_sweep_statements_walk_the_primary_key_without_statistics(
    fill: _Fill,
) -> None:
    """A sweep's read of a page, of its records and its thinning probe the primary key on a
    table never analyzed (the page was a sequential scan of every checkpoint there), with
    no parallel workers (starting them cost a page 50-150 ms on a loaded machine)."""
    async with _filled(fill, "raw") as (con, s):
        sweeps = Sweeps(None, s, None, 1 << 20)  # type: ignore[arg-type]  # statements only
        ids = [f"w{n:06}" for n in range(500, 700)]
        thin = (ids, [0] * len(ids), ids, [1] * len(ids))
        plans = [
            await _plan(con, sweeps._page, "w000500", 200, settings=PAGE_SETTINGS),
            await _plan(con, sweeps._records_of, ids, 1 << 20, settings=PLANNER_SETTINGS),
            await _plan(con, sweeps._thin, *thin, settings=PLANNER_SETTINGS),
        ]
    for plan in plans:
        assert "checkpoints_pkey" in plan, plan
        assert "Seq Scan on checkpoints" not in plan and "Gather" not in plan, plan
    assert "HashAggregate" not in plans[0] and "Sort" not in plans[0], plans[0]


async def test_postgres_claim_and_filtered_page_walk_indexes(fill: _Fill) -> None:
    """With statistics, a claim reads the claimable index in age order and a page filtered
    by status and a metadata key walks the metadata index in id order: no scan, no sort."""
    async with _filled(fill, "analyzed") as (con, s):
        sql = Sql.for_schema(s)
        claim = await _plan(con, sql.claim, "owner", 30.0)
        page, args = query_sql(
            _PAGE,
            ["workflow_id"],
            sql.workflows_table,
            sql.metadata_table,
            "${}".format,
            str,
            drive_metadata=True,
        )
        listing = await _plan(con, page, *args)
    assert "workflows_claimable" in claim, claim
    assert "workflow_metadata_value" in listing, listing
    for plan in (claim, listing):
        assert "Seq Scan" not in plan and "Sort" not in plan, plan


async def test_postgres_updated_range_reads_the_updated_minute_index(fill: _Fill) -> None:
    """The records updated since a time, newest first (the inspector's throughput), are a
    range of the ``updated_minute`` index, not a scan of every record."""
    since = datetime.now(timezone.utc) - timedelta(minutes=5)
    query = WorkflowQuery(updated_after=since, limit=50, newest_first=True)
    async with _filled(fill, "analyzed") as (con, s):
        plan = await _plan(con, *_statement(s, query))
    assert "workflows_updated_minute" in plan and "Seq Scan" not in plan, plan


def _touched(node: dict[str, Any]) -> int:
    """Rows a plan node and those below it read: returned or filtered out, every loop."""
    own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get(
        "Actual Loops", 1
    )
    return int(own) + sum(_touched(child) for child in node.get("Plans", []))


async def _rows_touched(con: asyncpg.Connection, s: str, query: WorkflowQuery) -> tuple[int, str]:
    sql = Sql.for_schema(s)
    text, args = query_sql(
        query,
        RECORD_COLUMNS,
        sql.workflows_table,
        sql.metadata_table,
        "${}".format,
        lambda moment: moment,
        sql.in_doubt,
        drive_metadata=True,  # as the store asks
    )
    raw = await con.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}", *args)
    plan = json.loads(raw)[0]["Plan"]
    return _touched(plan), json.dumps(plan, indent=1)


@pytest.mark.parametrize("kind", ["workflow", None])
async def test_postgres_pages_touch_a_bounded_number_of_rows(fill: _Fill, kind: str | None) -> None:
    """Every page of the listing, with statistics, touches a bounded number of rows wherever
    its cursor is (a page filtered by status and metadata walked every workflow before its
    cursor: the bound was on the metadata side only; with the bound on both sides, a merge
    join read every workflow in the page's span: the metadata rows now drive)."""
    # "vacuumed": what autovacuum does on a real store, the statistics and the visibility
    # map that lets a walk of the metadata index skip the table.
    async with _filled(fill, "vacuumed") as (con, s):
        for name, query in _PAGES.items():
            for after in ("w000100", "w010000", _LATE):
                touched, plan = await _rows_touched(con, s, _page(query, after, kind))
                # A page touches up to ~600 rows (a metadata page: ~250 index rows of its
                # value and as many lookups). Plans gone wrong: the walk of every workflow
                # before the cursor (10,000 at w010000, 19,000 at the end) and a merge join
                # reading every workflow the page's ids span (~3,500 for the rare value).
                assert touched <= 1_500, (name, after, touched, plan)
