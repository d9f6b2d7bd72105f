"""Races between writers and deleters of the same workflow, on every backend."""

from __future__ import annotations

import anyio

from aiocheckpoint import CheckpointManager, CheckpointStorage
from aiocheckpoint.codec.v1 import decode_checkpoint

from ._support import dump_store, scaled


async def test_saves_racing_whole_workflow_deletes_never_fail(
    manager: CheckpointManager, storage: CheckpointStorage
) -> None:
    """Saves interleaved with deletes of their whole workflow never raise, and what survives is
    a consistent workflow whose latest is its highest step.
    """
    for round_ in range(scaled(30, 300)):
        wf = f"race/{round_}"
        async with anyio.create_task_group() as tg:
            for step in range(60):
                tg.start_soon(manager.create_checkpoint, wf, step, "a", "completed", {"s": step})
                if step % 15 == 7:
                    tg.start_soon(manager.delete_checkpoints, wf)
        steps = [c.step for c in await manager.list_checkpoints(wf)]
        latest = await manager.get_latest_checkpoint(wf)
        assert (latest.step if latest else None) == (max(steps) if steps else None)
        await manager.delete_checkpoints(wf)
        assert not await manager.has_checkpoint(wf)
    for (wf, step), data in (await dump_store(storage)).items():
        decode_checkpoint(data, workflow_id=wf, step=step)
