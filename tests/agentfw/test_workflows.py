"""The framework's own workflow runner on ``AioCheckpointStorage``, against its file storage.

On every backend, plain and encrypted: a workflow run checkpointed at every superstep gives
the same output and the same chain of checkpoints (one per superstep, each naming the one
before, with equal messages and state: typed values, registered classes, a fan-in buffer of
framework messages) as with the framework's ``FileCheckpointStorage``; resuming a new
workflow object from each checkpoint, through a new storage object on a new manager over
the store opened again, gives the same output as resuming from the file storage's
checkpoint at the same place. A run paused on a human's answer resumes from the store with
the answer, as from the file storage. With ``max_checkpoints`` the newest N are kept, and
resume as well.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_framework import FileCheckpointStorage, Workflow, WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from aiocheckpoint import CheckpointManager
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from tests.backend_support import make_storage
from tests.integrations.managers import keyring

from .workflows import (
    APPROVAL,
    FILE_ALLOWED,
    ORDERS,
    build_approval,
    build_orders,
    registry,
)

Build = Callable[[Any], Workflow]


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
    return (checkpoint.iteration_count, checkpoint.messages, checkpoint.state, checkpoint.metadata)


async def outputs(build: Build, storage: Any, checkpoint_id: str) -> list[Any]:
    result = await build(storage).run(checkpoint_id=checkpoint_id)
    return list(result.get_outputs())


def file_storage(tmp_path: Path) -> FileCheckpointStorage:
    return FileCheckpointStorage(tmp_path / "reference", allowed_checkpoint_types=FILE_ALLOWED)


async def reference(tmp_path: Path) -> tuple[list[Any], list[WorkflowCheckpoint], list[Any]]:
    """The framework's file storage: the run's output, its chain, each resume's output."""
    files = file_storage(tmp_path)
    result = await build_orders(files).run("o1")
    checkpoints = chain(await files.list_checkpoints(workflow_name=ORDERS))
    resumed = [await outputs(build_orders, files, cp.checkpoint_id) for cp in checkpoints]
    return list(result.get_outputs()), checkpoints, resumed


def manager_on(storage: Any, sealed: Any = None, **options: Any) -> CheckpointManager:
    return CheckpointManager(storage, encryption=sealed, types=registry(), **options)


@pytest.mark.parametrize("sealed", [False, True])
async def test_runs_and_resumes_as_with_the_framework_file_storage(
    backend: str, sealed: bool, tmp_path: Path, pg_schema: str
) -> None:
    expected_output, expected_chain, expected_resumes = await reference(tmp_path)
    assert expected_output[0].startswith("o1: [('2.50', 20), ('4.75', 30), ('7.00', 40)]")
    assert any("_edge_state" in cp.state for cp in expected_chain)  # a fan-in buffer
    keys = keyring() if sealed else None
    storage = make_storage(backend, tmp_path, pg_schema)
    try:
        ours = AioCheckpointStorage(manager_on(storage, keys))
        result = await build_orders(ours).run("o1")
        assert list(result.get_outputs()) == expected_output
        saved = await ours.list_checkpoints(workflow_name=ORDERS)
        assert saved == chain(saved)  # saved in the order of the chain
        assert [shape(cp) for cp in saved] == [shape(cp) for cp in expected_chain]
        latest = await ours.get_latest(workflow_name=ORDERS)
        assert latest is not None
        assert latest.checkpoint_id == saved[-1].checkpoint_id
        if backend != "memory":  # the same store, opened again (as another process would)
            await storage.close()
            storage = make_storage(backend, tmp_path, pg_schema)
        manager = manager_on(storage, keys)
        resumed = [
            await outputs(build_orders, AioCheckpointStorage(manager), cp.checkpoint_id)
            for cp in saved
        ]
    finally:
        await storage.close()
    assert resumed == expected_resumes
    assert all(output == expected_output for output in resumed[:-1])


async def test_a_paused_request_resumes_with_its_answer(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    files = file_storage(tmp_path)
    expected = await answered(files, files)
    async with make_storage(backend, tmp_path, pg_schema) as storage:
        ours = AioCheckpointStorage(manager_on(storage))
        later = AioCheckpointStorage(manager_on(storage))
        assert await answered(ours, later) == expected == ["o9 ('apple',): yes"]


async def answered(first: Any, later: Any) -> list[Any]:
    """Run the approval workflow until it asks; answer it from ``later``'s latest checkpoint."""
    result = await build_approval(first).run("o9")
    asked = result.get_request_info_events()
    assert len(asked) == 1
    latest = await later.get_latest(workflow_name=APPROVAL)
    pending = latest.pending_request_info_events
    assert list(pending) == [asked[0].request_id]
    assert pending[asked[0].request_id].data == asked[0].data
    assert pending[asked[0].request_id].response_type is str
    resumed = await build_approval(later).run(
        checkpoint_id=latest.checkpoint_id, responses={asked[0].request_id: "yes"}
    )
    return list(resumed.get_outputs())


async def test_retention_keeps_the_newest_and_they_resume(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    _, expected_chain, expected_resumes = await reference(tmp_path)
    async with make_storage(backend, tmp_path, pg_schema) as storage:
        ours = AioCheckpointStorage(manager_on(storage, max_checkpoints=3))
        await build_orders(ours).run("o1")
        kept = await ours.list_checkpoints(workflow_name=ORDERS)
        assert [shape(cp) for cp in kept] == [shape(cp) for cp in expected_chain[-3:]]
        assert [cp.previous_checkpoint_id for cp in kept[1:]] == [
            cp.checkpoint_id for cp in kept[:-1]
        ]
        assert await ours.list_checkpoint_ids(workflow_name=ORDERS) == [
            cp.checkpoint_id for cp in kept
        ]
        gone = kept[0].previous_checkpoint_id
        assert gone is not None
        with pytest.raises(WorkflowCheckpointException):
            await ours.load(gone)
        with pytest.raises(WorkflowCheckpointException):
            await AioCheckpointStorage(manager_on(storage)).load(gone)
        # Resumed runs save checkpoints too: through a manager that keeps them all, so that
        # resuming one kept checkpoint does not prune the next.
        keeping = manager_on(storage)
        resumed = [
            await outputs(build_orders, AioCheckpointStorage(keeping), cp.checkpoint_id)
            for cp in kept
        ]
    assert resumed == expected_resumes[-3:]
