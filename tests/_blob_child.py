"""Child process for the blob tests: saves large, partly changing states until killed.

Usage: ``_blob_child.py STORE WORKFLOW SEED STEPS KEEP GC_EVERY GRACE [DOCS]``. Prints
``<step>`` on its own line after each save returns (an acknowledgement). With GC_EVERY > 0
it also runs ``collect_garbage(grace=GRACE)`` every GC_EVERY saves. A STORE ending in ``.db``
is a SQLite database (GRACE is then unused: SQLite frees blobs by reference counts). DOCS
(default 40) sets the size of the state: about 1.5 KB per document; beyond 40, a quarter of
them are rewritten at each step, so that every save writes a large pack.
"""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any

from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage


def state_for(seed: int, step: int, n_docs: int = 40) -> dict[str, Any]:
    """A ~60 KB state (by default): shared documents, some rewritten at each step, and a
    growing log.
    """
    rng = random.Random(seed * 1_000_003 + step)
    docs = [{"id": i, "body": f"shared doc {i} " + "text " * 150} for i in range(n_docs)]
    for _ in range(3 if n_docs <= 40 else n_docs // 4):
        i = rng.randrange(len(docs))
        docs[i] = {"id": i, "body": f"doc {i} at {seed}/{step} " + "new " * 200}
    return {"step": step, "docs": docs, "log": [f"entry {n} of {seed}" * 20 for n in range(step)]}


async def main() -> None:
    store, wf, seed, steps, keep, gc_every, grace = sys.argv[1:8]
    sqlite = store.endswith(".db")
    storage: FileCheckpointStorage | SQLiteCheckpointStorage = (
        SQLiteCheckpointStorage(store, busy_retries=100)
        if sqlite
        else FileCheckpointStorage(store, blob_grace_seconds=float(grace), gc_interval=None)
    )
    n_docs = int(sys.argv[8]) if len(sys.argv) > 8 else 40
    manager = CheckpointManager(storage, max_checkpoints=int(keep) or None)
    for step in range(int(steps)):
        state = state_for(int(seed), step, n_docs)
        await manager.create_checkpoint(wf, step, "child", "running", state)
        sys.stdout.write(f"{step}\n")
        sys.stdout.flush()
        if int(gc_every) and step % int(gc_every) == 0:
            if isinstance(storage, SQLiteCheckpointStorage):
                await storage.collect_garbage()
            else:
                await storage.collect_garbage(grace=float(grace))
    await manager.close()


if __name__ == "__main__":
    asyncio.run(main())
