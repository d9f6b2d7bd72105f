"""A workflow record field or event sealed under a key the runner lacks stops the runner.

The resume input and the failure text of a workflow record, and the texts of its events,
are sealed on an encrypted store. A runner whose keyring lacks their key (a rolling
rotation, or an old key dropped before ``rekey`` finished) must raise UnknownKeyError,
never take the workflow for a fresh one, run a step again or count a failed run: it claims
the workflow, meets the error on entering, writes nothing, and keeps the lease a few
seconds so its next claim passes the workflow over. A runner with the key then finishes
it, each step once. On every backend with workflow records.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    Keyring,
    ResumableWorkflow,
    RetryPolicy,
    UnknownKeyError,
    WorkflowStatus,
)
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.events import EventStorage
from tests.backend_support import WITH_RECORDS, make_storage
from tests.pg_support import pg_schema

__all__ = ["pg_schema"]

pytestmark = pytest.mark.asyncio

K1, K2 = os.urandom(32), os.urandom(32)
#: A runner not given the new key, and one (or an operator) that writes under it.
OLD = Keyring(keys={"k1": K1}, primary="k1")
NEW = Keyring(keys={"k1": K1, "k2": K2}, primary="k2")


class Boom(RuntimeError):
    """A step's failure."""


@pytest.fixture(params=WITH_RECORDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[CheckpointStorage]:
    async with make_storage(request.param, tmp_path, pg_schema) as storage:
        yield storage


async def snapshot(store: CheckpointStorage) -> Any:
    """What is stored of ``wf``: its checkpoints, its record's state, its events."""
    assert isinstance(store, EventStorage)
    record = await store.get_workflow("wf")
    assert record is not None
    fields = (record.status, record.attempts, record.last_error, record.resume_input)
    events = [(e.seq, e.kind, e.data) for e in await store.get_events("wf")]
    return [(r.step, r.data) for r in await store.scan("wf")], fields, events


async def run(manager: CheckpointManager, ran: list[tuple[int, Any]], fail: bool = False) -> None:
    """Claim ``wf`` and drive it: step 0, then step 1 pauses for input (or fails)."""
    lease = await manager.claim_workflow("runner", 5)
    assert lease is not None and lease.workflow_id == "wf"
    async with ResumableWorkflow("wf", manager, lease=lease, steps=2) as wf:
        if not wf.is_completed(0):
            async with wf.step(0, agent_id="a"):
                ran.append((0, None))
        async with wf.step(1, agent_id="a"):
            ran.append((1, wf.resume_input))
            if fail:
                raise Boom("card-declined")
            if wf.resume_input is None:
                await wf.pause("needs approval", {"amount": 5})


async def refused(store: CheckpointStorage, ran: list[tuple[int, Any]]) -> None:
    """The old runner claims ``wf``, is refused on entry, writes nothing, then passes it over."""
    before = await snapshot(store)
    old = CheckpointManager(store, encryption=OLD)
    with pytest.raises(UnknownKeyError) as caught:
        await run(old, ran)
    assert caught.value.key_id == "k2" and caught.value.workflow_id == "wf"
    assert ran == []  # no step ran again, none ran as if the workflow were fresh
    after = await snapshot(store)
    assert after[:2] == before[:2]
    assert [e[1] for e in after[2][len(before[2]) :]] in ([], ["lease_taken_over"])
    assert await old.claim_workflow("runner-2", 5) is None  # held: passed over
    with pytest.raises(UnknownKeyError):
        await old.get_events("wf")
    with pytest.raises(UnknownKeyError):
        await old.get_workflow("wf")


async def test_a_resume_input_under_a_missing_key_stops_the_runner(
    store: CheckpointStorage,
) -> None:
    new = CheckpointManager(store, encryption=NEW)
    await new.register_workflow("wf")
    ran: list[tuple[int, Any]] = []
    await run(new, ran)
    assert ran == [(0, None), (1, None)]
    await new.resume_workflow("wf", {"approved": "by-ops"})  # sealed under k2
    ran.clear()
    await refused(store, ran)
    record = await store.get_workflow("wf")  # type: ignore[attr-defined]
    assert record is not None and record.status is WorkflowStatus.UNFINISHED


async def test_a_failure_text_under_a_missing_key_stops_the_runner(
    store: CheckpointStorage,
) -> None:
    new = CheckpointManager(store, encryption=NEW)
    await new.register_workflow("wf")
    ran: list[tuple[int, Any]] = []
    policy = RetryPolicy(max_attempts=3, backoff=0)
    lease = await new.claim_workflow("runner", 5, retry=policy)
    assert lease is not None
    with pytest.raises(Boom):
        async with ResumableWorkflow("wf", new, lease=lease, steps=2) as wf:
            async with wf.step(0, agent_id="a"):
                ran.append((0, None))
            async with wf.step(1, agent_id="a"):
                raise Boom("card-declined")  # its message sealed under k2
    record = await store.get_workflow("wf")  # type: ignore[attr-defined]
    assert record is not None and record.attempts == 1
    assert record.status is WorkflowStatus.UNFINISHED  # to be retried: claimable
    ran.clear()
    await refused(store, ran)
    after = await store.get_workflow("wf")  # type: ignore[attr-defined]
    assert after is not None and after.attempts == 1  # no failed run counted


async def test_a_runner_with_the_key_then_runs_each_step_once(store: CheckpointStorage) -> None:
    new = CheckpointManager(store, encryption=NEW)
    await new.register_workflow("wf")
    ran: list[tuple[int, Any]] = []
    await run(new, ran)
    await new.resume_workflow("wf", {"approved": "by-ops"})
    ran.clear()
    await refused(store, ran)
    holder = await store.get_workflow("wf")  # type: ignore[attr-defined]
    assert holder is not None and holder.lease_owner == "runner"
    await store.release_lease(  # type: ignore[attr-defined]
        await store.acquire_lease("wf", "runner", 5)  # type: ignore[attr-defined]
    )
    await run(new, ran)
    assert ran == [(1, {"approved": "by-ops"})]  # step 0 not again; step 1 with its input
    record = await new.get_workflow("wf")
    assert record is not None and record.status is WorkflowStatus.FINISHED
