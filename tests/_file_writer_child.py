"""Child process for the file-store crash and multi-process tests (run as a script).

Usage: python _file_writer_child.py BASE_DIR crash
       python _file_writer_child.py BASE_DIR group
       python _file_writer_child.py BASE_DIR writers INDEX COUNT STEPS

Prints ``ready`` once the store is open, then one ``<workflow> <step>`` line per
checkpoint, flushed right after ``create_checkpoint`` returned (the step is acknowledged).
"""

from __future__ import annotations

import sys

import anyio

from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.file import FileCheckpointStorage

BIG = "x" * (1024 * 1024)
SMALL_WORKFLOWS = ("small-0", "small-1", "small-2", "a/b", "Ünïcode ✓")
BIG_WORKFLOWS = ("big-0", "big-1")
BIG_KEEP = 3


def ack(workflow_id: str, step: int) -> None:
    sys.stdout.write(f"{workflow_id.encode().hex()} {step}\n")
    sys.stdout.flush()


async def next_step(manager: CheckpointManager, workflow_id: str, start: int, stride: int) -> int:
    latest = await manager.get_latest_checkpoint(workflow_id)
    if latest is None:
        return start
    step = latest.step + 1
    while step % stride != start % stride:
        step += 1
    return step


async def writer(
    manager: CheckpointManager, workflow_id: str, state: dict[str, object], start: int, stride: int
) -> None:
    step = await next_step(manager, workflow_id, start, stride)
    while True:
        await manager.create_checkpoint(
            workflow_id, step, "child", "completed", {**state, "n": step}
        )
        ack(workflow_id, step)
        step += stride


async def crash_mode(base: str) -> None:
    store = FileCheckpointStorage(base)
    plain = CheckpointManager(store)
    kept = CheckpointManager(store, max_checkpoints=BIG_KEEP)
    print("ready", flush=True)
    async with anyio.create_task_group() as tg:
        for wf in SMALL_WORKFLOWS:
            tg.start_soon(writer, plain, wf, {"msg": "small " * 20}, 0, 1)
        for wf in BIG_WORKFLOWS:
            tg.start_soon(writer, kept, wf, {"blob": BIG}, 0, 1)
        # Two tasks of one process sharing one workflow: even and odd steps.
        tg.start_soon(writer, plain, "shared", {"who": "even"}, 0, 2)
        tg.start_soon(writer, plain, "shared", {"who": "odd"}, 1, 2)


GROUP_WORKFLOWS = tuple(f"group-{i:02d}" for i in range(40))


async def group_mode(base: str) -> None:
    """Forty workflows saving at once: the store writes them as group commits."""
    manager = CheckpointManager(FileCheckpointStorage(base))
    print("ready", flush=True)
    async with anyio.create_task_group() as tg:
        for wf in GROUP_WORKFLOWS:
            tg.start_soon(writer, manager, wf, {"msg": "grouped " * 20}, 0, 1)


async def writers_mode(base: str, index: int, count: int, steps: int) -> None:
    store = FileCheckpointStorage(base)
    plain = CheckpointManager(store)
    kept = CheckpointManager(store, max_checkpoints=5)
    print("ready", flush=True)

    async def run(manager: CheckpointManager, wf: str) -> None:
        for step in range(index, steps * count, count):
            await manager.create_checkpoint(wf, step, f"p{index}", "completed", {"n": step})
            ack(wf, step)

    async with anyio.create_task_group() as tg:
        for wf in ("same-0", "same-1", "same/2"):
            tg.start_soon(run, plain, wf)
        tg.start_soon(run, kept, "kept")
        tg.start_soon(run, plain, f"own-{index}")
    await store.close()


if __name__ == "__main__":
    if sys.argv[2] == "crash":
        anyio.run(crash_mode, sys.argv[1])
    elif sys.argv[2] == "group":
        anyio.run(group_mode, sys.argv[1])
    else:
        anyio.run(writers_mode, sys.argv[1], *map(int, sys.argv[3:6]))
