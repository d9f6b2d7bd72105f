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

from aiocheckpoint import CheckpointManager, RetentionPolicy, open_storage
from aiocheckpoint.integrations.langgraph import AioCheckpointSaver
from tests.langgraph.conftest import backend_url, open_backend
from tests.langgraph.graphs import loop_graph, loop_input
from tests.pg_support import drop_schema, new_schema_name
from tests.test_cli import NewStore, cli, new_store

__all__ = ["new_store"]

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


async def threads_and_a_job(url: str) -> None:
    """A LangGraph thread (its namespace and pages: kind langgraph) and a runner's job."""
    async with AioCheckpointSaver.from_url(url) as saver:
        await loop_graph(saver, steps=STEPS).ainvoke(loop_input(), LOOP)
        await CheckpointManager(saver.manager.storage).create_checkpoint(
            "job", 0, "agent", "completed", {"n": 1}
        )


async def assert_kinds_kept(url: str) -> None:
    """At ``url`` the thread's records are langgraph ones: a pool claims the job only."""
    async with AioCheckpointSaver.from_url(url) as saver:
        pool = CheckpointManager(saver.manager.storage)
        every = await pool.list_workflow_records(kind=None)
        kinds = {r.workflow_id[:3]: r.kind for r in every}
        assert kinds == {"lg:": "langgraph", "lgp": "langgraph", "job": "workflow"}
        lease = await pool.claim_workflow("runner")
        assert lease is not None and lease.workflow_id == "job"
        assert await pool.claim_workflow("runner") is None
        state = await loop_graph(saver, steps=STEPS).aget_state(LOOP)
        assert len(state.values["messages"]) > 64  # the thread reads whole there


async def test_copy_and_export_import_keep_a_threads_kind(
    new_store: NewStore, tmp_path: Path
) -> None:
    """SQLite -> PostgreSQL by copy and by export/import: runners there never claim a
    thread's records, as runners at the source never did."""
    src = new_store("sqlite")
    await threads_and_a_job(src)
    copied = new_store("postgres")
    result = cli("copy", src, copied)
    assert result.code == 0, result.err
    await assert_kinds_kept(copied)
    export = tmp_path / "lg.jsonl"
    assert cli("export", src, str(export)).code == 0
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    kinds = {w["workflow_id"][:3]: w["kind"] for w in lines if w.get("type") == "workflow"}
    assert kinds == {"lg:": "langgraph", "lgp": "langgraph", "job": "workflow"}
    imported = new_store("postgres")
    result = cli("import", str(export), imported)
    assert result.code == 0, result.err
    await assert_kinds_kept(imported)


@pytest.mark.parametrize(
    "bad", ["Langgraph", "lang graph", "x" * 33, "lg\u202e", "", 7, None, ["langgraph"]]
)
async def test_import_refuses_a_workflow_line_of_no_kind(
    bad: object, new_store: NewStore, tmp_path: Path
) -> None:
    """A kind the kind check refuses is a bad line: listed, never stored."""
    src = new_store("sqlite")
    await threads_and_a_job(src)
    export = tmp_path / "lg.jsonl"
    assert cli("export", src, str(export)).code == 0
    lines = export.read_text().splitlines()
    [n] = [i for i, line in enumerate(lines) if '"type":"workflow"' in line and "lg:" in line]
    line = json.loads(lines[n])
    line["kind"] = bad
    lines[n] = json.dumps(line)
    export.write_text("\n".join(lines) + "\n")
    dst = new_store("postgres")
    result = cli("--json", "import", str(export), dst)
    assert result.code == 1, result.err
    report = result.json()
    assert isinstance(report, dict)
    [problem] = report["corrupted"]
    assert problem["line"] == n + 1 and problem["reason"].startswith("not a workflow kind: ")
    async with CheckpointManager(open_storage(dst)) as m:
        kinds = {r.workflow_id[:3]: r.kind for r in await m.list_workflow_records(kind=None)}
    assert set(kinds.values()) <= {"langgraph", "workflow"}
    assert kinds["lgp"] == "langgraph" and kinds["job"] == "workflow"


async def test_an_export_without_kinds_imports_workflow_records(
    new_store: NewStore, tmp_path: Path
) -> None:
    """A version-2 export written before workflow lines had a kind: every record is a
    ``workflow`` one, as it was."""
    src = new_store("sqlite")
    await threads_and_a_job(src)
    export = tmp_path / "lg.jsonl"
    assert cli("export", src, str(export)).code == 0
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    for line in lines:
        line.pop("kind", None)
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    dst = new_store("sqlite")
    result = cli("import", str(export), dst)
    assert result.code == 0, result.err
    async with CheckpointManager(open_storage(dst)) as m:
        records = await m.list_workflow_records(kind=None)
    assert len(records) == 3 and {r.kind for r in records} == {"workflow"}
