"""fork_workflow: a new workflow with the source's history up to a step, ready to resume, on
every backend; on stores with blobs it shares the state's blobs and survives the source."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointManager,
    CheckpointNotFoundError,
    ExecutionMetrics,
    InvalidStepError,
    InvalidWorkflowIdError,
    Keyring,
    ResumableWorkflow,
    StorageBackendError,
    WorkflowBusyError,
    WorkflowExistsError,
)
from aiocheckpoint.storage.base import BlobCheckpointStorage, CheckpointStorage, WorkflowStorage
from tests.backend_support import any_storage, blob_storage, pg_schema

__all__ = ["any_storage", "blob_storage", "pg_schema"]


async def _history(manager: CheckpointManager, steps: int, state: Any = None) -> None:
    for n in range(steps):
        await manager.create_checkpoint(
            "src",
            n,
            f"agent-{n}",
            "completed",
            state if state is not None else {"n": n},
            metrics=ExecutionMetrics(total_steps=n + 1, elapsed_seconds=n / 2),
            metadata={"answer": f"a{n}"},
        )


async def test_fork_copies_the_history_up_to_a_step(any_storage: CheckpointStorage) -> None:
    """The fork holds steps 0..step with the source's timestamps, metadata, metrics and
    states; it resumes after step; the source is unchanged."""
    manager = CheckpointManager(any_storage)
    await _history(manager, 5)
    assert await manager.fork_workflow("src", 2, "what-if") == 3
    source = await manager.list_checkpoints("src")
    fork = await manager.list_checkpoints("what-if")
    assert [c.step for c in fork] == [0, 1, 2]
    for ours, theirs in zip(fork, source, strict=False):
        assert ours.workflow_id == "what-if"
        assert ours.model_dump(exclude={"workflow_id"}) == theirs.model_dump(
            exclude={"workflow_id"}
        )
    assert len(source) == 5
    async with ResumableWorkflow("what-if", manager) as wf:
        assert wf.resume_step == 3
        assert wf.state.to_dict() == {"n": 2}
        assert wf.metrics.total_steps == 3
        async with wf.step(3, agent_id="other-answer"):
            wf.state.set("n", 30)
    assert (await manager.get_checkpoint("src", 3)).state_snapshot.data == {"n": 3}


async def test_fork_at_a_failed_step_reruns_it(any_storage: CheckpointStorage) -> None:
    """Forking at a FAILED step resumes at that step, as the source would."""
    manager = CheckpointManager(any_storage)
    await _history(manager, 2)
    await manager.create_checkpoint("src", 2, "x", AgentStatus.FAILED, {"n": 1})
    await manager.fork_workflow("src", 2, "retry")
    point = await manager.get_resume_point("retry")
    assert point is not None and point[0] == 2


async def test_fork_errors_write_nothing(any_storage: CheckpointStorage) -> None:
    """A missing source or step, a taken id or a bad id raise typed errors; nothing is written."""
    manager = CheckpointManager(any_storage)
    await _history(manager, 2)
    with pytest.raises(CheckpointNotFoundError) as missing:
        await manager.fork_workflow("nope", 0, "new")
    assert missing.value.step is None
    with pytest.raises(CheckpointNotFoundError) as no_step:
        await manager.fork_workflow("src", 7, "new")
    assert no_step.value.step == 7
    with pytest.raises(WorkflowExistsError, match="'src'"):
        await manager.fork_workflow("src", 1, "src")
    with pytest.raises(InvalidWorkflowIdError):
        await manager.fork_workflow("src", 1, "")
    with pytest.raises(InvalidWorkflowIdError):
        await manager.fork_workflow("bad\x00id", 1, "new")
    with pytest.raises(InvalidStepError):
        await manager.fork_workflow("src", -1, "new")
    assert await manager.list_workflows() == ["src"]
    if isinstance(any_storage, WorkflowStorage):
        await manager.register_workflow("registered")
        with pytest.raises(WorkflowExistsError):
            await manager.fork_workflow("src", 1, "registered")
        assert not await manager.has_checkpoint("registered")


async def test_fork_keeps_max_checkpoints(any_storage: CheckpointStorage) -> None:
    """With max_checkpoints=N the fork gets the newest N steps up to the fork point."""
    manager = CheckpointManager(any_storage, max_checkpoints=2)
    await _history(manager, 2)
    await manager.create_checkpoint("src", 2, "a", "completed", {"n": 2})
    await manager.create_checkpoint("src", 3, "a", "completed", {"n": 3})
    assert await manager.fork_workflow("src", 3, "copy") == 2
    assert [c.step for c in await manager.list_checkpoints("copy")] == [2, 3]


async def test_fork_into_a_driven_workflow_is_refused(any_storage: CheckpointStorage) -> None:
    """While a block of this manager drives the new id, a fork into it is refused."""
    manager = CheckpointManager(any_storage)
    await _history(manager, 1)
    async with ResumableWorkflow("busy", manager):
        with pytest.raises(WorkflowBusyError):
            await manager.fork_workflow("src", 0, "busy")


async def test_a_fork_cut_short_resumes_after_the_fork_step(any_storage: CheckpointStorage) -> None:
    """The fork writes its newest step first: a fork whose second write fails already
    resumes after the fork step, with part of the history."""
    manager = CheckpointManager(any_storage)
    await _history(manager, 4)
    real_save, written = any_storage.save, []

    async def failing(*args: Any, **kwargs: Any) -> None:
        if args[0] == "cut":
            written.append(args[1])
            if len(written) == 2:
                raise StorageBackendError("the disk went away")
        await real_save(*args, **kwargs)

    any_storage.save = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(StorageBackendError):
            await manager.fork_workflow("src", 2, "cut")
    finally:
        del any_storage.save
    assert written == [2, 1]
    assert [c.step for c in await manager.list_checkpoints("cut")] == [2]
    point = await manager.get_resume_point("cut")
    assert point is not None and (point[0], point[1].data) == (3, {"n": 2})


def _large_state() -> dict[str, Any]:
    rng = random.Random(7)
    return {"docs": [{"id": i, "text": f"{rng.random():.17f}" * 8} for i in range(4000)]}


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_fork_shares_blobs_and_outlives_the_source(
    blob_storage: CheckpointStorage, encrypted: bool
) -> None:
    """On stores with blobs a fork writes no blob (encrypted too: the sealed blobs are
    shared as they are); after the source is deleted and garbage is collected, the fork
    still reads its whole state."""
    assert isinstance(blob_storage, BlobCheckpointStorage)
    keyring = Keyring(keys={"k1": bytes(range(32))}, primary="k1") if encrypted else None
    manager = CheckpointManager(blob_storage, incremental=True, encryption=keyring)
    state = _large_state()
    await _history(manager, 2, state)
    saved: list[int] = []
    real_save_tree = blob_storage.save_tree

    async def counting(*args: Any, **kwargs: Any) -> None:
        handed = set(args[3].blobs)
        stored = await blob_storage.fetch_blobs(handed)
        saved.append(len(handed - set(stored)))  # blobs that would be new
        await real_save_tree(*args, **kwargs)

    blob_storage.save_tree = counting  # type: ignore[method-assign]
    try:
        assert await manager.fork_workflow("src", 1, "fork") == 2
    finally:
        del blob_storage.save_tree
    assert saved == [0, 0]
    await manager.delete_checkpoints("src")
    if hasattr(blob_storage, "base_dir"):  # the file store: mark and sweep, no grace
        await blob_storage.collect_garbage(grace=0)  # type: ignore[call-arg]
    else:
        await blob_storage.collect_garbage()
    fork = await manager.get_checkpoint("fork", 1)
    assert fork.state_snapshot.data == state
    assert (await manager.get_checkpoint("fork", 0)).state_snapshot.data == state
    await manager.delete_checkpoints("fork")
    if hasattr(blob_storage, "base_dir"):
        assert await blob_storage.collect_garbage(grace=0) > 0  # type: ignore[call-arg]


class _StepFailed(Exception):
    """The body of a step failing after its effect completed."""


async def test_a_fork_starts_with_an_empty_effect_journal(any_storage: CheckpointStorage) -> None:
    """Forks copy checkpoints, not effects: no step of the fork has an effect record, and
    re-running the FAILED step it was forked at calls the effect anew, with the fork's own
    idempotency key; the source's journal is unchanged."""
    manager = CheckpointManager(any_storage)
    keys: list[str] = []

    async def pay(*, idempotency_key: str) -> int:
        keys.append(idempotency_key)
        return len(keys)

    with pytest.raises(_StepFailed):
        async with ResumableWorkflow("src", manager) as wf:
            async with wf.step(0, agent_id="a"):
                await wf.effect("pay", pay, idempotent=True)
            async with wf.step(1, agent_id="a"):
                await wf.effect("pay", pay, idempotent=True)
                raise _StepFailed
    source = [await manager.get_effects("src", step) for step in (0, 1)]
    assert [len(records) for records in source] == [1, 1]
    assert await manager.fork_workflow("src", 1, "fork") == 2
    assert [await manager.get_effects("fork", step) for step in (0, 1)] == [[], []]
    async with ResumableWorkflow("fork", manager) as fork:
        assert fork.resume_step == 1
        async with fork.step(1, agent_id="a"):
            assert await fork.effect("pay", pay, idempotent=True) == 3
    assert keys[2] not in keys[:2]
    [record] = await manager.get_effects("fork", 1)
    assert (record.result, record.idempotency_key) == (3, keys[2])
    assert [await manager.get_effects("src", step) for step in (0, 1)] == source
