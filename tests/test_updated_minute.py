"""The records' ``updated_minute``: kept by the database whatever writes ``updated_at``, moved
only when the minute changes (a save within a minute leaves its index alone: on PostgreSQL
the update stays HOT), filled in by the migration on a store made before it, and the time
ranges read on it return what a filter and a sort of ``updated_at`` would. A SQLite save
names no indexed column it leaves as it was."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import asyncpg

from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres import schema as pg_schema_module
from aiocheckpoint.storage.queries import StepInfo, WorkflowQuery
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite import records as sqlite_records
from aiocheckpoint.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

_BASE = datetime(2027, 1, 1, tzinfo=timezone.utc)
#: Seconds after _BASE of each workflow's update: several in one minute, either side of
#: minute boundaries, out of id order.
_OFFSETS = {"a": 61.0, "b": 0.0, "c": 59.999, "d": 60.0, "e": 3600.5, "f": 30.25, "g": 119.9}


def _newest_first(after: float, before: float | None = None) -> list[str]:
    kept = [wf for wf, at in _OFFSETS.items() if at > after and (before is None or at < before)]
    return sorted(kept, key=lambda wf: -_OFFSETS[wf])


def _cases() -> list[tuple[WorkflowQuery, list[str]]]:
    """Time ranges, and the ids a filter and a sort of ``updated_at`` keep, newest first."""

    def at(seconds: float) -> datetime:
        return _BASE + timedelta(seconds=seconds)

    return [
        (WorkflowQuery(updated_after=at(-1), newest_first=True), _newest_first(-1)),
        (WorkflowQuery(updated_after=at(30.25), newest_first=True), _newest_first(30.25)),
        (
            WorkflowQuery(updated_after=at(30), limit=3, newest_first=True),
            _newest_first(30)[:3],
        ),
        (
            WorkflowQuery(updated_after=at(0), updated_before=at(61), newest_first=True),
            _newest_first(0, 61),
        ),
        (  # in id order: the minute bounds change nothing of the listing's order
            WorkflowQuery(updated_after=at(59.999), updated_before=at(3600.5)),
            sorted(_newest_first(59.999, 3600.5)),
        ),
    ]


def _minute(offset: float) -> int:
    return int((_BASE.timestamp() + offset) // 60)


async def test_sqlite_store_of_schema_9_gets_the_minute_index(tmp_path: Path) -> None:
    """The migration fills the column from each record's time, swaps the indexes, and the
    store's time ranges are a filter and a sort of ``updated_at``."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:9]) == 9
    for wf, offset in _OFFSETS.items():
        at = _BASE.timestamp() + offset
        conn.execute(
            "INSERT INTO workflows (workflow_id, created_at, updated_at) VALUES (?, ?, ?)",
            (wf, at, at),
        )
    async with SQLiteCheckpointStorage(db) as storage:
        for query, expected in _cases():
            found = await storage.query_workflow_records(query)
            assert [r.workflow_id for r in found] == expected, query
    assert conn.execute("PRAGMA user_version").fetchall() == [(SCHEMA_VERSION,)]
    minutes = dict(conn.execute("SELECT workflow_id, updated_minute FROM workflows").fetchall())
    assert minutes == {wf: _minute(offset) for wf, offset in _OFFSETS.items()}
    indexes = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "workflows_updated_minute" in indexes and "workflows_updated" not in indexes
    conn.close()


def test_sqlite_minute_is_written_only_when_it_changes(tmp_path: Path) -> None:
    """An update of ``updated_at`` within its minute writes the row once (the trigger does
    nothing); one into the next minute writes the column too; an insert gets its minute."""
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    migrate(conn)
    at = _BASE.timestamp()
    conn.execute(
        "INSERT INTO workflows (workflow_id, created_at, updated_at) VALUES ('w', ?, ?)", (at, at)
    )
    minute = "SELECT updated_minute FROM workflows WHERE workflow_id = 'w'"
    assert conn.execute(minute).fetchall() == [(_minute(0),)]

    def changes_of(seconds: float) -> int:
        before = conn.total_changes
        conn.execute("UPDATE workflows SET updated_at = ? WHERE workflow_id = 'w'", (seconds,))
        return conn.total_changes - before

    assert changes_of(at + 1.5) == 1 and changes_of(at + 59.0) == 1
    assert conn.execute(minute).fetchall() == [(_minute(0),)]
    assert changes_of(at + 60.0) == 2  # the record and, by the trigger, its minute
    assert conn.execute(minute).fetchall() == [(_minute(60),)]
    assert changes_of(at + 10.0) == 2  # back in time too: the minute follows
    assert conn.execute(minute).fetchall() == [(_minute(10),)]
    conn.close()


async def _old_pg_store(admin: asyncpg.Connection, quoted: str) -> None:
    """A store at schema 11 holding the records of ``_OFFSETS``."""
    await admin.execute(f"CREATE SCHEMA {quoted}")
    await admin.execute(f"CREATE TABLE {quoted}.meta (key text PRIMARY KEY, value text NOT NULL)")
    for migration in pg_schema_module.MIGRATIONS[:11]:
        for statement in migration:
            await admin.execute(statement.format(s=quoted))
    await admin.execute(f"INSERT INTO {quoted}.meta VALUES ('schema_version', '11')")
    for wf, offset in _OFFSETS.items():
        await admin.execute(
            f"INSERT INTO {quoted}.workflows (workflow_id, updated_at) VALUES ($1, $2)",
            wf,
            _BASE + timedelta(seconds=offset),
        )


async def test_postgres_store_of_schema_11_gets_the_minute_index(pg_schema: str) -> None:
    """The migration adds the generated column (filled from each record's time), swaps the
    indexes, and the store's time ranges are a filter and a sort of ``updated_at``."""
    quoted = f'"{pg_schema}"'
    admin = await asyncpg.connect(DSN)
    try:
        await _old_pg_store(admin, quoted)
        async with PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2) as storage:
            for query, expected in _cases():
                found = await storage.query_workflow_records(query)
                assert [r.workflow_id for r in found] == expected, query
        version = await admin.fetchval(f"SELECT value FROM {quoted}.meta")
        assert version == str(pg_schema_module.SCHEMA_VERSION)
        rows = await admin.fetch(f"SELECT workflow_id, updated_minute FROM {quoted}.workflows")
        assert dict(rows) == {wf: _minute(offset) for wf, offset in _OFFSETS.items()}
        indexes = {
            r[0]
            for r in await admin.fetch(
                "SELECT indexname FROM pg_indexes WHERE schemaname = $1", pg_schema
            )
        }
        assert "workflows_updated_minute" in indexes and "workflows_updated" not in indexes
    finally:
        await admin.close()


async def test_postgres_update_within_the_minute_is_hot(pg_schema: str) -> None:
    """A save's update of its record that leaves the minute as it was is HOT (no index
    touched); one into the next minute is not. With ``updated_at`` itself indexed, none was."""
    async with PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2) as storage:
        await storage.exists("warm-up")  # creates the schema
    quoted = f'"{pg_schema}"'
    con = await asyncpg.connect(DSN)
    update = f"UPDATE {quoted}.workflows SET updated_at = $1 WHERE workflow_id = 'w'"
    counts = (
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
        "WHERE schemaname = $1 AND relname = 'workflows'"
    )
    try:
        await con.execute(
            f"INSERT INTO {quoted}.workflows (workflow_id, updated_at) VALUES ('w', $1)", _BASE
        )
        async with con.transaction():
            for seconds in (1.0, 2.5, 30.0, 59.9):
                await con.execute(update, _BASE + timedelta(seconds=seconds))
            assert tuple(await con.fetchrow(counts, pg_schema)) == (4, 4)
            await con.execute(update, _BASE + timedelta(seconds=60))
            assert tuple(await con.fetchrow(counts, pg_schema)) == (5, 4)
    finally:
        await con.close()


def _columns_written(tmp_path: Path, kind: str | None) -> set[str]:
    """The record columns a batch of saves' statements name in their SET (SQLite's
    authorizer is told of each column an UPDATE writes, when the statement is prepared)."""
    conn = sqlite3.connect(tmp_path / f"w-{kind}.db", isolation_level=None)
    migrate(conn)
    written: set[str] = set()

    def authorizer(
        action: int, table: str | None, column: str | None, _db: object, trigger: str | None
    ) -> int:
        # The statement's own columns: not those of the trigger bodies it would run.
        if action == sqlite3.SQLITE_UPDATE and table == "workflows" and trigger is None:
            written.add(str(column))
        return sqlite3.SQLITE_OK

    conn.set_authorizer(authorizer)
    saves = [(f"w{n}", 1, StepInfo("agent", "completed", kind)) for n in range(3)]
    conn.execute("BEGIN")
    sqlite_records.note_saves(conn, _BASE.timestamp(), saves)
    conn.execute("COMMIT")
    conn.close()
    return written


def test_sqlite_saves_name_no_indexed_column_they_leave_alone(tmp_path: Path) -> None:
    """A save moves ``updated_at`` and names neither the minute (its triggers' column) nor,
    for the default kind, ``kind``: SQLite rewrites the index entries of every column an
    UPDATE names, changed or not (both kind indexes and the time index, every save)."""
    written = _columns_written(tmp_path, None)
    assert "updated_at" in written and "latest_step" in written, written
    assert "kind" not in written and "updated_minute" not in written, written
    assert _columns_written(tmp_path, "workflow") == written
    assert "kind" in _columns_written(tmp_path, "langgraph")  # a kind of its own sticks
