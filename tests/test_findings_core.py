"""Behaviour found while writing the user guide, fixed since: kept as regression tests."""

from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    CheckpointSerializationError,
    InvalidArgumentError,
    ResumableWorkflow,
    SharedState,
)


@pytest.fixture
async def manager() -> Any:
    async with CheckpointManager() as m:
        yield m


@pytest.mark.parametrize(
    ("state", "path"),
    [({"a": ["ok", "\ud800"]}, "state.a[1]"), ({"k": {"\udfff": 1}}, "state.k['\\udfff']")],
)
async def test_lone_surrogate_error_names_its_path(
    manager: CheckpointManager, state: dict[str, Any], path: str
) -> None:
    """A string that is not valid Unicode is refused with the path of the offending value."""
    with pytest.raises(CheckpointSerializationError) as info:
        await manager.create_checkpoint("wf", 0, "agent", "completed", state)
    assert info.value.path == path


async def test_agent_id_that_is_not_valid_unicode_is_an_invalid_argument(
    manager: CheckpointManager,
) -> None:
    """An agent id that cannot be encoded is a bad argument, like a bad workflow id."""
    with pytest.raises(InvalidArgumentError):
        await manager.create_checkpoint("wf", 0, "\ud800", "completed", {})


def test_snapshot_version_is_not_an_alias_of_the_history() -> None:
    """Mutating a snapshot's version metadata never changes the state's history."""
    state = SharedState()
    state.set("a", 1)
    state.snapshot().version.changed_fields.append("not a change")
    state.get_versions()[0].changed_fields.append("nor this")
    assert state.get_versions()[0].changed_fields == ["a"]


def test_empty_update_and_merge_make_no_version() -> None:
    """A no-op update or merge leaves the version as it was, like a delete that finds nothing."""
    state = SharedState({"a": 1})
    state.update({})
    state.merge({})
    assert state.version == 0


async def test_retry_after_failure_starts_from_the_state_before_the_step(
    manager: CheckpointManager,
) -> None:
    """A failed step's partial state changes are not what the resumed retry starts from."""
    wf = ResumableWorkflow("wf", manager, initial_state={"log": []})
    async with wf.step(0, agent_id="a"):
        wf.state.set("log", ["step 0"])
    with pytest.raises(RuntimeError):
        async with wf.step(1, agent_id="a"):
            wf.state.set("log", [*wf.state.get("log"), "half of step 1"])
            raise RuntimeError("tool failed")
    again = ResumableWorkflow("wf", manager)
    assert await again.try_resume() == 1
    assert again.state.get("log") == ["step 0"]
