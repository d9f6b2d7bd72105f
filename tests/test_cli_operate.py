"""`resume`, `retry` and `cancel` end to end, against SQLite and PostgreSQL.

Each runs the real command in a child process (`tests/test_cli.py`'s `cli()`); the store is
set up and checked through the Python API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    LeaseLostError,
    ResumableWorkflow,
    WorkflowStatus,
    open_storage,
)
from aiocheckpoint.cli.store import open_store
from aiocheckpoint.cli.transfer import _mark
from aiocheckpoint.leases import WorkflowRecord
from tests.test_cli import NewStore, cli, new_store

__all__ = ["new_store"]

pytestmark = pytest.mark.asyncio

BACKENDS = ["sqlite", "postgres"]


async def _paused(manager: CheckpointManager, workflow_id: str) -> None:
    async with ResumableWorkflow(workflow_id, manager) as wf:
        async with wf.step(0, agent_id="draft"):
            pass
        await wf.pause("approve the draft")


async def _failed(manager: CheckpointManager, workflow_id: str) -> None:
    await manager.register_workflow(workflow_id)
    await manager.record_failure(workflow_id, RuntimeError("down"))


async def _record(url: str, workflow_id: str) -> WorkflowRecord | None:
    async with open_store(url, must_exist=True) as manager:
        return await manager.get_workflow(workflow_id)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_resume_retry_and_cancel(new_store: NewStore, kind: str) -> None:
    """Each command changes the record as its Python twin does; output is escaped."""
    url = new_store(kind)
    async with open_store(url, must_exist=False) as manager:
        await _paused(manager, "paused")
        await _failed(manager, "failed")
        await manager.register_workflow("running")
        runner = await manager.acquire_lease("running", "runner-1", 600)

    resumed = cli("resume", url, "paused", "--input", '{"approved": true}', "--json")
    assert resumed.code == 0, resumed.err
    assert resumed.json() == {
        "workflow_id": "paused",
        "status": "unfinished",
        "attempts": 0,
        "last_error": None,
        "resume_input": {"approved": True},
        "updated_at": resumed.json()["updated_at"],  # type: ignore[index]
    }

    retried = cli("retry", url, "failed")
    assert (retried.code, retried.out) == (
        0,
        "workflow failed: retried: the next runner claims it\n",
    )
    record = await _record(url, "failed")
    assert record is not None and record.status is WorkflowStatus.UNFINISHED
    assert (record.attempts, record.lease_owner) == (0, None)

    cancelled = cli("cancel", url, "running", "--reason", "runaway \x1b[31mloop")
    assert cancelled.code == 0, cancelled.err
    assert "\x1b" not in cancelled.out
    assert cancelled.out.splitlines() == [
        "workflow running: cancelled (runaway \\x1b[31mloop)",
        "runner runner-1 held its lease: it stops at its next step boundary or effect",
    ]
    record = await _record(url, "running")
    assert record is not None and record.status is WorkflowStatus.CANCELLED
    assert record.last_error == {
        "type": "WorkflowCancelledError",
        "message": "runaway \x1b[31mloop",
    }
    async with open_store(url, must_exist=True) as manager:
        with pytest.raises(LeaseLostError):
            await manager.renew_lease(runner)
        assert await manager.claim_workflow("pool") is not None  # "paused", now resumed
        assert await manager.claim_workflow("pool") is not None  # "failed", retried
        assert await manager.claim_workflow("pool") is None  # never the cancelled one

    again = cli("retry", url, "running", "--json")
    assert again.code == 0, again.err
    assert again.json()["status"] == "unfinished"  # type: ignore[index]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_refused_while_a_runner_holds_the_lease(new_store: NewStore, kind: str) -> None:
    """`retry` and `resume` change nothing while a runner holds the lease: exit status 4."""
    url = new_store(kind)
    async with open_store(url, must_exist=False) as manager:
        await _failed(manager, "failed")
        await _paused(manager, "paused")
        for workflow_id in ("failed", "paused"):
            await manager.acquire_lease(workflow_id, "runner-1", 600)
        before = {w: await manager.get_workflow(w) for w in ("failed", "paused")}
    for args in (("retry", url, "failed"), ("resume", url, "paused", "--input", "1")):
        refused = cli(*args)
        assert refused.code == 4
        line = refused.error_line()
        assert "a runner holds workflow" in line and "nothing was changed" in line
        assert "runner-1" in line
    for workflow_id, record in before.items():
        assert await _record(url, workflow_id) == record


@pytest.mark.parametrize("kind", BACKENDS)
async def test_wrong_status_missing_workflow_and_bad_input(new_store: NewStore, kind: str) -> None:
    """A status the command does not apply to is a usage error naming it; nothing changes."""
    url = new_store(kind)
    async with open_store(url, must_exist=False) as manager:
        await manager.register_workflow("live")
        before = await manager.get_workflow("live")
    retried = cli("retry", url, "live")
    assert retried.code == 2 and "is unfinished" in retried.error_line()
    resumed = cli("resume", url, "live")
    assert resumed.code == 2 and "not paused" in resumed.error_line()
    assert await _record(url, "live") == before
    assert cli("cancel", url, "missing").code == 3
    assert cli("retry", url, "missing").code == 3
    assert await _record(url, "missing") is None
    bad = cli("resume", url, "live", "--input", "{not json")
    assert bad.code == 2 and "--input is not JSON" in bad.err
    assert cli("cancel", url, "live").code == 0
    twice = cli("cancel", url, "live", "--json")
    assert twice.code == 2 and "is cancelled" in twice.error_line()


async def test_a_store_without_workflow_records(new_store: NewStore) -> None:
    """A `file:` store keeps no workflow records: a usage error."""
    url = new_store("file")
    async with open_store(url, must_exist=False) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {})
    for command in ("resume", "retry", "cancel"):
        result = cli(command, url, "wf")
        assert result.code == 2 and "keeps no workflow records" in result.error_line()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_copy_and_export_carry_a_cancelled_workflow(
    new_store: NewStore, kind: str, tmp_path: Path
) -> None:
    """`copy` and `export`/`import` keep a cancelled workflow cancelled (never claimable)."""
    source = new_store(kind)
    async with open_store(source, must_exist=False) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 1})
        await manager.cancel_workflow("wf", reason="stop")
    copied = new_store("sqlite")
    assert cli("copy", source, copied).code == 0
    exported = tmp_path / "out.jsonl"
    assert cli("export", source, str(exported)).code == 0
    imported = new_store("postgres")
    assert cli("import", str(exported), imported).code == 0
    for url in (copied, imported):
        async with open_store(url, must_exist=True) as manager:
            record = await manager.get_workflow("wf")
            assert record is not None and record.status is WorkflowStatus.CANCELLED
            assert await manager.claim_workflow("runner") is None
    async with open_store(copied, must_exist=True) as manager:
        record = await manager.get_workflow("wf")
        assert record is not None and record.last_error is not None
        assert record.last_error["message"] == "stop"  # copy carries the reason


async def test_a_copy_dying_before_the_cancel_leaves_nothing_claimable(tmp_path: Path) -> None:
    """A copy killed between a cancelled workflow's two writes leaves it unclaimable."""

    class Dies(CheckpointManager):
        async def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> Any:
            raise KeyboardInterrupt  # the process dies here

    async with Dies(open_storage(f"sqlite://{tmp_path}/dst.db")) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 1})
        with pytest.raises(KeyboardInterrupt):
            await _mark(manager, "wf", WorkflowStatus.CANCELLED, "stop")
        assert await manager.claim_workflow("runner") is None
