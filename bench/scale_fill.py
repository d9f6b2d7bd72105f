"""Bulk filler for bench/scale.py --queries: workflow records, metadata and checkpoints in SQL.

Workflows ``q-0000000`` onwards: status by ``i % 10`` (0-1 unfinished, 2-8 finished, 9
failed), metadata ``{"org": "o<i % 97>", "tenant": "t<i % 4>"}``, one checkpoint each
(a copy of ``record``, a record of another workflow: the probes never read a filler's
checkpoint), created in id order. A page of 50 unfinished workflows of one tenant (1 in
20 pass) is then full from 1,000 workflows up; of one org (1 in 485 pass: 97 x 5, the org
and the status independent) from about 25,000.
Written straight into the tables, many times faster than through a manager.

``fill_histories_*`` write what bench/scale.py's sweep measures (``--fill``): workflows
``wf-0000000`` onwards, each an UNFINISHED record and ``checkpoints`` steps (copies of
``record``, a RUNNING checkpoint), as the bench's build through a manager leaves them.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import asyncpg

__all__ = ["fill_histories_postgres", "fill_histories_sqlite", "fill_postgres", "fill_sqlite"]

_STATUS: Final = (
    "CASE WHEN i % 10 < 2 THEN 'unfinished' WHEN i % 10 < 9 THEN 'finished' ELSE 'failed' END"
)
_ID: Final = "'q-' || substr('0000000' || i, -7, 7)"
_PG_ID: Final = "'q-' || lpad(i::text, 7, '0')"
_METADATA: Final = """'{"org":"o' || (i % 97) || '","tenant":"t' || (i % 4) || '"}'"""


@contextmanager
def _filling(path: Path) -> Iterator[sqlite3.Connection]:
    """A write transaction on the SQLite store at ``path`` (closed), its WAL emptied after."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def fill_sqlite(path: Path, start: int, stop: int, record: bytes) -> None:
    """Add fillers ``start`` to ``stop - 1`` to the SQLite store at ``path`` (closed)."""
    with _filling(path) as conn:
        seq = "WITH RECURSIVE s(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?2) "
        now = time.time()
        conn.execute(
            seq + "INSERT INTO workflows (workflow_id, status, created_at, updated_at, "
            "finished_at, metadata, latest_step, latest_agent_id, latest_agent_status) "
            f"SELECT {_ID}, {_STATUS}, ?3 + i * 1e-6, ?3 + i * 1e-6, "
            f"CASE WHEN i % 10 >= 2 THEN ?3 END, {_METADATA}, 0, 'a', 'running' FROM s",
            (start, stop, now - 86400),
        )
        conn.execute(
            seq + "INSERT INTO workflow_metadata (workflow_id, key, value) "
            f"SELECT {_ID}, 'tenant', '\"t' || (i % 4) || '\"' FROM s "
            f"UNION ALL SELECT {_ID}, 'org', '\"o' || (i % 97) || '\"' FROM s",
            (start, stop),
        )
        conn.execute(
            seq + f"INSERT INTO checkpoints (workflow_id, step, data) SELECT {_ID}, 0, ?3 FROM s",
            (start, stop, record),
        )


async def fill_postgres(dsn: str, schema: str, start: int, stop: int, record: bytes) -> None:
    """Add fillers ``start`` to ``stop - 1`` to the PostgreSQL store in ``schema``."""
    con = await asyncpg.connect(dsn)
    s = f'"{schema}"'
    try:
        async with con.transaction():
            series = "FROM generate_series($1::bigint, $2::bigint - 1) AS i"
            await con.execute(
                f"INSERT INTO {s}.workflows (workflow_id, status, created_at, updated_at, "
                "finished_at, metadata, latest_step, latest_agent_id, latest_agent_status) "
                f"SELECT {_PG_ID}, {_STATUS}, now() - interval '1 day' + i * interval '1 us', "
                "now() - interval '1 day' + i * interval '1 us', "
                "CASE WHEN i % 10 >= 2 THEN now() - interval '1 day' END, "
                f"{_METADATA}, 0, 'a', 'running' " + series,
                start,
                stop,
            )
            await con.execute(
                f"INSERT INTO {s}.workflow_metadata (workflow_id, key, value) "
                f"SELECT {_PG_ID}, 'tenant', '\"t' || (i % 4) || '\"' {series} UNION ALL "
                f"SELECT {_PG_ID}, 'org', '\"o' || (i % 97) || '\"' " + series,
                start,
                stop,
            )
            await con.execute(
                f"INSERT INTO {s}.checkpoints (workflow_id, step, data) "
                f"SELECT {_PG_ID}, 0, $3 " + series,
                start,
                stop,
                record,
            )
        await con.execute(f"VACUUM ANALYZE {s}.workflows")
        await con.execute(f"VACUUM ANALYZE {s}.workflow_metadata")
        await con.execute(f"VACUUM ANALYZE {s}.checkpoints")
    finally:
        await con.close()


_WF_ID: Final = "'wf-' || substr('0000000' || i, -7, 7)"
_PG_WF_ID: Final = "'wf-' || lpad(i::text, 7, '0')"


def fill_histories_sqlite(path: Path, workflows: int, checkpoints: int, record: bytes) -> None:
    """Workflows ``wf-*`` of ``checkpoints`` steps each into the SQLite store at ``path``."""
    with _filling(path) as conn:
        seq = "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?1) "
        conn.execute(
            seq + "INSERT INTO workflows (workflow_id, status, created_at, updated_at, "
            "latest_step, latest_agent_id, latest_agent_status) "
            f"SELECT {_WF_ID}, 'unfinished', ?2, ?2, ?3 - 1, 'agent', 'running' FROM s",
            (workflows, time.time(), checkpoints),
        )
        conn.execute(
            seq + ", t(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM t WHERE j + 1 < ?2) "
            f"INSERT INTO checkpoints (workflow_id, step, data) SELECT {_WF_ID}, j, ?3 "
            "FROM s, t ORDER BY 1, 2",
            (workflows, checkpoints, record),
        )


async def fill_histories_postgres(
    dsn: str, schema: str, workflows: int, checkpoints: int, record: bytes
) -> None:
    """Workflows ``wf-*`` of ``checkpoints`` steps each into the PostgreSQL store in ``schema``."""
    con = await asyncpg.connect(dsn)
    s = f'"{schema}"'
    try:
        async with con.transaction():
            await con.execute(
                f"INSERT INTO {s}.workflows (workflow_id, status, latest_step, latest_agent_id, "
                f"latest_agent_status) SELECT {_PG_WF_ID}, 'unfinished', $2::bigint - 1, "
                "'agent', 'running' FROM generate_series(0, $1::bigint - 1) AS i",
                workflows,
                checkpoints,
            )
            await con.execute(
                f"INSERT INTO {s}.checkpoints (workflow_id, step, data) "
                f"SELECT {_PG_WF_ID}, j, $3 FROM generate_series(0, $1::bigint - 1) AS i, "
                "generate_series(0, $2::bigint - 1) AS j ORDER BY 1, 2",
                workflows,
                checkpoints,
                record,
            )
        for table in ("workflows", "checkpoints"):
            await con.execute(f"VACUUM ANALYZE {s}.{table}")
    finally:
        await con.close()
