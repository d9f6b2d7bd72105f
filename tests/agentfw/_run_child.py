"""A child process of test_crash.py: runs the counter workflow with its checkpoints in the
store named on the command line (under the prefix given), slowly, printing each checkpoint
id once it is saved."""

from __future__ import annotations

import sys
from typing import Any

import anyio

from aiocheckpoint import CheckpointManager
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.agentfw.workflows import build_counter


class Announcing(AioCheckpointStorage):
    async def save(self, checkpoint: Any) -> str:
        saved = await super().save(checkpoint)
        print(saved, flush=True)
        return saved


async def main() -> None:
    backend, where, dsn, prefix = sys.argv[1:5]
    storage: Any = {
        "sqlite": lambda: SQLiteCheckpointStorage(where),
        "file": lambda: FileCheckpointStorage(where),
        "postgres": lambda: PostgresCheckpointStorage(dsn, schema=where, max_size=1),
    }[backend]()
    async with storage, CheckpointManager(storage) as manager:
        await build_counter(Announcing(manager, prefix=prefix), delay=0.05).run(1)


if __name__ == "__main__":
    anyio.run(main)
