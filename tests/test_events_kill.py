"""A workflow's event history when its runner is SIGKILLed right after each change.

Each run is a forked child that drives the workflow one change further (a pause, a failed
run with a retry, a step left half done under a lease, the finish) and SIGKILLs itself at
once, before its next step: the change and its event are durable together, and each
change's event is there exactly once, in order, with its data, whatever run wrote it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    CheckpointStorage,
    ResumableWorkflow,
    RetryPolicy,
)
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN, drop_schema, new_schema_name

Open = Callable[[], CheckpointStorage]
#: The lease of the runner killed mid-step: short, so the next runner takes it over.
TTL = 0.5


class Boom(RuntimeError):
    """The failure of step 1's first run after the resume."""


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """Opens a new storage object on one durable store with events."""
    schema = new_schema_name()
    opener: Open
    if request.param == "sqlite":
        opener = lambda: SQLiteCheckpointStorage(tmp_path / "ev.db")  # noqa: E731
    else:
        opener = lambda: PostgresCheckpointStorage(DSN, schema=schema, max_size=2)  # noqa: E731
    yield opener
    if request.param == "postgres":
        asyncio.run(drop_schema(schema))


def in_child(open_store: Open, stage: str) -> int:
    """Fork a child that runs ``stage`` and SIGKILLs itself after it; its wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            asyncio.run(drive(open_store, stage))
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


async def drive(open_store: Open, stage: str) -> None:
    """One runner's part; it returns right after its change is written (then dies)."""
    manager = CheckpointManager(open_store())
    owner = f"runner-{stage}"
    lease = None if stage == "pause" else await manager.claim_workflow(owner, TTL)
    assert stage == "pause" or lease is not None, stage
    policy = RetryPolicy(max_attempts=2, backoff=0)
    try:
        leased: dict[str, Any] = {"lease": lease} if lease else {"lease_owner": owner}
        async with ResumableWorkflow("wf", manager, lease_ttl=TTL, retry=policy, **leased) as wf:
            if wf.resume_step <= 0:
                async with wf.step(0, agent_id="a"):
                    pass
            if wf.resume_step <= 1:
                async with wf.step(1, agent_id="approver"):
                    if stage == "pause":
                        await wf.pause("needs approval", {"amount": 5})
                    if stage == "fail":
                        raise Boom("card declined")
            async with wf.step(2, agent_id="b"):
                if stage == "stall":
                    os.kill(os.getpid(), signal.SIGKILL)  # mid-step, the lease held
    except Boom:
        pass  # recorded: step_failed and retry_scheduled


async def events(open_store: Open) -> list[tuple[str, int | None, int | None, dict[str, Any]]]:
    """The workflow's events as (kind, step, attempt, data)."""
    async with CheckpointManager(open_store()) as manager:
        return [(str(e.kind), e.step, e.attempt, e.data) for e in await manager.get_events("wf")]


async def resume(open_store: Open) -> None:
    """The operator's resume, from the parent."""
    async with CheckpointManager(open_store()) as manager:
        await manager.resume_workflow("wf", {"approved": True})


def killed(status: int) -> bool:
    """Whether a child's wait status says SIGKILL."""
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.slow
def test_each_change_has_its_event_once_after_sigkill(open_store: Open) -> None:
    """Pause, resume, failure with retry, takeover, finish: one event each, in order."""

    async def register() -> None:
        async with CheckpointManager(open_store()) as manager:
            await manager.register_workflow("wf")

    asyncio.run(register())
    assert killed(in_child(open_store, "pause"))
    assert asyncio.run(events(open_store)) == [
        ("paused", 1, None, {"reason": "needs approval", "data": {"amount": 5}})
    ]
    asyncio.run(resume(open_store))
    assert killed(in_child(open_store, "fail"))
    assert killed(in_child(open_store, "stall"))
    time.sleep(TTL * 2)  # the stalled runner's lease expires
    assert killed(in_child(open_store, "finish"))
    found = asyncio.run(events(open_store))
    error = {"type": "Boom", "message": "card declined"}
    assert [kind for kind, *_ in found] == [
        "paused",
        "resumed",
        "step_failed",
        "retry_scheduled",
        "lease_taken_over",
        "completed",
    ]
    assert found[1][3] == {"input": {"approved": True}}
    assert found[2] == ("step_failed", 1, 1, error)
    assert found[3][:3] == ("retry_scheduled", 1, 1) and "at" in found[3][3]
    assert found[4][3] == {"previous_owner": "runner-stall"}
    assert found[5][:2] == ("completed", 2)
