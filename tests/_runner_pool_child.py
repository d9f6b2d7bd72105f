"""One runner process of the runner-pool test (tests/test_runner_pool.py).

Usage: python tests/_runner_pool_child.py BACKEND LOCATION RUNNER_ID LOG_DIR TTL TASKS

BACKEND is ``postgres`` (LOCATION: the schema, on ``AIOCHECKPOINT_PG_DSN``) or ``sqlite``
(LOCATION: the database file). The runner drives TASKS workflows at a time, each claimed with
``claim_workflow`` and run under its lease, until no unfinished workflow is left. Every step
execution appends a ``start`` and an ``end`` line (JSON: execution id, workflow, step, token,
time) to LOG_DIR/RUNNER_ID.jsonl; ``end`` is written when the step's work is done, before its
checkpoint. The lines are written with O_APPEND, so a SIGKILL loses none that were written.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from typing import Any

from aiocheckpoint import CheckpointManager, LeaseLostError, ResumableWorkflow
from aiocheckpoint.storage.base import WorkflowStorage

STEPS = 10
DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def open_storage(backend: str, location: str) -> WorkflowStorage:
    if backend == "postgres":
        from aiocheckpoint.storage.postgres import PostgresCheckpointStorage

        return PostgresCheckpointStorage(DSN, schema=location, max_size=4)
    from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

    return SQLiteCheckpointStorage(location, busy_timeout=30.0)


class Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, **fields: Any) -> None:
        os.write(self.fd, (json.dumps({**fields, "t": time.time()}) + "\n").encode())


async def drive(manager: CheckpointManager, runner: str, ttl: float, log: Log, ids: Any) -> None:
    while True:
        lease = await manager.claim_workflow(runner, ttl=ttl)
        if lease is None:
            if not await manager.list_workflows(status="unfinished"):
                return
            await asyncio.sleep(0.1)  # the rest are leased: wait for them to end or expire
            continue
        try:
            async with ResumableWorkflow(
                lease.workflow_id, manager, lease=lease, lease_ttl=ttl
            ) as wf:
                for step in range(STEPS):
                    if wf.is_completed(step):
                        continue
                    execution = f"{runner}#{next(ids)}"
                    common = {"id": execution, "wf": lease.workflow_id, "step": step}
                    async with wf.step(step, agent_id=runner, metadata={"execution": execution}):
                        log.write(event="start", token=lease.token, **common)
                        await asyncio.sleep(0.004)  # the step's "work"
                        wf.state.set(f"step{step}", runner)
                        log.write(event="end", **common)
        except LeaseLostError:
            log.write(event="lost", wf=lease.workflow_id, token=lease.token)


async def main(
    backend: str, location: str, runner: str, log_dir: str, ttl: float, tasks: int
) -> None:
    log = Log(os.path.join(log_dir, f"{runner}.jsonl"))
    ids = itertools.count()
    async with CheckpointManager(open_storage(backend, location)) as manager:
        await asyncio.gather(*(drive(manager, runner, ttl, log, ids) for _ in range(tasks)))
    log.write(event="exit")


def wait_for_go(log_dir: str, runner: str) -> None:
    """Say ready, then wait for the test's go: on a loaded machine a runner slow to import
    would otherwise find the work done by the others before it took any."""
    Log(os.path.join(log_dir, f"{runner}.jsonl")).write(event="ready")
    while not os.path.exists(os.path.join(log_dir, "go")):
        time.sleep(0.01)


if __name__ == "__main__":
    backend, location, runner, log_dir, ttl, tasks = sys.argv[1:]
    wait_for_go(log_dir, runner)
    asyncio.run(main(backend, location, runner, log_dir, float(ttl), int(tasks)))
