"""A fork and its ``forked`` event are stored together or not at all (SQLite, PostgreSQL).

The fork's first save (its fork step, which creates its workflow record) appends the event
in its own transaction. A trigger the test puts in the database makes one of the two
inserts fail, a real refusal by the database: then neither the fork's checkpoint nor its
record nor its event is stored, and the fork can be made again once the trigger is gone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import pytest

from aiocheckpoint import CheckpointError, CheckpointManager
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.events import EventStorage
from tests.backend_support import make_storage
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

pytestmark = pytest.mark.asyncio

#: Each target table's refusing trigger, per backend: SQLite's, PostgreSQL's (``{s}`` schema).
_SQLITE = (
    "CREATE TRIGGER refuse BEFORE INSERT ON {table} WHEN NEW.workflow_id = 'copy' "
    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
)
_PG = (
    "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.workflow_id = 'copy' THEN RAISE EXCEPTION 'refused by the test'; END IF; "
    "RETURN NEW; END $$; "
    "CREATE TRIGGER refuse BEFORE INSERT ON {s}.{table} FOR EACH ROW EXECUTE FUNCTION {s}.refuse()"
)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[CheckpointStorage]:
    async with make_storage(request.param, tmp_path, pg_schema) as storage:
        yield storage


async def refuse(store: CheckpointStorage, tmp_path: Path, table: str | None) -> None:
    """Make the database refuse inserts of ``copy`` into ``table`` (None: stop refusing)."""
    if type(store).__name__.startswith("SQLite"):

        def run() -> None:
            con = sqlite3.connect(tmp_path / "store.db", timeout=30)
            with con:
                con.execute("DROP TRIGGER IF EXISTS refuse")
                if table is not None:
                    con.execute(_SQLITE.format(table=table))
            con.close()

        await anyio.to_thread.run_sync(run)
        return
    schema = f'"{store._schema}"'  # type: ignore[attr-defined]
    con = await asyncpg.connect(DSN)
    try:
        await con.execute(f"DROP FUNCTION IF EXISTS {schema}.refuse() CASCADE")
        if table is not None:
            await con.execute(_PG.format(s=schema, table=table))
    finally:
        await con.close()


async def stored(store: CheckpointStorage) -> tuple[list[int], bool, list[str]]:
    """The fork's checkpoints' steps, whether it has a record, its events' kinds."""
    assert isinstance(store, EventStorage)
    steps = [r.step for r in await store.scan("copy")]
    record = await store.get_workflow("copy")
    return steps, record is not None, [e.kind for e in await store.get_events("copy")]


@pytest.mark.parametrize("table", ["workflow_events", "checkpoints"])
async def test_a_refused_insert_stores_neither_the_fork_nor_its_event(
    store: CheckpointStorage, tmp_path: Path, table: str
) -> None:
    manager = CheckpointManager(store)
    for step in range(3):
        await manager.create_checkpoint("src", step, "a", "completed", {"n": step})
    await refuse(store, tmp_path, table)
    with pytest.raises(CheckpointError):
        await manager.fork_workflow("src", 1, "copy")
    assert await stored(store) == ([], False, [])
    await refuse(store, tmp_path, None)
    assert await manager.fork_workflow("src", 1, "copy") == 2
    assert await stored(store) == ([0, 1], True, ["forked"])
    (event,) = await manager.get_events("copy")
    assert event.data == {"from": "src", "step": 1} and event.step == 1
    record = await manager.get_workflow("copy")
    assert record is not None and (record.latest_step, record.latest_agent_id) == (1, "a")
