"""A long durable sleep in a real pydantic-ai run: the store's timer, as for ``wf.sleep``.

The agent's model answers "busy" once; ``RetryOnModelErrors`` then sleeps an hour (through
pydantic-ai's agent graph sleep, which calls the engine's ``durable_sleep``) and asks again.
On a store with workflow records the run ends with ``RunSleeping``; no runner claims it
before its wake-up time, which the test moves an hour back in the store itself (the store's
clock is what decides; nothing waits); the claimed run resumes, replays every completed
unit without calling it, does not sleep again, and answers as a run that never slept.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import anyio
import asyncpg
import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import RetryOnModelErrors
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from aiocheckpoint import CheckpointManager, WorkflowStatus, sleeping
from aiocheckpoint.integrations.pydantic_ai import AioCheckpointDurability, RunSleeping
from aiocheckpoint.integrations.pydantic_ai._scope import run_scope
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.workflow import ResumableWorkflow
from tests.backend_support import WITH_RECORDS, make_storage
from tests.pg_support import DSN
from tests.test_effects_kill import fork

HOUR = 3600.0


class Counts:
    """The calls made of the model and of the tool, in a file (fsynced): every process's."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def bump(self, kind: str) -> int:
        """Count a call of ``kind``; return how many were made before it."""
        before = self.get()[kind]
        with self.path.open("a") as out:
            out.write(kind + "\n")
            out.flush()
            os.fsync(out.fileno())
        return before

    def get(self) -> dict[str, int]:
        """``{"model": n, "tool": m}``."""
        lines = self.path.read_text().split() if self.path.exists() else []
        return {kind: lines.count(kind) for kind in ("model", "tool")}


def sleepy_agent(
    durability: AioCheckpointDurability, counts: Counts, delay: float
) -> Agent[None, str]:
    """Model call 0 asks for a lookup, call 1 answers "busy" (retried after ``delay``, as
    much as an hour), call 2 answers with the lookup's result. ``counts`` counts the calls
    of the model and of the tool, across every run (and process) that shares it."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = counts.bump("model")
        if n == 0:
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Rome"}, "call-1")])
        if n == 1:
            return ModelResponse(parts=[TextPart("busy")])
        found = [
            part.content
            for message in messages
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        return ModelResponse(parts=[TextPart(f"done: {found}")])

    def busy(response: ModelResponse) -> bool:
        return any(isinstance(p, TextPart) and p.content == "busy" for p in response.parts)

    retry = RetryOnModelErrors[None](
        retry_on=[busy], max_attempts=2, initial_delay=delay, max_delay=delay
    )
    agent = Agent(
        FunctionModel(model), name="sleepy", capabilities=[durability, retry], output_type=str
    )

    @agent.tool
    async def lookup(ctx: RunContext[None], city: str) -> str:
        counts.bump("tool")
        return f"{city}: sunny"

    return agent


async def wake_now(kind: str, storage: CheckpointStorage, tmp_path: Path, pg_schema: str) -> None:
    """Move every sleeping workflow's wake-up time two hours back, in the store itself."""
    if kind == "memory":
        assert isinstance(storage, InMemoryCheckpointStorage)
        records = storage._records
        for workflow_id, record in list(records.items()):
            if record.retry_at is not None:
                earlier = record.retry_at - timedelta(hours=2)
                records[workflow_id] = record.model_copy(update={"retry_at": earlier})
    elif kind == "sqlite":

        def shift() -> None:
            with sqlite3.connect(tmp_path / "store.db", timeout=30) as db:
                db.execute("UPDATE workflows SET retry_at = retry_at - 7200")

        await anyio.to_thread.run_sync(shift)
    else:
        db = await asyncpg.connect(DSN)
        try:
            await db.execute(
                f"UPDATE {pg_schema}.workflows SET retry_at = retry_at - interval '2 hours'"
            )
        finally:
            await db.close()


@pytest.fixture(params=WITH_RECORDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[tuple[str, CheckpointStorage]]:
    async with make_storage(request.param, tmp_path, pg_schema) as storage:
        yield request.param, storage


async def test_a_long_sleep_ends_the_run_until_the_store_wakes_it(
    store: tuple[str, CheckpointStorage], tmp_path: Path, pg_schema: str
) -> None:
    kind, storage = store
    manager = CheckpointManager(storage)
    # The same run with a short sleep, which waits in the process: the answer to match.
    plain = Counts(tmp_path / "plain.log")
    short = AioCheckpointDurability(manager)
    expected = await short.run(sleepy_agent(short, plain, 0.01), "go", workflow_id="nap")
    assert plain.get() == {"model": 3, "tool": 1}
    assert expected.output == "done: ['Rome: sunny']"

    counts = Counts(tmp_path / "calls.log")
    durability = AioCheckpointDurability(manager)
    before = datetime.now(timezone.utc)
    with pytest.raises(RunSleeping) as slept:
        await durability.run(sleepy_agent(durability, counts, HOUR), "go", workflow_id="long")
    assert counts.get() == {"model": 2, "tool": 1}  # the request after the sleep is not made
    asleep = slept.value
    assert asleep.workflow_id == "long" and HOUR / 2 <= asleep.seconds <= HOUR
    assert asleep.wake_at is not None
    assert asleep.wake_at >= before + timedelta(seconds=asleep.seconds - 60)
    record = await manager.get_workflow("long")
    assert record is not None and record.status is WorkflowStatus.UNFINISHED
    assert record.retry_at == asleep.wake_at and record.lease_owner is None
    keys = [effect.key for effect in await manager.get_effects("long", 0)]
    assert "sleepy__sleep/0" in keys
    assert await manager.claim_workflow("early") is None

    await wake_now(kind, storage, tmp_path, pg_schema)
    lease = await manager.claim_workflow("on-time")
    assert lease is not None and lease.workflow_id == "long"
    # Resumed in a fresh agent and capability (as another process would): the model
    # request and the tool call that completed are replayed, not made again; the sleep is
    # not taken again; only the request after it is made.
    again = AioCheckpointDurability(manager)
    result = await again.resume(sleepy_agent(again, counts, HOUR), "long", lease=lease)
    assert result.output == expected.output
    assert counts.get() == {"model": 3, "tool": 1}
    record = await manager.get_workflow("long")
    assert record is not None and record.status is WorkflowStatus.FINISHED
    sleeps = [e for e in await manager.get_effects("long", 0) if "__sleep/" in e.key]
    assert len(sleeps) == 1
    events = [event.kind.value for event in await manager.get_events("long")]
    assert events.count("sleeping") == 1
    # Finished: its id returns the result again, calling nothing.
    finished = await again.run(sleepy_agent(again, counts, HOUR), "go", workflow_id="long")
    assert finished.output == expected.output and counts.get() == {"model": 3, "tool": 1}
    if kind != "memory":
        await manager.close()


async def test_on_the_file_store_a_long_sleep_holds_the_process(tmp_path: Path) -> None:
    """The file store keeps no workflow records: the sleep waits here, for a recorded
    deadline (a resumed run waits only what is left)."""
    async with make_storage("file", tmp_path, "") as storage:
        manager = CheckpointManager(storage)
        durability = AioCheckpointDurability(manager, name="sleeper")
        async with ResumableWorkflow("f-1", manager) as wf, wf.step(0, agent_id="a"):
            with run_scope(wf), anyio.move_on_after(0.2) as scope:
                await durability.durable_sleep(HOUR)
        assert scope.cancelled_caught  # it was waiting, not ending the run
        [record] = await manager.get_effects("f-1", 0)
        assert record.key == "sleeper__sleep/0" and isinstance(record.result, float)


@pytest.mark.parametrize("point", ["before", "after"])
def test_killed_while_the_sleep_is_written(point: str, tmp_path: Path) -> None:
    """SIGKILLed just before the sleep's store write, or just after it (its effect not yet
    done): the sleep is in doubt, so the resumed run takes it again (never skips it); woken,
    it ends as an uninterrupted run, and nothing that completed ran again."""
    counts = Counts(tmp_path / "calls.log")

    def child() -> None:
        write = sleeping.sleep_workflow

        async def dying(*args: object, **kwargs: object) -> object:
            if point == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            record = await write(*args, **kwargs)  # type: ignore[arg-type]
            os.kill(os.getpid(), signal.SIGKILL)
            return record

        sleeping.sleep_workflow = dying  # type: ignore[assignment]

        async def run() -> None:
            async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "store.db")) as m:
                durability = AioCheckpointDurability(m)
                await durability.run(sleepy_agent(durability, counts, HOUR), "go", workflow_id="k")

        asyncio.run(run())

    status = os.waitpid(fork(child), 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert counts.get() == {"model": 2, "tool": 1}

    async def resume() -> tuple[str, int]:
        async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "store.db")) as m:
            durability = AioCheckpointDurability(m)
            agent = sleepy_agent(durability, counts, HOUR)
            with pytest.raises(RunSleeping):  # recovered, the sleep in doubt is taken again
                await durability.resume(agent, "k")
            assert await m.claim_workflow("early") is None
            await wake_now("sqlite", m.storage, tmp_path, "")
            lease = await m.claim_workflow("runner")
            assert lease is not None
            result = await durability.resume(agent, "k", lease=lease)
            events = [event.kind.value for event in await m.get_events("k")]
            return result.output, events.count("sleeping")

    output, slept = asyncio.run(resume())
    assert output == "done: ['Rome: sunny']"
    assert counts.get() == {"model": 3, "tool": 1}
    assert slept == (1 if point == "before" else 2)
