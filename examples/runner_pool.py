"""A pool of runner processes sharing workflows through PostgreSQL leases.

Twelve workflows are registered; one "crashed" runner claims the first, completes two of its
steps and dies holding the lease. Three runner processes then pull work with
``claim_workflow``: each workflow is driven by one runner at a time, and the crashed runner's
workflow is taken over once its lease expires, resuming at step 2.

Needs a PostgreSQL server: ``AIOCHECKPOINT_PG_DSN`` (default
postgresql://postgres@127.0.0.1:5432/test). The example works in a schema of its own and
drops it at the end.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import uuid
from concurrent.futures import ProcessPoolExecutor

import asyncpg

from aiocheckpoint import CheckpointManager, ResumableWorkflow
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage

DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
WORKFLOWS = 12
STEPS = 5
TTL = 1.0  # seconds; short so the example is quick (the default is 30)


def open_manager(schema: str) -> CheckpointManager:
    return CheckpointManager(PostgresCheckpointStorage(DSN, schema=schema, max_size=2))


async def run_steps(wf: ResumableWorkflow, runner: str) -> None:
    for step in range(STEPS):
        if wf.is_completed(step):
            continue
        async with wf.step(step, agent_id=runner):
            await asyncio.sleep(0.01)  # the agent's work (make real steps idempotent)
            wf.state.set(f"step{step}", runner)


async def runner_loop(schema: str, runner: str) -> list[str]:
    """Claim, drive, repeat, until no unfinished workflow is left; return what was done."""
    done: list[str] = []
    async with open_manager(schema) as manager:
        while True:
            lease = await manager.claim_workflow(runner, ttl=TTL)
            if lease is None:
                if not await manager.list_workflows(status="unfinished"):
                    return done
                await asyncio.sleep(0.1)  # the rest are leased: wait for them to end or expire
                continue
            async with ResumableWorkflow(
                lease.workflow_id, manager, lease=lease, lease_ttl=TTL
            ) as wf:
                resumed_at = wf.resume_step
                await run_steps(wf, runner)
            note = f" (taken over, resumed at step {resumed_at})" if resumed_at else ""
            done.append(lease.workflow_id + note)


def runner_process(schema: str, runner: str) -> list[str]:
    return asyncio.run(runner_loop(schema, runner))


async def prepare(schema: str) -> None:
    async with open_manager(schema) as manager:
        for n in range(WORKFLOWS):
            await manager.register_workflow(f"order-{n:02}")
        lease = await manager.claim_workflow("crashed-runner", ttl=TTL)
        assert lease is not None
        state: dict[str, str] = {}
        for step in range(2):
            state[f"step{step}"] = "crashed-runner"
            await manager.create_checkpoint(
                lease.workflow_id, step, "crashed-runner", "completed", state, lease=lease
            )
        print(f"crashed-runner: claimed {lease.workflow_id}, did steps 0-1, died holding it")


async def report(schema: str) -> None:
    async with open_manager(schema) as manager:
        records = await manager.list_workflow_records()
        finished = [r.workflow_id for r in records if r.status == "finished"]
        print(f"{len(finished)} of {len(records)} workflows finished")
        assert len(finished) == WORKFLOWS
        latest = await manager.get_latest_checkpoint("order-00")
        assert latest is not None
        print(f"order-00 steps were run by: {latest.state_snapshot.data}")


async def drop(schema: str) -> None:
    con = await asyncpg.connect(DSN)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()


def main() -> None:
    schema = f"runner_pool_example_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(prepare(schema))
        runners = [f"runner-{n}" for n in range(3)]
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(len(runners), mp_context=spawn) as pool:
            results = pool.map(runner_process, [schema] * len(runners), runners)
            for runner, done in zip(runners, results, strict=True):
                print(f"{runner} finished {len(done)}: {', '.join(done) or '-'}")
        asyncio.run(report(schema))
    finally:
        asyncio.run(drop(schema))


if __name__ == "__main__":
    main()
