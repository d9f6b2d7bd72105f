"""A child process of test_processes.py: 4 writers, each with its own store object, append
``batches`` two-item batches to session "s" (items ``P.W:N:a`` and ``P.W:N:b``)."""

from __future__ import annotations

import sys

import anyio

from aiocheckpoint import CheckpointManager
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from aiocheckpoint.storage.base import BaseStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

WRITERS = 4


async def writer(backend: str, where: str, name: str, batches: int) -> None:
    storage: BaseStorage
    if backend == "file":
        storage = FileCheckpointStorage(where)
    elif backend == "sqlite":
        storage = SQLiteCheckpointStorage(where)
    else:
        storage = PostgresCheckpointStorage(sys.argv[5], schema=where, max_size=1)
    async with storage, CheckpointManager(storage) as manager:
        session = AioCheckpointSession("s", manager)
        for n in range(batches):
            await session.add_items(
                [
                    {"role": "user", "content": f"{name}:{n}:a"},
                    {"role": "user", "content": f"{name}:{n}:b"},
                ]
            )


async def main() -> None:
    backend, where, process, batches = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    async with anyio.create_task_group() as tg:
        for w in range(WRITERS):
            tg.start_soon(writer, backend, where, f"{process}.{w}", batches)


if __name__ == "__main__":
    anyio.run(main)
