"""A separate process that writes checkpoints to a SQLite store, for the crash/multi-process tests.

``python sqlite_child.py crash DB``: many concurrent workflows (small states, and ~1 MB states
kept with max_checkpoints=2) write forever from their resume points; after each
``create_checkpoint`` returns it prints ``ack <workflow> <step>`` and flushes. The parent
SIGKILLs it.

``python sqlite_child.py writer DB ID COUNT``: ten concurrent workflows ``wf-0``..``wf-9``
write COUNT checkpoints in all (steps ``ID, ID + 2, ...`` so two writers never collide) once
a line arrives on stdin, then print ``done``.
"""

from __future__ import annotations

import asyncio
import sys

from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

SMALL = [f"small-{n}" for n in range(24)]
BIG = [f"big-{n}" for n in range(3)]
BIG_BYTES = 1024 * 1024


def small_state(workflow_id: str, step: int) -> dict[str, object]:
    return {"wf": workflow_id, "step": step, "text": f"{workflow_id}:{step};" * (20 + step % 40)}


def big_state(workflow_id: str, step: int) -> dict[str, object]:
    return {"wf": workflow_id, "step": step, "blob": chr(97 + step % 26) * BIG_BYTES}


async def crash(db: str) -> None:
    storage = SQLiteCheckpointStorage(db, busy_timeout=30.0)
    await storage.open()
    small = CheckpointManager(storage)
    big = CheckpointManager(storage, max_checkpoints=2)
    print("ready", flush=True)

    async def run(manager: CheckpointManager, wf: str, make: object) -> None:
        point = await manager.get_resume_point(wf)
        step = 0 if point is None else point[0]
        while True:
            state = make(wf, step)  # type: ignore[operator]
            await manager.create_checkpoint(wf, step, "child", "completed", state)
            sys.stdout.write(f"ack {wf} {step}\n")
            sys.stdout.flush()
            step += 1

    await asyncio.gather(
        *(run(small, wf, small_state) for wf in SMALL),
        *(run(big, wf, big_state) for wf in BIG),
    )


async def writer(db: str, ident: int, count: int) -> None:
    storage = SQLiteCheckpointStorage(db, busy_timeout=1.0)
    await storage.open()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # the parent starts both writers at once
    async with CheckpointManager(storage) as manager:

        async def run(n: int) -> None:
            wf = f"wf-{n}"
            for k in range(count // 10):
                step = ident + 2 * k
                await manager.create_checkpoint(wf, step, f"p{ident}", "completed", {"k": k})

        await asyncio.gather(*(run(n) for n in range(10)))
    print("done", flush=True)


if __name__ == "__main__":
    mode, db, *rest = sys.argv[1:]
    if mode == "crash":
        asyncio.run(crash(db))
    else:
        asyncio.run(writer(db, int(rest[0]), int(rest[1])))
