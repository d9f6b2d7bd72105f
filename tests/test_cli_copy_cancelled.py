"""``copy`` over a destination whose workflow is cancelled gives it the source's status.

A status write never moves a cancelled record (only ``retry_workflow`` does), so the copy
goes out of CANCELLED by a retry, as an operator would, then writes the source's status.
"""

from __future__ import annotations

import pytest

from aiocheckpoint import CheckpointManager, WorkflowStatus, open_storage
from tests.test_cli import NewStore, cli, new_store

__all__ = ["new_store"]

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_copy_over_a_cancelled_workflow_carries_the_source_status(
    new_store: NewStore, kind: str
) -> None:
    src = new_store(kind)
    async with CheckpointManager(open_storage(src)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 0})
        await manager.mark_workflow("wf", "finished")
    dst = new_store(kind)  # named after the source exists: its own name
    async with CheckpointManager(open_storage(dst)) as manager:
        await manager.register_workflow("wf")
        await manager.cancel_workflow("wf", reason="stop")
    result = cli("copy", src, dst)
    assert result.code == 0, result.out
    async with CheckpointManager(open_storage(dst)) as manager:
        record = await manager.get_workflow("wf")
    assert record is not None and record.status is WorkflowStatus.FINISHED
