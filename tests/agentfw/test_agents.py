"""An agent workflow (``AgentExecutor``s, ``Message``s in their state and in transit) on
``AioCheckpointStorage``, with the framework's agent types registered, against the
framework's ``FileCheckpointStorage``: the same output, and resuming from each checkpoint
gives what resuming from the file storage's gives, on every backend. Without the
registration every checkpoint that holds a ``Message`` is refused (the run goes on): only
the first, taken before any agent ran, is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_framework import FileCheckpointStorage

from aiocheckpoint import CheckpointManager, TypeRegistry
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from tests.backend_support import make_storage

from .agents import AGENTS, agent_types, build_agents, texts


async def resumes(storage: object, ids: list[str]) -> list[list[str]]:
    out = []
    for checkpoint_id in ids:
        result = await build_agents(storage).run(checkpoint_id=checkpoint_id)
        out.append(texts(result.get_outputs()))
    return out


async def test_an_agent_workflow_resumes_as_with_the_framework_file_storage(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    files = FileCheckpointStorage(tmp_path / "reference")
    expected = texts((await build_agents(files).run("hello")).get_outputs())
    assert expected == ["reviewer saw: writer saw: hello"]
    by_iteration = sorted(
        await files.list_checkpoints(workflow_name=AGENTS), key=lambda cp: cp.iteration_count
    )
    expected_resumes = await resumes(files, [cp.checkpoint_id for cp in by_iteration])
    async with make_storage(backend, tmp_path, pg_schema) as store:
        manager = CheckpointManager(store, types=agent_types(TypeRegistry()))
        ours = AioCheckpointStorage(manager)
        assert texts((await build_agents(ours).run("hello")).get_outputs()) == expected
        saved = await ours.list_checkpoints(workflow_name=AGENTS)
        assert [cp.iteration_count for cp in saved] == [cp.iteration_count for cp in by_iteration]
        writer = saved[1].state["_executor_state"]["writer"]
        assert [m.text for m in writer["full_conversation"]] == ["hello", "writer saw: hello"]
        fresh = AioCheckpointStorage(CheckpointManager(store, types=agent_types(TypeRegistry())))
        assert await resumes(fresh, [cp.checkpoint_id for cp in saved]) == expected_resumes


async def test_without_the_registration_only_the_first_is_stored(
    manager: CheckpointManager, caplog: pytest.LogCaptureFixture
) -> None:
    ours = AioCheckpointStorage(manager)
    result = await build_agents(ours).run("hello")
    assert texts(result.get_outputs()) == ["reviewer saw: writer saw: hello"]
    stored = await ours.list_checkpoints(workflow_name=AGENTS)
    assert [cp.iteration_count for cp in stored] == [0]
    assert "AgentExecutorResponse is an Agent Framework object" in caplog.text
