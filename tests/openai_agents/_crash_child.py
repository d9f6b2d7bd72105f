"""A child process of test_crash.py: appends two-item batches to session "s" forever, with a
2-second lease, printing each batch's number once ``add_items`` has returned."""

from __future__ import annotations

import sys

import anyio

from aiocheckpoint import CheckpointManager
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage


async def main() -> None:
    backend, where, dsn = sys.argv[1], sys.argv[2], sys.argv[3]
    storage = (
        SQLiteCheckpointStorage(where)
        if backend == "sqlite"
        else PostgresCheckpointStorage(dsn, schema=where, max_size=1)
    )
    async with storage, CheckpointManager(storage) as manager:
        session = AioCheckpointSession("s", manager, lease_ttl=2.0)
        n = 0
        while True:
            await session.add_items(
                [{"role": "user", "content": f"{n}:a"}, {"role": "user", "content": f"{n}:b"}]
            )
            print(n, flush=True)
            n += 1


if __name__ == "__main__":
    anyio.run(main)
