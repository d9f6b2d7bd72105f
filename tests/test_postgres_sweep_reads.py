"""A PostgreSQL sweep's read of a page: each workflow's records packed in one value.

The records of a page come as one asyncpg record per workflow (its records packed in one
``bytea``), not one per checkpoint: asyncpg's records are tracked by the garbage collector,
and ~20,000 of them alive through a page's young collections reached its oldest generation
and set off full collections during a sweep (bench/NOTES.md, issue 32).
"""

from __future__ import annotations

import gc
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest

from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres.sweeps import unpacked
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

WORKFLOWS = 200
STEPS = 10


def _packed(pairs: list[tuple[int, bytes]]) -> bytes:
    return b"".join(struct.pack(">qi", step, len(data)) + data for step, data in pairs)


def test_unpacked_gives_each_record_newest_first_whatever_the_order() -> None:
    pairs = [(3, b"three"), (10, b""), (0, b"zero" * 100), (7, b"\x00\xff")]
    assert tuple(unpacked(_packed(pairs))) == (
        (10, b""),
        (7, b"\x00\xff"),
        (3, b"three"),
        (0, b"zero" * 100),
    )
    assert tuple(unpacked(b"")) == ()


@pytest.fixture
async def store(pg_schema: str) -> AsyncIterator[PostgresCheckpointStorage]:
    """``WORKFLOWS`` workflows of ``STEPS`` checkpoints each, their bytes naming the step."""
    storage = PostgresCheckpointStorage(DSN, schema=pg_schema, max_record_bytes=1000)
    await storage.__aenter__()
    await storage.list_workflows()  # the schema made
    con = await asyncpg.connect(DSN)
    s = f'"{pg_schema}"'
    try:
        await con.execute(
            f"INSERT INTO {s}.workflows (workflow_id, status, latest_step, latest_agent_id, "
            "latest_agent_status) SELECT 'wf-' || lpad(i::text, 4, '0'), 'unfinished', "
            "$2::bigint - 1, 'agent', 'running' FROM generate_series(0, $1::bigint - 1) AS i",
            WORKFLOWS,
            STEPS,
        )
        await con.execute(
            f"INSERT INTO {s}.checkpoints (workflow_id, step, data) "
            "SELECT 'wf-' || lpad(i::text, 4, '0'), j, convert_to('record ' || i || '/' || j, "
            "'UTF8') FROM generate_series(0, $1::bigint - 1) AS i, "
            "generate_series(0, $2::bigint - 1) AS j",
            WORKFLOWS,
            STEPS,
        )
        # One workflow with a record over max_record_bytes: not read (records None).
        await con.execute(
            f"UPDATE {s}.checkpoints SET data = $1 WHERE workflow_id = 'wf-0007' AND step = 4",
            b"x" * 2000,
        )
    finally:
        await con.close()
    try:
        yield storage
    finally:
        await storage.close()


async def _page(storage: PostgresCheckpointStorage) -> list[Any]:
    return await storage.histories(
        after=None, limit=WORKFLOWS, more_than=3, max_records=10**6, max_bytes=1 << 30
    )


async def test_a_page_reads_each_workflows_records_newest_first(
    store: PostgresCheckpointStorage,
) -> None:
    page = await _page(store)
    assert [h.workflow_id for h in page] == [f"wf-{i:04}" for i in range(WORKFLOWS)]
    for i, history in enumerate(page):
        assert (history.count, history.oldest) == (STEPS, 0)
        if i == 7:
            assert history.records is None
            continue
        expected = tuple((j, f"record {i}/{j}".encode()) for j in reversed(range(STEPS)))
        assert history.records is not None
        assert tuple(history.records) == expected


@contextmanager
def _young_survivors(kind: type) -> Iterator[list[int]]:
    """How many ``kind`` objects were alive at each young collection, which promotes them.

    Young collections every 100 tracked allocations, and no older ones meanwhile.
    """
    counts: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            counts.append(sum(isinstance(o, kind) for o in gc.get_objects(0)))

    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(100, 1_000_000, 1_000_000)
    gc.callbacks.append(count)
    try:
        yield counts
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*thresholds)


async def test_a_page_read_promotes_about_one_asyncpg_record_per_workflow(
    store: PostgresCheckpointStorage,
) -> None:
    await _page(store)  # the statements prepared, the pool warm
    with _young_survivors(asyncpg.Record) as counts:
        page = await _page(store)
    assert len(page) == WORKFLOWS
    assert counts, "no young collection during the read"
    # A row per checkpoint (2,000 here) lived through the read's young collections.
    assert sum(counts) <= 2 * WORKFLOWS + 50
