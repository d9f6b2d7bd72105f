"""One page of a filtered workflow listing, with 100 and with 100,000 workflows (issue 15).

    python bench/workflow_queries.py [--small 100] [--large 100000] [--repeat 200]
                                     [--backends sqlite,postgres]

For each backend, two stores are filled: ``--small`` and ``--large`` workflows, each with
metadata ``{"tenant": "t0" or "t1", "kind": "chat"}`` (three in four are t0), every tenth
one finished. The rows are
inserted with bulk SQL in the shape ``register_workflow(id, metadata=...)`` writes (through
the API, 100,000 registrations would take minutes); the query is the public API:
``list_workflow_records("unfinished", metadata={"tenant": "t0"}, limit=50)``, the first page
and the page after its cursor. The two stores are queried alternately in the same process
(small, large, small, ...), ``--repeat`` times each, and the medians and the ratio
large/small are printed: the machine is shared, so only the ratio means anything. With
PostgreSQL at ``AIOCHECKPOINT_PG_DSN`` (default the test server); its schemas are dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from aiocheckpoint import (
    CheckpointManager,
    PostgresCheckpointStorage,
    SQLiteCheckpointStorage,
)

DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def _rows(count: int) -> list[tuple[str, str, str, str]]:
    """(workflow id, status, metadata JSON, tenant JSON) of each workflow."""
    rows = []
    for n in range(count):
        tenant = "t1" if n % 4 == 3 else "t0"
        meta = json.dumps({"kind": "chat", "tenant": tenant}, separators=(",", ":"))
        status = "finished" if n % 10 == 9 else "unfinished"
        rows.append((f"wf-{n:07}", status, meta, json.dumps(tenant)))
    return rows


async def _fill_sqlite(path: Path, count: int) -> CheckpointManager:
    storage = SQLiteCheckpointStorage(path)
    await storage.open()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    rows = _rows(count)
    conn.executemany(
        "INSERT INTO workflows (workflow_id, status, created_at, updated_at, metadata) "
        "VALUES (?, ?, 0, 0, ?)",
        [(w, s, m) for w, s, m, _ in rows],
    )
    conn.executemany(
        "INSERT INTO workflow_metadata (workflow_id, key, value) VALUES (?, ?, ?)",
        [(w, k, v) for w, _, _, t in rows for k, v in (("kind", '"chat"'), ("tenant", t))],
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return CheckpointManager(storage)


async def _fill_postgres(schema: str, count: int) -> CheckpointManager:
    import asyncpg

    storage = PostgresCheckpointStorage(DSN, schema=schema)
    await storage.list_workflows()  # creates the schema
    rows = _rows(count)
    con = await asyncpg.connect(DSN)
    try:
        s = f'"{schema}"'
        await con.copy_records_to_table(
            "workflows",
            schema_name=schema,
            columns=["workflow_id", "status", "metadata"],
            records=[(w, st, m) for w, st, m, _ in rows],
        )
        await con.copy_records_to_table(
            "workflow_metadata",
            schema_name=schema,
            records=[
                (w, k, v) for w, _, _, t in rows for k, v in (("kind", '"chat"'), ("tenant", t))
            ],
        )
        await con.execute(f"ANALYZE {s}.workflows")
        await con.execute(f"ANALYZE {s}.workflow_metadata")
    finally:
        await con.close()
    return CheckpointManager(storage)


async def _page_seconds(manager: CheckpointManager) -> float:
    started = time.perf_counter()
    page = await manager.list_workflow_records("unfinished", metadata={"tenant": "t0"}, limit=50)
    more = await manager.list_workflow_records(
        "unfinished", metadata={"tenant": "t0"}, limit=50, cursor=page.next_cursor
    )
    elapsed = time.perf_counter() - started
    assert len(page) == 50 and more
    return elapsed / 2


async def _compare(
    small: CheckpointManager, large: CheckpointManager, repeat: int
) -> dict[str, Any]:
    times: dict[str, list[float]] = {"small": [], "large": []}
    for _ in range(3):  # warm caches and statement plans
        await _page_seconds(small)
        await _page_seconds(large)
    for n in range(repeat):
        order = ("small", "large") if n % 2 == 0 else ("large", "small")
        for name in order:
            times[name].append(await _page_seconds(small if name == "small" else large))
    med = {name: statistics.median(values) for name, values in times.items()}
    return {
        "small_ms": round(med["small"] * 1000, 3),
        "large_ms": round(med["large"] * 1000, 3),
        "ratio": round(med["large"] / med["small"], 2),
    }


async def _run(backend: str, sizes: tuple[int, int], repeat: int) -> dict[str, Any]:
    managers: list[CheckpointManager] = []
    schemas: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for size in sizes:
                if backend == "sqlite":
                    managers.append(await _fill_sqlite(Path(tmp) / f"{size}.db", size))
                else:
                    schemas.append(f"bench_q_{uuid.uuid4().hex[:12]}")
                    managers.append(await _fill_postgres(schemas[-1], size))
            result = await _compare(managers[0], managers[1], repeat)
        finally:
            for manager in managers:
                await manager.close()
            await _drop(schemas)
    return {"backend": backend, "small": sizes[0], "large": sizes[1], **result}


async def _drop(schemas: list[str]) -> None:
    if not schemas:
        return
    import asyncpg

    con = await asyncpg.connect(DSN)
    try:
        for schema in schemas:
            await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()


def main() -> None:
    """Parse the options, measure each backend, print one JSON line each and a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    print("backend   small  large    page(small) ms  page(large) ms  large/small")
    for backend in args.backends.split(","):
        row = asyncio.run(_run(backend, (args.small, args.large), args.repeat))
        print(json.dumps(row), file=sys.stderr)
        print(
            f"{backend:<9} {row['small']:<6} {row['large']:<8} {row['small_ms']:>14} "
            f"{row['large_ms']:>15} {row['ratio']:>12}"
        )


if __name__ == "__main__":
    main()
