"""Real agent runs with the SDK's ``Runner`` and a scripted offline model.

The session carries the conversation from one run to the next (on every backend, plain and
encrypted); a run interrupted for a tool's approval is saved with :class:`RunStateStore`,
loaded by a new manager and finished, the tool running once, after its approval; a state
changed, moved or forged in the store is refused before the SDK parses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointNotFoundError,
    DecryptionError,
    PlaintextRecordError,
)
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession, RunStateStore
from tests.backend_support import make_storage
from tests.integrations.managers import keyring

from .models import ScriptedModel, call, text


def contents(items: list[Any]) -> list[Any]:
    out = []
    for item in items:
        content = item.get("content")
        out.append(content if isinstance(content, str) else content[0]["text"])
    return out


async def test_the_session_carries_the_conversation(manager: CheckpointManager) -> None:
    model = ScriptedModel([[text("hello")], [text("bye")]])
    agent = Agent(name="a", instructions="be brief", model=model)
    session = AioCheckpointSession("chat", manager)
    first = await Runner.run(agent, "hi", session=session)
    assert first.final_output == "hello"
    second = await Runner.run(agent, "again", session=AioCheckpointSession("chat", manager))
    assert second.final_output == "bye"
    # The model saw the first turn, read back from the store, before the new input.
    assert contents(model.inputs[1]) == ["hi", "hello", "again"]
    assert contents(await session.get_items()) == ["hi", "hello", "again", "bye"]


def approval_agent(turns: list[list[Any]], calls: list[str]) -> Agent[Any]:
    @function_tool(needs_approval=True)
    def transfer(amount: int) -> str:
        """Move money."""
        calls.append(f"transfer {amount}")
        return "sent"

    return Agent(name="bank", model=ScriptedModel(turns), tools=[transfer])


async def test_an_interrupted_run_resumes_from_its_saved_state(
    backend: str, sealed: bool, tmp_path: Path, pg_schema: str
) -> None:
    keys = keyring() if sealed else None
    calls: list[str] = []
    agent = approval_agent([[call("transfer", {"amount": 5}, "c1")]], calls)
    storage = make_storage(backend, tmp_path, pg_schema)
    try:
        manager = CheckpointManager(storage, encryption=keys)
        result = await Runner.run(agent, "pay 5", session=AioCheckpointSession("chat", manager))
        assert [item.tool_name for item in result.interruptions] == ["transfer"]
        await RunStateStore(manager).save("run-1", result.to_state())
        assert calls == []
        if backend != "memory":  # the same store, opened again (as another process would)
            await storage.close()
            storage = make_storage(backend, tmp_path, pg_schema)
        agent = approval_agent([[text("paid")]], calls)
        manager = CheckpointManager(storage, encryption=keys)
        store = RunStateStore(manager)
        state = await store.load("run-1", agent)
        for interruption in state.get_interruptions():
            state.approve(interruption)
        session = AioCheckpointSession("chat", manager)
        result = await Runner.run(agent, state, session=session)
        assert result.final_output == "paid"
        assert await store.delete("run-1")
        assert not await store.exists("run-1")
        items = await session.get_items()
    finally:
        await storage.close()
    assert calls == ["transfer 5"]
    assert [item.get("type") for item in items][-3:] == [
        "function_call",
        "function_call_output",
        "message",
    ]


async def saved_state(manager: CheckpointManager, run_id: str) -> None:
    agent = approval_agent([[call("transfer", {"amount": 5}, "c1")]], [])
    result = await Runner.run(agent, "pay 5")
    await RunStateStore(manager).save(run_id, result.to_state())


async def test_a_changed_state_is_refused(manager: CheckpointManager, sealed: bool) -> None:
    store = RunStateStore(manager)
    await saved_state(manager, "run-1")
    workflow_id = store.workflow_id("run-1")
    stored = await manager.storage.load(workflow_id, 0)
    assert stored is not None
    data = bytearray(stored.data)
    data[len(data) // 2] ^= 0x01
    await manager.storage.save(workflow_id, 0, bytes(data))
    with pytest.raises(CheckpointCorruptedError) as raised:
        await store.load("run-1", approval_agent([], []))
    assert isinstance(raised.value, DecryptionError) == sealed


async def test_a_missing_state_is_not_found(manager: CheckpointManager) -> None:
    with pytest.raises(CheckpointNotFoundError):
        await RunStateStore(manager).load("nope", approval_agent([], []))


async def test_sealed_states_refuse_moves_and_forgeries(tmp_path: Path) -> None:
    storage = make_storage("sqlite", tmp_path, "")
    async with storage, CheckpointManager(storage, encryption=keyring()) as manager:
        store = RunStateStore(manager)
        await saved_state(manager, "run-1")
        await saved_state(manager, "run-2")
        # run-2's sealed record copied over run-1's: bound to run-2's workflow, refused.
        moved = await storage.load(store.workflow_id("run-2"), 0)
        assert moved is not None
        await storage.save(store.workflow_id("run-1"), 0, moved.data)
        with pytest.raises(DecryptionError):
            await store.load("run-1", approval_agent([], []))
        # A plaintext state written by someone without the key: refused, never parsed.
        plain = CheckpointManager(storage)
        await saved_state(plain, "run-2")
        with pytest.raises(PlaintextRecordError):
            await store.load("run-2", approval_agent([], []))
