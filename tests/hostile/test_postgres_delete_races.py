"""PostgreSQL: a workflow's delete and a run that starts it again, over a slow network.

A workflow's record, checkpoints and effect journal must go in one transaction. When the
effects went in a statement of their own after the delete's commit, a runner that started
the workflow again between the two (the deleter's connection slow to hear its commit, say)
lost the effect records it had been told were durable, and its retried step charged again.
Here the deleter talks to the server through a proxy that holds the reply to its COMMIT
on the wire (:mod:`tests.pg_proxy`) while a runner on a direct connection starts the
workflow again, charges, and fails its step; the retry must replay the recorded charge.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import anyio
import pytest

from aiocheckpoint import CheckpointManager, ResumableWorkflow, RetentionPolicy, WorkflowStatus
from aiocheckpoint.models import utcnow
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from tests.pg_proxy import CommitHoldingProxy
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

#: A guard against a hang if the proxy never sees the commit (not a timing assertion).
_GUARD = 60.0

Delete = Callable[[CheckpointManager], Awaitable[object]]

#: Each way to delete workflow ``wf`` (or its step 0), and whether it took its step 0 alone.
DELETES: dict[str, tuple[Delete, bool]] = {
    "delete_checkpoints": (lambda manager: manager.delete_checkpoints("wf"), False),
    "delete_checkpoints of the step": (lambda m: m.delete_checkpoints("wf", 0), True),
    "storage.delete": (lambda manager: manager.storage.delete("wf"), False),
    "ttl sweep": (
        lambda manager: manager.sweep(
            now=utcnow() + timedelta(days=2),
            policy=RetentionPolicy(finished_ttl=timedelta(days=1)),
        ),
        False,
    ),
}


@pytest.fixture
async def proxy() -> AsyncIterator[CommitHoldingProxy]:
    held = CommitHoldingProxy(DSN)
    yield held
    await held.close()


async def _earlier_run(manager: CheckpointManager, step_only: bool) -> None:
    """A run of ``wf`` with an effect record at step 0: what the delete takes."""
    await manager.create_checkpoint("wf", 0, "a", "failed" if step_only else "completed", {})
    await manager.storage.put_effect("wf", 0, "old", b"done", in_doubt=False)  # type: ignore[attr-defined]
    if not step_only:
        await manager.mark_workflow("wf", WorkflowStatus.FINISHED)


async def _until_deleted(
    proxy: CommitHoldingProxy, direct: PostgresCheckpointStorage, step_only: bool
) -> None:
    """Wait until the deleter's commit that took ``wf`` (or its step 0) is held."""
    while True:
        with anyio.fail_after(_GUARD):
            await proxy.held.wait()
        record = None if step_only else await direct.get_workflow("wf")
        if record is None and not await direct.exists("wf", 0):
            return
        proxy.hold_next_commit()  # not that one: hold the next, then let this one go
        proxy.release()


@pytest.mark.parametrize("how", sorted(DELETES))
async def test_a_run_started_before_the_delete_returns_keeps_its_effects(
    pg_schema: str, proxy: CommitHoldingProxy, how: str
) -> None:
    """A charge recorded while the delete's reply is on the wire is replayed, not repeated.

    The delete commits (its reply held); a runner starts the workflow (or the deleted step)
    again, charges at step 0 and fails the step; then the delete returns. The retried step
    returns the recorded charge: the function was called once.
    """
    slow_dsn = await proxy.start()
    async with (
        PostgresCheckpointStorage(slow_dsn, schema=pg_schema, max_size=1) as slow,
        PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2) as direct,
    ):
        deleter, runner = CheckpointManager(slow), CheckpointManager(direct)
        how_to_delete, step_only = DELETES[how]
        await _earlier_run(runner, step_only)
        await slow.get_workflow("wf")  # connected, schema checked: only the delete is left
        charges: list[str] = []

        async def charge() -> str:
            charges.append("ch")
            return f"ch_{len(charges)}"

        proxy.hold_next_commit()
        delete = asyncio.ensure_future(how_to_delete(deleter))
        try:
            await _until_deleted(proxy, direct, step_only)
            with pytest.raises(RuntimeError, match="after the charge"):
                async with ResumableWorkflow("wf", runner, lease_owner="runner") as wf:
                    async with wf.step(0, agent_id="billing"):
                        await wf.effect("charge", charge)
                        raise RuntimeError("the step fails after the charge")
            assert [e.key for e in await direct.load_effects("wf", 0)] == ["charge"]
        finally:
            proxy.release()
            await delete
        assert [e.key for e in await direct.load_effects("wf", 0)] == ["charge"]
        async with ResumableWorkflow("wf", runner, lease_owner="runner") as wf:
            async with wf.step(0, agent_id="billing"):
                assert await wf.effect("charge", charge) == "ch_1"
        assert charges == ["ch"]
