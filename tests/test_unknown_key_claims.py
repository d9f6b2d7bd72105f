"""A runner without a key passes the workflow over; a runner with the key takes it soon.

During a rolling key rotation a runner on the old keyring claims (oldest first) a workflow
whose record the new key sealed and meets :class:`~aiocheckpoint.UnknownKeyError`. It keeps
the lease a few seconds instead of releasing it (``docs/encryption.md``), so its next claim
reaches the workflows it can run, not the same one again; once that lease expired, a
runner with the key claims and finishes it. Real SQLite, two managers on one file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import pytest

from aiocheckpoint import (
    CheckpointManager,
    Lease,
    ResumableWorkflow,
    UnknownKeyError,
    WorkflowStatus,
)
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.test_missing_key import NEW, OLD

pytestmark = pytest.mark.asyncio

#: The old runner's lease TTL: how long it holds a workflow it has no key for.
_HOLD = 3.0


async def _run(manager: CheckpointManager, lease: Lease) -> None:
    """Drive the claimed two-step workflow to its end (step 0 is done already)."""
    async with ResumableWorkflow(lease.workflow_id, manager, lease=lease, steps=2) as wf:
        async with wf.step(1, agent_id="a"):
            wf.state.set("done", True)


async def _old_runner(manager: CheckpointManager) -> list[str]:
    """Claim and run until nothing is claimable (at most 10 claims): the ids claimed."""
    claims: list[str] = []
    while len(claims) < 10:
        lease = await manager.claim_workflow("old-runner", _HOLD)
        if lease is None:
            break
        claims.append(lease.workflow_id)
        # As a runner on the old keyring would: on to the next claim.
        with contextlib.suppress(UnknownKeyError):
            await _run(manager, lease)
    return claims


async def _claim_soon(manager: CheckpointManager) -> Lease:
    """Poll as an idle runner does, until a claim succeeds (the old runner's lease expired)."""
    with anyio.fail_after(60):
        for _ in range(600):
            lease = await manager.claim_workflow("new-runner", 30)
            if lease is not None:
                return lease
            await anyio.sleep(0.1)
    raise AssertionError("nothing became claimable")


async def test_a_runner_without_the_key_moves_on_and_one_with_it_finishes(
    tmp_path: Path,
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "s.db")
    old, new = CheckpointManager(store, encryption=OLD), CheckpointManager(store, encryption=NEW)
    await new.create_checkpoint("a", 0, "a", "completed", {"n": 0})  # sealed under k2
    await old.create_checkpoint("b", 0, "a", "completed", {"n": 0})  # k1: both can read it

    claims = await _old_runner(old)
    assert claims[:2] == ["a", "b"]  # not "a" again and again
    assert len(claims) < 10
    finished = await old.get_workflow("b")
    assert finished is not None and finished.status is WorkflowStatus.FINISHED
    passed = await old.get_workflow("a")
    assert passed is not None and passed.status is WorkflowStatus.UNFINISHED
    assert (passed.attempts, passed.last_error) == (0, None)

    lease = await _claim_soon(new)
    assert lease.workflow_id == "a"
    await _run(new, lease)
    record = await new.get_workflow("a")
    assert record is not None and record.status is WorkflowStatus.FINISHED
    await store.close()
