"""A step's arguments are checked before its body runs, and a step whose COMPLETED write
fails leaves no trace in the state: on every backend."""

from __future__ import annotations

from typing import Any

import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointManager,
    CheckpointSerializationError,
    InvalidArgumentError,
    ResumableWorkflow,
)
from aiocheckpoint.storage.base import CheckpointStorage
from tests.backend_support import any_storage, pg_schema

__all__ = ["any_storage", "pg_schema"]


@pytest.fixture
async def manager(any_storage: CheckpointStorage) -> CheckpointManager:
    """A manager on each backend."""
    return CheckpointManager(any_storage)


BAD_STEP_ARGUMENTS: list[dict[str, Any]] = [
    {"step": 0, "agent_id": None},
    {"step": 0, "agent_id": 7},
    {"step": -1, "agent_id": "a"},
    {"step": True, "agent_id": "a"},
    {"step": 0, "agent_id": "a", "metadata": {"handle": object()}},
    {"step": 0, "agent_id": "a", "metadata": {"x": float("nan"), "s": 1j}},
    {"step": 0, "agent_id": "a", "metadata": [("k", "v")]},
]


@pytest.mark.parametrize("arguments", BAD_STEP_ARGUMENTS)
async def test_bad_step_arguments_fail_before_the_body(
    manager: CheckpointManager, arguments: dict[str, Any]
) -> None:
    """A bad agent id, step or metadata raises InvalidArgumentError (or a serialization
    error) on entry: the body never runs and nothing is stored."""
    ran: list[str] = []
    async with ResumableWorkflow("wf", manager) as wf:
        with pytest.raises((InvalidArgumentError, CheckpointSerializationError)):
            async with wf.step(**arguments):
                ran.append("charged the card")
    assert ran == []
    assert await manager.list_checkpoints("wf") == []


async def test_bad_checkpoint_status_is_refused(manager: CheckpointManager) -> None:
    """wf.checkpoint() with an unknown status writes nothing."""
    async with ResumableWorkflow("wf", manager) as wf:
        with pytest.raises(InvalidArgumentError, match="status"):
            await wf.checkpoint(0, "a", "done")
    assert await manager.list_checkpoints("wf") == []


async def test_unstorable_state_rolls_the_step_back(manager: CheckpointManager) -> None:
    """A COMPLETED write refused for the state rolls the state back and records FAILED."""
    async with ResumableWorkflow("wf", manager, {"n": 0}) as wf:
        async with wf.step(0, agent_id="a"):
            wf.state.set("n", 1)
        with pytest.raises(CheckpointSerializationError):
            async with wf.step(1, agent_id="b", metadata={"try": 1}):
                wf.state.set("n", 2)
                wf.state.set("bad", 1j)
        assert wf.state.to_dict() == {"n": 1}
        assert wf.metrics.total_steps == 1
    failed = await manager.get_checkpoint("wf", 1)
    assert failed.status is AgentStatus.FAILED
    assert failed.metadata["try"] == 1
    assert failed.metadata["error"]["type"] == "CheckpointSerializationError"
    assert failed.state_snapshot.data == {"n": 1}
    point = await manager.get_resume_point("wf")
    assert point is not None and point[0] == 1
    async with ResumableWorkflow("wf", manager) as again:
        async with again.step(1, agent_id="b"):
            again.state.set("n", 2)
    assert (await manager.get_checkpoint("wf", 1)).status is AgentStatus.COMPLETED


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"initial_state": [1, 2]}, "initial_state"),
        ({"initial_state": "abc"}, "initial_state"),
        ({"lease": "a lease"}, "lease"),
        ({"lease_owner": ""}, "owner"),
        ({"lease_owner": 5}, "owner"),
        ({"lease_ttl": 0}, "ttl"),
        ({"lease_ttl": -1.0}, "ttl"),
    ],
)
def test_bad_constructor_arguments(arguments: dict[str, Any], match: str) -> None:
    """Every bad constructor argument raises InvalidArgumentError, not a bare TypeError."""
    with pytest.raises(InvalidArgumentError, match=match):
        ResumableWorkflow("wf", CheckpointManager(), **arguments)


def test_constructor_needs_a_manager() -> None:
    """Anything but a CheckpointManager as the manager is refused at once."""
    with pytest.raises(InvalidArgumentError, match="CheckpointManager"):
        ResumableWorkflow("wf", object())  # type: ignore[arg-type]
