"""A runner pool sharing a store with the saver: LangGraph threads are not its work.

The saver's records (a thread's namespaces and its pages) are of kind ``langgraph``:
``claim_workflow`` never hands them out, the default listings and ``workflows
--unfinished`` leave them out, and ``workflows`` labels them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import CheckpointManager, RetentionPolicy
from aiocheckpoint.integrations.langgraph import AioCheckpointSaver
from tests.langgraph.conftest import backend_url, open_backend
from tests.langgraph.graphs import loop_graph, loop_input
from tests.pg_support import drop_schema, new_schema_name
from tests.test_cli import cli

LOOP: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": 1000}
#: More messages than a page holds: the thread has a pages workflow too.
STEPS = 70


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    name = new_schema_name()
    yield name
    await drop_schema(name)


@pytest.mark.parametrize("single_writer", [False, True])
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])  # the stores with records
async def test_runners_never_claim_a_langgraph_thread(
    kind: str, single_writer: bool, tmp_path: Path, schema: str
) -> None:
    storage = open_backend(kind, tmp_path, schema)
    async with AioCheckpointSaver(storage, single_writer=single_writer) as saver:
        final = await loop_graph(saver, steps=STEPS).ainvoke(loop_input(), LOOP)
    assert final["count"] == STEPS
    async with CheckpointManager(storage) as pool:
        assert await pool.claim_workflow("runner") is None
        every = await pool.list_workflow_records(kind=None)
        assert {r.workflow_id[:3] for r in every} == {"lg:", "lgp"}  # a thread and its pages
        assert {r.kind for r in every} == {"langgraph"}
        assert await pool.list_workflows("unfinished") == []
        await pool.create_checkpoint("job", 0, "agent", "completed", {"n": 1})
        lease = await pool.claim_workflow("runner")
        assert lease is not None and lease.workflow_id == "job"
        assert await pool.claim_workflow("runner") is None


async def test_workflows_command_labels_threads(tmp_path: Path) -> None:
    url = backend_url("sqlite", tmp_path, "")
    async with AioCheckpointSaver.from_url(url) as saver:
        await loop_graph(saver, steps=3).ainvoke(loop_input(), LOOP)
        await CheckpointManager(saver.manager.storage).create_checkpoint(
            "job", 0, "agent", "completed", {"n": 1}
        )
    unfinished = cli("workflows", url, "--unfinished")
    assert unfinished.code == 0
    assert "job" in unfinished.out and "lg:" not in unfinished.out
    table = cli("workflows", url)
    [row] = [line for line in table.out.splitlines() if line.startswith("lg:")]
    assert "(langgraph)" in row and "unfinished" not in row
    assert not any(len(word) >= 15 and word.isdigit() for word in row.split())
    listed = json.loads(cli("--json", "workflows", url).out)["workflows"]
    kinds = {w["workflow_id"][:3]: w["kind"] for w in listed}
    assert kinds == {"lg:": "langgraph", "job": "workflow"}
    queried = json.loads(cli("--json", "workflows", url, "--status", "unfinished").out)
    assert [w["workflow_id"] for w in queried["workflows"]] == ["job"]


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_sweep_keeps_langgraph_threads_whole(
    kind: str, tmp_path: Path, schema: str
) -> None:
    """Idle TTLs and history rules are the runners' workflows': a thread keeps its pages."""
    storage = open_backend(kind, tmp_path, schema)
    async with AioCheckpointSaver(storage) as saver:
        await loop_graph(saver, steps=STEPS).ainvoke(loop_input(), LOOP)
        pool = CheckpointManager(storage)
        for step in range(3):
            await pool.create_checkpoint("job", step, "agent", "completed", {"n": step})
        policy = RetentionPolicy(keep_last=1, keep_terminal=False, idle_ttl=timedelta(days=1))
        kept = await pool.sweep(policy=policy, now=datetime.now(timezone.utc))
        assert kept.checkpoints_deleted == 2  # the job's history is thinned
        later = datetime.now(timezone.utc) + timedelta(days=2)
        report = await pool.sweep(policy=policy, now=later)
        assert report.workflows_deleted == {"idle": 1}  # the job, not the thread
        assert [w[:3] for w in await pool.list_workflows()] == ["lg:", "lgp"]
        state = await loop_graph(saver, steps=STEPS).aget_state(LOOP)
        assert len(state.values["messages"]) > 64  # every page still reads
    await storage.close()
