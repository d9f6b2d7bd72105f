"""The framework's own workflow runner on ``AioCheckpointStorage``, against its file storage.

A workflow run checkpointed at every superstep gives the same chain of checkpoints (one per
superstep, each naming the one before) as with the framework's ``FileCheckpointStorage``,
and resuming a new workflow object from each checkpoint, through a new storage object on a
new manager, gives the same output as resuming from the file storage's checkpoint at the
same place. With ``max_checkpoints`` the newest N are kept, and resume as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_framework import FileCheckpointStorage, WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from aiocheckpoint import CheckpointManager
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from tests.backend_support import make_storage
from tests.integrations.managers import keyring

from .workflows import NAME, build


def chain(checkpoints: list[WorkflowCheckpoint]) -> list[WorkflowCheckpoint]:
    """The checkpoints in the order of their ``previous_checkpoint_id`` links."""
    by_previous = {cp.previous_checkpoint_id: cp for cp in checkpoints}
    ordered = [by_previous[None]]
    while ordered[-1].checkpoint_id in by_previous:
        ordered.append(by_previous[ordered[-1].checkpoint_id])
    assert len(ordered) == len(checkpoints)
    return ordered


def shape(checkpoint: WorkflowCheckpoint) -> tuple[Any, ...]:
    """What a checkpoint says, without its id and time."""
    return (checkpoint.iteration_count, sorted(checkpoint.messages), checkpoint.state)


async def outputs(storage: Any, checkpoint_id: str) -> list[Any]:
    result = await build(storage).run(checkpoint_id=checkpoint_id)
    return list(result.get_outputs())


async def reference(tmp_path: Path) -> tuple[list[Any], list[WorkflowCheckpoint], list[Any]]:
    """The framework's file storage: the run's output, its chain, each resume's output."""
    files = FileCheckpointStorage(tmp_path / "reference")
    result = await build(files).run(1)
    checkpoints = chain(await files.list_checkpoints(workflow_name=NAME))
    resumed = [await outputs(files, cp.checkpoint_id) for cp in checkpoints]
    return list(result.get_outputs()), checkpoints, resumed


@pytest.mark.parametrize("sealed", [False, True])
async def test_runs_and_resumes_as_with_the_framework_file_storage(
    backend: str, sealed: bool, tmp_path: Path, pg_schema: str
) -> None:
    expected_output, expected_chain, expected_resumes = await reference(tmp_path)
    assert expected_output == ["total=10 seen=[1, 2, 3, 4]"]
    keys = keyring() if sealed else None
    storage = make_storage(backend, tmp_path, pg_schema)
    try:
        ours = AioCheckpointStorage(CheckpointManager(storage, encryption=keys))
        result = await build(ours).run(1)
        assert list(result.get_outputs()) == expected_output
        saved = await ours.list_checkpoints(workflow_name=NAME)
        assert saved == chain(saved)  # saved in the order of the chain
        assert [shape(cp) for cp in saved] == [shape(cp) for cp in expected_chain]
        latest = await ours.get_latest(workflow_name=NAME)
        assert latest is not None
        assert latest.checkpoint_id == saved[-1].checkpoint_id
        if backend != "memory":  # the same store, opened again (as another process would)
            await storage.close()
            storage = make_storage(backend, tmp_path, pg_schema)
        manager = CheckpointManager(storage, encryption=keys)
        resumed = [await outputs(AioCheckpointStorage(manager), cp.checkpoint_id) for cp in saved]
    finally:
        await storage.close()
    assert resumed == expected_resumes


async def test_retention_keeps_the_newest_and_they_resume(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    _, expected_chain, expected_resumes = await reference(tmp_path)
    async with make_storage(backend, tmp_path, pg_schema) as storage:
        ours = AioCheckpointStorage(CheckpointManager(storage, max_checkpoints=3))
        await build(ours).run(1)
        kept = await ours.list_checkpoints(workflow_name=NAME)
        assert [shape(cp) for cp in kept] == [shape(cp) for cp in expected_chain[-3:]]
        assert [cp.previous_checkpoint_id for cp in kept[1:]] == [
            cp.checkpoint_id for cp in kept[:-1]
        ]
        gone = kept[0].previous_checkpoint_id
        assert gone is not None
        with pytest.raises(WorkflowCheckpointException):
            await ours.load(gone)
        # Resumed runs save checkpoints too: through a manager that keeps them all, so that
        # resuming one kept checkpoint does not prune the next.
        keeping = CheckpointManager(storage)
        resumed = [await outputs(AioCheckpointStorage(keeping), cp.checkpoint_id) for cp in kept]
    assert resumed == expected_resumes[-3:]
