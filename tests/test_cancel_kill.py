"""A cancel issued while a step runs, in another process: the runner stops at its next
boundary and calls no further effect, whether it goes on or is SIGKILLed (SQLite, PostgreSQL).

The runner is a forked child; every effect's function appends a line to an fsynced log
before returning (the durable count of the calls that happened). The parent cancels with
the real ``aiocheckpoint cancel`` command while the child's step is running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aiocheckpoint import (
    CheckpointManager,
    CheckpointStorage,
    ResumableWorkflow,
    WorkflowCancelledError,
    WorkflowStatus,
)
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN, drop_schema, new_schema_name
from tests.test_cli import cli

Open = Callable[[], CheckpointStorage]
#: The child's exit status when its driver raised WorkflowCancelledError.
CANCELLED_EXIT = 7


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Open, str]]:
    """Opens a new storage object on one store, and the store's URL for the CLI."""
    schema = new_schema_name()
    opener: Open
    if request.param == "sqlite":
        path = tmp_path / "cancel.db"
        opener = lambda: SQLiteCheckpointStorage(path)  # noqa: E731
        url = f"sqlite://{path}"
    else:
        opener = lambda: PostgresCheckpointStorage(DSN, schema=schema, max_size=2)  # noqa: E731
        url = f"{DSN}?schema={schema}"
    yield opener, url
    if request.param == "postgres":
        asyncio.run(drop_schema(schema))


def logged(log: Path, line: str) -> None:
    """Append ``line`` to the call log, durably."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


async def drive(open_store: Open, work: Path) -> None:
    """Step 0 calls one effect, says it is ready, waits for the go, then calls two more."""

    async def call(name: str) -> str:
        logged(work / "calls.log", name)
        return name

    manager = CheckpointManager(open_store())
    lease = await manager.claim_workflow("runner", 600)
    assert lease is not None
    async with ResumableWorkflow("wf", manager, lease=lease) as wf:
        async with wf.step(0, agent_id="a"):
            await wf.effect("first", call, "first")
            (work / "ready").touch()
            await asyncio.to_thread(wait_for_go, work / "go")
            await wf.effect("second", call, "second")
        async with wf.step(1, agent_id="b"):
            await wf.effect("third", call, "third")


def wait_for_go(path: Path) -> None:
    """Block until the parent made ``path`` (the cancel is stored by then)."""
    while not path.exists():
        time.sleep(0.02)


def run_child(open_store: Open, work: Path) -> int:
    """Fork the runner; its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            asyncio.run(drive(open_store, work))
        except WorkflowCancelledError:
            code = CANCELLED_EXIT
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def wait_for(path: Path, pid: int) -> None:
    """Wait until the child made ``path`` (failing if it died first)."""
    deadline = time.monotonic() + 60
    while not path.exists():
        done, status = os.waitpid(pid, os.WNOHANG)
        assert done == 0, f"the runner ended early: {status}"
        assert time.monotonic() < deadline, "the runner never got ready"
        time.sleep(0.02)


async def setup(open_store: Open) -> None:
    """The workflow, registered for the runner to claim."""
    async with CheckpointManager(open_store()) as manager:
        await manager.register_workflow("wf")


async def final(open_store: Open) -> tuple[WorkflowStatus, list[str], bool]:
    """The workflow's status, its event kinds, and whether a runner can claim it."""
    async with CheckpointManager(open_store()) as manager:
        record = await manager.get_workflow("wf")
        assert record is not None
        kinds = [str(e.kind) for e in await manager.get_events("wf")]
        return record.status, kinds, await manager.claim_workflow("pool") is not None


@pytest.mark.slow
@pytest.mark.parametrize("killed", [False, True], ids=["goes-on", "sigkilled"])
def test_cancel_while_a_step_runs(store: tuple[Open, str], tmp_path: Path, killed: bool) -> None:
    """The cancel lands mid-step: no effect after it is called, by this runner or any."""
    open_store, url = store
    asyncio.run(setup(open_store))
    pid = run_child(open_store, tmp_path)
    wait_for(tmp_path / "ready", pid)
    cancelled = cli("cancel", url, "wf", "--reason", "runaway")
    assert cancelled.code == 0, cancelled.err
    assert "runner runner held its lease" in cancelled.out
    if killed:
        os.kill(pid, signal.SIGKILL)
    (tmp_path / "go").touch()
    status = os.waitpid(pid, 0)[1]
    if killed:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    else:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CANCELLED_EXIT, status
    assert (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines() == ["first"]
    assert asyncio.run(final(open_store)) == (WorkflowStatus.CANCELLED, ["cancelled"], False)
