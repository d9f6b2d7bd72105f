"""Runner processes sharing one store, some SIGKILLed part way: every workflow still finishes,
whole, and no step is ever executed by two runners at the same time.

Each runner process (tests/_runner_pool_child.py) loops claim -> ResumableWorkflow(lease=...)
-> steps, logging every step execution's start and end. Two of four runners are killed with
SIGKILL once about a third of the steps are done, and a replacement starts; the survivors
take the dead runners' workflows over after their leases expire (TTL 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from aiocheckpoint import AgentStatus, CheckpointManager, WorkflowStatus
from aiocheckpoint.storage.base import WorkflowStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("_runner_pool_child.py")
WORKFLOWS = 200
STEPS = 10
RUNNERS = 4
TASKS_PER_RUNNER = 3
TTL = 2.0
KILL_AFTER_STEPS = WORKFLOWS * STEPS // 3


@dataclass
class Execution:
    id: str
    runner: str
    wf: str
    step: int
    start: float
    end: float | None = None


@dataclass
class Pool:
    backend: str
    location: str
    storage: WorkflowStorage


@pytest.fixture(params=["postgres", "sqlite"])
async def pool(
    request: pytest.FixtureRequest, pg_schema: str, tmp_path: Path
) -> AsyncIterator[Pool]:
    """A store (a PostgreSQL schema or an SQLite file) holding the registered workflows."""
    storage: WorkflowStorage
    if request.param == "postgres":
        location = pg_schema
        storage = PostgresCheckpointStorage(DSN, schema=pg_schema)
    else:
        location = str(tmp_path / "pool.db")
        storage = SQLiteCheckpointStorage(location)
    manager = CheckpointManager(storage)
    for n in range(WORKFLOWS):
        await manager.register_workflow(f"wf-{n:03}")
    yield Pool(request.param, location, storage)
    await storage.close()


def spawn(pool: Pool, runner: str, log_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    args = [pool.backend, pool.location, runner, str(log_dir), str(TTL), str(TASKS_PER_RUNNER)]
    return subprocess.Popen([sys.executable, str(CHILD), *args], env=env)


async def steps_done(storage: WorkflowStorage) -> int:
    """How many step checkpoints exist (cheap enough for 200 workflows)."""
    counts = await asyncio.gather(
        *(storage.scan(f"wf-{n:03}") for n in range(WORKFLOWS)), return_exceptions=False
    )
    return sum(len(c) for c in counts)


def ready(log_dir: Path, runner: str) -> bool:
    """Whether ``runner`` has started and waits for the others (its first line)."""
    path = log_dir / f"{runner}.jsonl"
    return path.exists() and b'"ready"' in path.read_bytes()


def mid_workflow(log_dir: Path, runner: str) -> bool:
    """Whether ``runner`` is inside a workflow it has checkpointed a step of: it has ended two
    of its steps (so the first is checkpointed) but not its last. Killed now, it leaves work
    that another runner must take over."""
    path = log_dir / f"{runner}.jsonl"
    if not path.exists():
        return False
    ended: dict[str, set[int]] = defaultdict(set)
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # the line being written may be partial
            event = json.loads(line)
            if event["event"] == "end":
                ended[event["wf"]].add(event["step"])
    return any(len(steps) >= 2 and STEPS - 1 not in steps for steps in ended.values())


def read_logs(log_dir: Path, ends: dict[str, float]) -> dict[str, Execution]:
    """Every execution, by id. One without an end line ends when its runner died or exited."""
    executions: dict[str, Execution] = {}
    for path in log_dir.glob("*.jsonl"):
        runner = path.stem
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "start":
                executions[event["id"]] = Execution(
                    event["id"], runner, event["wf"], event["step"], event["t"]
                )
            elif event["event"] == "end":
                executions[event["id"]].end = event["t"]
    for execution in executions.values():
        if execution.end is None:
            execution.end = ends[execution.runner]
    return executions


@pytest.mark.slow  # a kill loop or a decoding bomb: the slow tier
async def test_killed_runners_work_is_finished_by_the_others(pool: Pool, tmp_path: Path) -> None:
    """With 2 of 4 runners SIGKILLed mid-run, all 200 workflows finish with all 10 steps, and
    no two runners ever execute the same step at overlapping times."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    procs = {f"r{n}": spawn(pool, f"r{n}", log_dir) for n in range(RUNNERS)}
    ends: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while not all(ready(log_dir, runner) for runner in procs):
        assert time.monotonic() < deadline, "the runners did not start"
        assert all(p.poll() is None for p in procs.values()), "a runner exited early"
        await asyncio.sleep(0.05)
    (log_dir / "go").touch()
    # Kill once a third of the work is done and each victim is inside a workflow (on a loaded
    # machine one runner may start late, and the others may have done all the work so far).
    while await steps_done(pool.storage) < KILL_AFTER_STEPS or not all(
        mid_workflow(log_dir, victim) for victim in ("r0", "r1")
    ):
        assert time.monotonic() < deadline, "the runners made no progress"
        assert all(p.poll() is None for p in procs.values()), "a runner exited early"
        await asyncio.sleep(0.1)
    for victim in ("r0", "r1"):
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        ends[victim] = time.time()  # it is dead: none of its executions runs past this
    procs["r4"] = spawn(pool, "r4", log_dir)
    for runner, proc in procs.items():
        if runner not in ends:
            assert await asyncio.to_thread(proc.wait, 120) == 0
            ends[runner] = time.time()

    # Every workflow finished, with every step's checkpoint COMPLETED.
    manager = CheckpointManager(pool.storage)
    records = await manager.list_workflow_records()
    assert len(records) == WORKFLOWS
    assert {r.status for r in records} == {WorkflowStatus.FINISHED}
    executions = read_logs(log_dir, ends)
    accepted: dict[str, list[Execution]] = defaultdict(list)
    for n in range(WORKFLOWS):
        wf = f"wf-{n:03}"
        checkpoints = await manager.list_checkpoints(wf)
        assert [c.step for c in checkpoints] == list(range(STEPS))
        for checkpoint in checkpoints:
            assert checkpoint.status is AgentStatus.COMPLETED
            execution = executions[checkpoint.metadata["execution"]]
            assert (execution.wf, execution.step) == (wf, checkpoint.step)
            assert execution.runner == checkpoint.agent_id
            accepted[wf].append(execution)

    # The accepted executions of each workflow ran one after another.
    for runs in accepted.values():
        for before, after in pairwise(runs):
            assert before.end is not None and before.end <= after.start

    # No step ran in two runners at once, accepted or not (a killed runner's last step ends at
    # its death; it may be repeated, but only after its lease expired).
    by_step: dict[tuple[str, int], list[Execution]] = defaultdict(list)
    for execution in executions.values():
        by_step[execution.wf, execution.step].append(execution)
    repeated = 0
    for runs in by_step.values():
        runs.sort(key=lambda e: e.start)
        repeated += len(runs) - 1
        for before, after in pairwise(runs):
            assert before.end is not None and before.end <= after.start, (before, after)

    # The kills really interrupted work that others then took over.
    taken_over = [wf for wf, runs in accepted.items() if len({e.runner for e in runs}) > 1]
    assert taken_over
    assert any(e.runner in ("r0", "r1") for runs in accepted.values() for e in runs)
    print(
        f"{pool.backend}: {len(executions)} step executions, {repeated} repeated after a kill, "
        f"{len(taken_over)} workflows taken over"
    )
