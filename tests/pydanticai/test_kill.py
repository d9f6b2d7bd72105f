"""pydantic-ai runs SIGKILLed at random points, resumed by new processes (file, SQLite,
PostgreSQL: every durable backend).

The parent forks a child per attempt; each child finishes the started runs and starts new
ones until it SIGKILLs itself (tests/pydanticai/_kill_child.py lists the points). After
``KILLS`` killed children and a final clean pass, every run is finished and:

* its output is the output of the same run made without interruption;
* no tool call and no model request whose result was recorded ran again: a call logged
  twice was the last thing its first process did (it died inside it), and the non-idempotent
  ``book`` ran once per call (left in doubt, it was settled, never silently re-run);
* every unit's journal record is done, and nothing is in doubt.

``AIOCHECKPOINT_PYDANTIC_AI_KILLS`` sets the number of kills per backend (default 50).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, CheckpointStorage, EffectState
from aiocheckpoint.integrations.pydantic_ai import AioCheckpointDurability
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests._effect_kill import CallLog
from tests.pg_support import DSN, drop_schema, new_schema_name
from tests.pydanticai import _kill_child as kill
from tests.pydanticai.agents import build_agent, expected_output, prompt_for
from tests.test_effects_kill import fork

KILLS = int(os.environ.get("AIOCHECKPOINT_PYDANTIC_AI_KILLS", "50"))
#: The chance of dying at each kill point (a run has ~40): most runs die once or twice.
P_KILL = 0.03
#: The timer kill falls in a child's first this many seconds.
TIMER_S = 0.4

Open = Callable[[], CheckpointStorage]


@pytest.fixture(params=["file", "sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """Opens a new storage object on one durable store (in the child that calls it)."""
    schema = new_schema_name()
    opener: Open
    if request.param == "file":
        opener = lambda: FileCheckpointStorage(tmp_path / "runs")  # noqa: E731
    elif request.param == "sqlite":
        opener = lambda: SQLiteCheckpointStorage(tmp_path / "runs.db")  # noqa: E731
    else:
        opener = lambda: PostgresCheckpointStorage(DSN, schema=schema, max_size=2)  # noqa: E731
    yield opener
    if request.param == "postgres":
        asyncio.run(drop_schema(schema))


def run_child(open_store: Open, log: Path, seed: int, p: float) -> int:
    """Fork a child that makes the runs; return its wait status."""
    pid = fork(lambda: kill.child(open_store, log, seed, p, TIMER_S))
    return os.waitpid(pid, 0)[1]


@pytest.mark.slow
def test_runs_killed_at_random_points_finish_as_uninterrupted(
    open_store: Open, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    for seed in range(KILLS):
        status = run_child(open_store, log, seed, P_KILL)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert run_child(open_store, log, -1, 0.0) == 0  # the final pass finishes them all
    lines = CallLog(log).lines()
    check_no_rerun(lines)
    runs = asyncio.run(check_runs(open_store, log, tmp_path))
    assert runs >= 2, runs


def check_no_rerun(lines: list[list[str]]) -> None:
    """A call logged again was its first process's last action; ``book`` ran once per call."""
    last_of_pid = {line[-1]: i for i, line in enumerate(lines)}
    seen: dict[tuple[str, ...], list[int]] = {}
    for i, line in enumerate(lines):
        seen.setdefault(tuple(line[:-1]), []).append(i)
    for call, where in seen.items():
        if call[1] == "tool" and call[2] == "book":
            assert len(where) == 1, (call, where)
        for i in where[:-1]:
            later = lines[i + 1 : last_of_pid[lines[i][-1]] + 1]
            mine = [other for other in later if other[-1] == lines[i][-1]]
            # Only the parallel sibling lookup may follow: nothing after the unit finished.
            assert all(other[1:3] == ["tool", "lookup"] for other in mine), (call, mine)


async def check_runs(open_store: Open, log: Path, tmp_path: Path) -> int:
    """Every started run: finished, as uninterrupted, all done; replayed, it calls nothing."""
    async with CheckpointManager(open_store()) as manager:
        runs = await manager.list_workflows()
        for workflow_id in runs:
            point = await manager.get_resume_point(workflow_id)
            assert point is not None and point[0] == 1, workflow_id
            assert point[1].data["output"] == await uninterrupted(workflow_id, tmp_path)
            records = await manager.get_effects(workflow_id, 0)
            assert all(r.state is EffectState.DONE for r in records), workflow_id
            models = sorted(r.key for r in records if ".request/" in r.key)
            assert models == [f"planner__model.request/{n}" for n in range(3)]
        assert await manager.list_in_doubt_workflows() == []
        before = CallLog(log).lines()
        durability = AioCheckpointDurability[None](manager)
        agent = build_agent(durability, CallLog(log))
        for workflow_id in runs:
            result = await durability.resume(agent, workflow_id)
            assert result.output == expected_output(workflow_id)
        assert CallLog(log).lines() == before
        counted = Counter(line[0] for line in before)
        assert set(counted) == set(runs)
    return len(runs)


async def uninterrupted(workflow_id: str, tmp_path: Path) -> str:
    """The output of the run made once, without a crash, in memory."""
    durability = AioCheckpointDurability[None](CheckpointManager())
    agent = build_agent(durability, CallLog(tmp_path / "uninterrupted.log"))
    result = await durability.run(agent, prompt_for(workflow_id), workflow_id=workflow_id)
    return result.output
