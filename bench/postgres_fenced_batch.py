"""Cost of the version-2 batch statement (records + fencing) next to the version-1 one.

    PYTHONPATH=src python bench/postgres_fenced_batch.py [--dsn DSN] [--rounds 150]

On one connection, for batches of 1 and 100 rows of 1 KB, it runs interleaved: the v1
``INSERT ... SELECT FROM unnest`` of checkpoints only; the v2 statement with unfenced rows
(which also creates missing workflow records); and the v2 statement with every row fenced
(which also locks the records FOR SHARE and compares tokens). Each is its own committed
transaction (synchronous_commit on), so the fsync is included. Prints medians; not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import asyncpg

from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres.sql import Sql


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    schema = f"aiocp_fence_bench_{uuid.uuid4().hex[:6]}"
    storage = PostgresCheckpointStorage(args.dsn, schema=schema)
    await storage.exists("create the schema")
    con = await asyncpg.connect(args.dsn)
    quoted = f'"{schema}"'
    v2 = Sql.for_schema(quoted).upsert
    v1 = (
        f"INSERT INTO {quoted}.checkpoints (workflow_id, step, data) "
        "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[]) "
        "ON CONFLICT (workflow_id, step) DO UPDATE "
        "SET data = EXCLUDED.data, created_at = EXCLUDED.created_at"
    )
    try:
        for rows in (1, 100):
            times: dict[str, list[float]] = {"v1": [], "v2 unfenced": [], "v2 fenced": []}
            wfs = [f"wf-{n}" for n in range(rows)]
            data = [b"x" * 1024] * rows
            for i in range(args.rounds):
                for name, sql, extra, offset in (
                    ("v1", v1, [], 0),
                    ("v2 unfenced", v2, [[None] * rows, True, []], 10**6),
                    ("v2 fenced", v2, [[0] * rows, True, []], 2 * 10**6),  # records have token 0
                ):
                    started = time.perf_counter()
                    await con.execute(sql, wfs, [i + offset] * rows, data, *extra)
                    times[name].append(time.perf_counter() - started)
            medians = ", ".join(
                f"{k} {statistics.median(v) * 1000:.2f} ms" for k, v in times.items()
            )
            print(f"{rows:>3} rows/batch: {medians} (median of {args.rounds}, interleaved)")
    finally:
        await storage.close()
        await con.execute(f"DROP SCHEMA {quoted} CASCADE")
        await con.close()


if __name__ == "__main__":
    asyncio.run(main())
