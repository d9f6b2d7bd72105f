"""Child process for the PostgreSQL blob tests: saves large, partly changing states.

Usage: ``_pg_blob_child.py DSN SCHEMA WORKFLOW SEED STEPS KEEP``. Prints ``<step>`` on its
own line after each save returns (an acknowledgement); runs until STEPS or until killed.
"""

from __future__ import annotations

import asyncio
import sys

from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from tests._blob_child import state_for


async def main() -> None:
    dsn, schema, wf, seed, steps, keep = sys.argv[1:7]
    storage = PostgresCheckpointStorage(dsn, schema=schema, max_size=2)
    manager = CheckpointManager(storage, max_checkpoints=int(keep) or None)
    for step in range(int(steps)):
        await manager.create_checkpoint(wf, step, "child", "running", state_for(int(seed), step))
        sys.stdout.write(f"{step}\n")
        sys.stdout.flush()
    await manager.close()


if __name__ == "__main__":
    asyncio.run(main())
