"""Retention through ``AioCheckpointStorage``: ``max_checkpoints`` keeps the newest
checkpoints of each workflow name (the chain runs on from the oldest kept), and a policy's
``finished_ttl`` deletes a workflow name nobody saved to for that long (its record is
finished, so runner pools never claim it)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from agent_framework import WorkflowCheckpoint

from aiocheckpoint import CheckpointManager, RetentionPolicy
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from tests.backend_support import make_storage


def chained(name: str, count: int) -> list[WorkflowCheckpoint]:
    checkpoints: list[WorkflowCheckpoint] = []
    for n in range(count):
        previous = checkpoints[-1].checkpoint_id if checkpoints else None
        checkpoints.append(
            WorkflowCheckpoint(
                workflow_name=name,
                graph_signature_hash="h",
                previous_checkpoint_id=previous,
                state={"n": n},
                iteration_count=n,
            )
        )
    return checkpoints


@pytest.mark.parametrize("backend", ["memory", "file", "sqlite", "postgres"])
async def test_max_checkpoints_keeps_the_newest_of_each_name(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    storage = make_storage(backend, tmp_path, pg_schema)
    async with CheckpointManager(storage, max_checkpoints=3) as manager:
        ours = AioCheckpointStorage(manager)
        first, second = chained("a", 7), chained("b", 2)
        for cp in [*first, *second]:
            await ours.save(cp)
        assert await ours.list_checkpoint_ids(workflow_name="a") == [
            cp.checkpoint_id for cp in first[-3:]
        ]
        assert await ours.list_checkpoint_ids(workflow_name="b") == [
            cp.checkpoint_id for cp in second
        ]
        kept = await AioCheckpointStorage(manager).list_checkpoints(workflow_name="a")
        assert [cp.state["n"] for cp in kept] == [4, 5, 6]
        assert kept[0].previous_checkpoint_id == first[3].checkpoint_id  # pruned, still named
        assert not await AioCheckpointStorage(manager).delete(first[3].checkpoint_id)


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_finished_ttl_deletes_an_idle_workflow_name(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    policy = RetentionPolicy(finished_ttl=timedelta(days=1))
    storage = make_storage(backend, tmp_path, pg_schema)
    async with CheckpointManager(storage, retention=policy) as manager:
        ours = AioCheckpointStorage(manager)
        for cp in chained("idle", 2) + chained("other", 1):
            await ours.save(cp)
        await manager.sweep()  # written just now: kept
        assert len(await ours.list_checkpoint_ids(workflow_name="idle")) == 2
        later = datetime.now(timezone.utc) + timedelta(days=2)
        report = await manager.sweep(now=later)
        assert report.workflows_deleted == {"finished": 2}
        assert await ours.get_latest(workflow_name="idle") is None
        again = chained("idle", 1)[0]
        await ours.save(again)
        assert await ours.list_checkpoint_ids(workflow_name="idle") == [again.checkpoint_id]
        record = await manager.get_workflow(ours.workflow_id("idle"))
        assert record is not None
        assert record.status == "finished"
        assert await manager.claim_workflow("runner") is None
