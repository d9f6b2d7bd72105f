"""``CheckpointManager.save_owned``: a state handed over is stored as create_checkpoint would."""

from typing import Any

import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointManager,
    InvalidArgumentError,
    InvalidStepError,
    InvalidWorkflowIdError,
    Keyring,
    StorageClosedError,
)


@pytest.fixture
async def manager() -> Any:
    async with CheckpointManager() as m:
        yield m


@pytest.mark.parametrize(
    "state",
    [
        {"a": "text", "n": 3, "items": ["x", {"y": None, "z": True}]},
        {"$tag": "looks like a tag"},  # escaped, through create_checkpoint's path
        {"nested": {"$dt": "2024-01-01"}},
        {"big": 2**70},  # beyond 64 bits: the exact encoder
        {"lone": "\ud800"},  # not UTF-8: create_checkpoint's path names it
    ],
)
async def test_reads_back_as_create_checkpoint_stores(
    manager: CheckpointManager, state: Any
) -> None:
    """Whatever the state, save_owned stores what create_checkpoint stores (or refuses it)."""
    try:
        expected = await manager.create_checkpoint("wf-a", 1, "agent", "completed", state)
    except Exception as exc:
        with pytest.raises(type(exc)):
            await manager.save_owned("wf-b", 1, "agent", state, {"k": "v"})
        assert await manager.get_latest_checkpoint("wf-b") is None
        return
    await manager.save_owned("wf-b", 1, "agent", state, {"k": "v"})
    got = await manager.get_checkpoint("wf-b", 1)
    assert got.state_snapshot.data == expected.state_snapshot.data == state
    assert (got.status, got.agent_id, got.metadata) == (AgentStatus.COMPLETED, "agent", {"k": "v"})


async def test_checks_the_id_and_step(manager: CheckpointManager) -> None:
    """A bad workflow id or step is refused before anything is written."""
    with pytest.raises(InvalidWorkflowIdError):
        await manager.save_owned("", 1, "agent", {}, {})
    with pytest.raises(InvalidStepError):
        await manager.save_owned("wf", -1, "agent", {}, {})
    await manager.close()
    with pytest.raises(StorageClosedError):
        await manager.save_owned("wf", 1, "agent", {}, {})


async def test_sealed_when_the_manager_seals() -> None:
    """With encryption the stored record is sealed, and reads back."""
    keys = Keyring(keys={"k1": bytes(range(32))}, primary="k1")
    async with CheckpointManager(encryption=keys) as manager:
        await manager.save_owned("wf", 2, "agent", {"secret": "plain text"}, {})
        stored = await manager.storage.load("wf", 2)
        assert stored is not None and b"plain text" not in stored.data
        got = await manager.get_checkpoint("wf", 2)
        assert got.state_snapshot.data == {"secret": "plain text"}


async def test_checks_the_agent_id(manager: CheckpointManager) -> None:
    """An agent id that is not text is refused as create_checkpoint refuses it."""
    with pytest.raises(InvalidArgumentError):
        await manager.save_owned("wf", 1, ["agent"], {}, {})  # type: ignore[arg-type]
    assert await manager.get_latest_checkpoint("wf") is None
