"""AioCheckpointDurability: real pydantic-ai runs (FunctionModel, TestModel) on every backend."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.test import TestModel

from aiocheckpoint import (
    CheckpointManager,
    CheckpointNotFoundError,
    EffectInDoubtError,
    EffectState,
    InvalidArgumentError,
    Keyring,
    RetentionPolicy,
)
from aiocheckpoint.integrations.pydantic_ai import AioCheckpointDurability
from aiocheckpoint.integrations.pydantic_ai._scope import run_scope
from aiocheckpoint.workflow import ResumableWorkflow
from tests._effect_kill import CallLog
from tests.backend_support import ALL, make_storage
from tests.pydanticai.agents import build_agent, expected_output, prompt_for
from tests.test_encryption import assert_no_canary, dump_store

Managers = Callable[[], Any]


@pytest.fixture(params=ALL)
async def managers(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[Managers]:
    """Opens managers on one store of each backend (memory: the same storage object)."""
    kind: str = request.param
    opened: list[CheckpointManager] = []
    memory = make_storage("memory", tmp_path, pg_schema)

    def open_manager() -> CheckpointManager:
        storage = memory if kind == "memory" else make_storage(kind, tmp_path, pg_schema)
        manager = CheckpointManager(storage)
        opened.append(manager)
        return manager

    yield open_manager
    for manager in opened:
        if kind != "memory":
            await manager.close()


def responses(messages: list[ModelMessage]) -> list[ModelResponse]:
    """The model's responses (the requests are built again on a replay, with new times)."""
    return [m for m in messages if isinstance(m, ModelResponse)]


def calls(log: CallLog, kind: str) -> list[list[str]]:
    """The logged calls of one kind (``model`` or ``tool``)."""
    return [line for line in log.lines() if line[1] == kind]


#: Every unit of the planner's run, as the journal names it (pinned: persisted names).
PINNED = [
    "planner__function_toolset__<agent>.call_tool:book@{book}",
    "planner__function_toolset__<agent>.call_tool:lookup@{lookup0}",
    "planner__function_toolset__<agent>.call_tool:lookup@{lookup1}",
    "planner__model.request/0",
    "planner__model.request/1",
    "planner__model.request/2",
    "run.input",
]


async def test_a_run_is_recorded_once_and_replayed(managers: Managers, tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.log")
    first = managers()
    durability = AioCheckpointDurability(first)
    result = await durability.run(
        build_agent(durability, log), prompt_for("r-1"), workflow_id="r-1"
    )
    assert result.output == expected_output("r-1")
    assert (len(calls(log, "model")), len(calls(log, "tool"))) == (3, 3)
    records = await first.get_effects("r-1", 0)
    assert all(record.state is EffectState.DONE for record in records)
    # Another manager on the same store (another process, after a restart) replays it all.
    second = managers()
    again = AioCheckpointDurability(second)
    replayed = await again.resume(build_agent(again, log), "r-1")
    assert replayed.output == result.output
    assert responses(replayed.all_messages()) == responses(result.all_messages())
    assert (len(calls(log, "model")), len(calls(log, "tool"))) == (3, 3)  # nothing called again
    point = await second.get_resume_point("r-1")
    assert point is not None and point[1].data["output"] == expected_output("r-1")


async def test_operation_names_are_pinned(tmp_path: Path) -> None:
    manager = CheckpointManager()
    log = CallLog(tmp_path / "calls.log")
    durability = AioCheckpointDurability(manager)
    await durability.run(build_agent(durability, log), prompt_for("n-1"), workflow_id="n-1")
    ids = {
        f"{line[2]}{n}": line[3]
        for n, line in enumerate(line for line in calls(log, "tool") if line[2] == "lookup")
    }
    ids["book"] = next(line[3] for line in calls(log, "tool") if line[2] == "book")
    keys = sorted(record.key for record in await manager.get_effects("n-1", 0))
    assert keys == sorted(name.format(**ids) for name in PINNED)
    functions = {
        record.key.split("@")[0]: record.name for record in await manager.get_effects("n-1", 0)
    }
    assert functions["planner__model.request/0"] == "planner__model.request"


class Crash(BaseException):
    """Stands for the process dying inside a call."""


async def test_a_tool_in_doubt_raises_and_settles(managers: Managers) -> None:
    """A non-idempotent tool killed mid-call is in doubt; an idempotent one runs again."""
    booked: list[str] = []
    looked: list[str | None] = []
    crash = {"book": True, "lookup": True}
    from aiocheckpoint.integrations.pydantic_ai import current_idempotency_key

    def make(manager: CheckpointManager) -> tuple[AioCheckpointDurability[None], Agent[None, str]]:
        durability = AioCheckpointDurability(manager)
        agent = Agent(TestModel(), name="ops", capabilities=[durability])

        @agent.tool_plain(metadata={"aiocheckpoint": {"idempotent": True}})
        async def lookup(city: str) -> int:
            looked.append(current_idempotency_key())
            if crash["lookup"]:
                crash["lookup"] = False
                raise Crash
            return 7

        @agent.tool_plain
        async def book(city: str) -> str:
            booked.append(city)
            if crash["book"]:
                crash["book"] = False
                raise Crash
            return "bk-1"

        return durability, agent

    durability, agent = make(managers())
    with pytest.raises(Crash):
        await durability.run(agent, "go", workflow_id="d-1")
    durability, agent = make(managers())
    with pytest.raises(EffectInDoubtError) as doubt:
        await durability.resume(agent, "d-1")
    assert ".call_tool:book@" in doubt.value.key
    assert len(booked) == 1  # never called again silently
    manager = durability.manager
    [found] = [r for r in await manager.list_in_doubt_effects("d-1") if "book" in r.key]
    assert found.key == doubt.value.key
    result = {"result": "bk-1", "kind": "tool_return"}  # the tool result's JSON form
    await manager.resolve_effect("d-1", 0, found.key, happened=True, result=result)
    finished = await durability.resume(agent, "d-1")
    assert finished.output == '{"lookup":7,"book":"bk-1"}'
    assert len(booked) == 1  # settled, not called
    assert len(looked) == 2 and len(set(looked)) == 1 and looked[0]  # again, with one key


class CrashAt:
    """A killer (``tests._effect_kill.Killer``'s interface) that raises at its n-th point."""

    def __init__(self, n: int) -> None:
        self.left = n

    def maybe(self) -> None:
        self.left -= 1
        if self.left == 0:
            raise Crash


async def test_a_model_request_in_doubt_is_made_again(managers: Managers, tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.log")
    durability = AioCheckpointDurability(managers())
    # Points: request 0 (2), the two lookups (4), then request 1 dies after it was made.
    agent = build_agent(durability, log, CrashAt(8))  # type: ignore[arg-type]
    with pytest.raises(Crash):
        await durability.run(agent, prompt_for("m-1"), workflow_id="m-1")
    [doubt] = await durability.manager.list_in_doubt_effects("m-1")
    assert doubt.key == "planner__model.request/1"
    again = AioCheckpointDurability(managers())
    result = await again.resume(build_agent(again, log), "m-1")
    assert result.output == expected_output("m-1")
    assert [line[2] for line in calls(log, "model")] == ["0", "1", "1", "2"]
    assert [line[2] for line in calls(log, "tool")].count("lookup") == 2  # not again


async def test_a_tool_can_be_made_idempotent_by_name(tmp_path: Path) -> None:
    booked: list[str] = []
    manager = CheckpointManager()

    def make() -> tuple[AioCheckpointDurability[None], Agent[None, str]]:
        durability = AioCheckpointDurability(manager, idempotent_tools=["book"])
        agent = Agent(TestModel(), name="ops", capabilities=[durability])

        @agent.tool_plain
        async def book(city: str) -> str:
            booked.append(city)
            if len(booked) == 1:
                raise Crash
            return "bk-1"

        return durability, agent

    durability, agent = make()
    with pytest.raises(Crash):
        await durability.run(agent, "go", workflow_id="i-1")
    durability, agent = make()
    assert (await durability.resume(agent, "i-1")).output == '{"book":"bk-1"}'
    assert len(booked) == 2


class Trip(BaseModel):
    city: str
    nights: int


async def test_a_structured_output_is_stored_as_its_json_form(managers: Managers) -> None:
    manager = managers()
    durability = AioCheckpointDurability(manager)
    agent = Agent(TestModel(), name="typed", output_type=Trip, capabilities=[durability])
    result = await durability.run(agent, "a trip", workflow_id="t-1")
    assert isinstance(result.output, Trip)
    point = await manager.get_resume_point("t-1")
    assert point is not None and point[1].data["output"] == result.output.model_dump(mode="json")
    for record in await manager.get_effects("t-1", 0):
        assert _plain_json(record.result), record.key
    other = managers()
    again = AioCheckpointDurability(other)
    agent = Agent(TestModel(), name="typed", output_type=Trip, capabilities=[again])
    assert (await again.resume(agent, "t-1")).output == result.output


def _plain_json(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain_json(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


CANARY = "pa-CANARY-5e2f"


@pytest.mark.parametrize("kind", ALL)
async def test_an_encrypted_store_keeps_prompts_and_results_sealed(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    ring = Keyring(keys={"k": os.urandom(32)}, primary="k")
    store = make_storage(kind, tmp_path, pg_schema)
    manager = CheckpointManager(store, encryption=ring)
    durability = AioCheckpointDurability(manager)
    agent = Agent(TestModel(), name="sealed", capabilities=[durability])

    @agent.tool_plain
    async def secret(topic: str) -> str:
        return f"{CANARY}-result"

    result = await durability.run(agent, f"tell me {CANARY}", workflow_id="s-1")
    assert CANARY in result.output
    again = AioCheckpointDurability(manager)
    agent2 = Agent(TestModel(), name="sealed", capabilities=[again])
    agent2.tool_plain(secret)
    assert (await again.resume(agent2, "s-1")).output == result.output
    assert_no_canary(await dump_store(kind, store, tmp_path, pg_schema), CANARY)
    if kind != "memory":
        await manager.close()


async def test_durable_sleep_waits_for_a_recorded_deadline() -> None:
    manager = CheckpointManager()
    durability = AioCheckpointDurability(manager, name="sleeper")
    async with ResumableWorkflow("z-1", manager) as wf, wf.step(0, agent_id="a"):
        with run_scope(wf):
            await durability.durable_sleep(0.01)
    [record] = await manager.get_effects("z-1", 0)
    assert record.key == "sleeper__sleep/0" and isinstance(record.result, float)
    # Resumed, the run waits for the recorded deadline (past), not for the hour asked again.
    async with ResumableWorkflow("z-1", manager) as wf, wf.step(0, agent_id="a"):
        with run_scope(wf), anyio.fail_after(60):
            await durability.durable_sleep(3600)
    assert [r.result for r in await manager.get_effects("z-1", 0)] == [record.result]


async def test_bad_input_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        AioCheckpointDurability("sqlite:///x.db")  # type: ignore[arg-type]
    manager = CheckpointManager()
    durability = AioCheckpointDurability(manager)
    plain = Agent(TestModel(), name="plain")
    with pytest.raises(InvalidArgumentError, match="capabilities"):
        await durability.run(plain, "hi", workflow_id="b-1")
    other = AioCheckpointDurability(CheckpointManager())
    with pytest.raises(InvalidArgumentError):
        await durability.run(
            Agent(TestModel(), name="o", capabilities=[other]), "hi", workflow_id="b-1"
        )
    agent = Agent(TestModel(), name="a", capabilities=[durability])
    with pytest.raises(InvalidArgumentError, match="str or None"):
        await durability.run(agent, ["a", "list"], workflow_id="b-1")  # type: ignore[arg-type]
    with pytest.raises(CheckpointNotFoundError):
        await durability.resume(agent, "b-1")
    assert await manager.list_workflows() == []
    await durability.run(agent, "hi", workflow_id="b-1")
    before = await manager.get_effects("b-1", 0)
    with pytest.raises(InvalidArgumentError, match="another prompt"):
        await durability.run(agent, "something else", workflow_id="b-1")
    assert await manager.get_effects("b-1", 0) == before


async def test_outside_a_durable_run_the_agent_runs_as_usual() -> None:
    manager = CheckpointManager()
    durability = AioCheckpointDurability(manager)
    agent = Agent(TestModel(), name="free", capabilities=[durability])
    assert (await agent.run("hi")).output == "success (no tool calls)"
    assert await manager.list_workflows() == []


def test_importing_aiocheckpoint_never_imports_pydantic_ai() -> None:
    code = (
        "import sys, aiocheckpoint, aiocheckpoint.integrations, aiocheckpoint.cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic_ai'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_tools_reconcile_settles_it_and_model_requests_can_raise_in_doubt(
    tmp_path: Path,
) -> None:
    from aiocheckpoint import EffectRecord, Reconciled

    manager = CheckpointManager()
    asked: list[str] = []

    async def reconcile(record: EffectRecord) -> Reconciled:
        asked.append(record.key)
        return Reconciled(happened=True, result={"result": "bk-9", "kind": "tool_return"})

    booked: list[str] = []

    def make() -> tuple[AioCheckpointDurability[None], Agent[None, str]]:
        durability = AioCheckpointDurability(manager, model_requests_idempotent=False)
        agent = Agent(TestModel(), name="ops", capabilities=[durability])

        @agent.tool_plain(metadata={"aiocheckpoint": {"reconcile": reconcile}})
        async def book(city: str) -> str:
            booked.append(city)
            raise Crash

        return durability, agent

    durability, agent = make()
    with pytest.raises(Crash):
        await durability.run(agent, "go", workflow_id="c-1")
    durability, agent = make()
    assert (await durability.resume(agent, "c-1")).output == '{"book":"bk-9"}'
    assert len(booked) == 1 and len(asked) == 1
    # A model request in doubt raises when model requests are not idempotent.
    log = CallLog(tmp_path / "calls.log")
    strict = AioCheckpointDurability(manager, model_requests_idempotent=False)
    with pytest.raises(Crash):
        await strict.run(build_agent(strict, log, CrashAt(2)), prompt_for("c-2"), workflow_id="c-2")  # type: ignore[arg-type]
    with pytest.raises(EffectInDoubtError, match=r"model\.request/0"):
        await strict.resume(build_agent(strict, log), "c-2")


async def test_a_lease_owner_keeps_a_second_runner_out() -> None:
    from aiocheckpoint import InMemoryCheckpointStorage, LeaseHeldError

    store = InMemoryCheckpointStorage()  # two managers on one store: two processes
    inside, release = anyio.Event(), anyio.Event()

    def make() -> tuple[AioCheckpointDurability[None], Agent[None, str]]:
        durability = AioCheckpointDurability(CheckpointManager(store))
        agent = Agent(TestModel(), name="slow", capabilities=[durability])

        @agent.tool_plain
        async def wait(x: int) -> int:
            inside.set()
            await release.wait()
            return x

        return durability, agent

    first, second = make(), make()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: first[0].run(first[1], "go", workflow_id="l-1", lease_owner="a"))
        await inside.wait()
        with pytest.raises(LeaseHeldError):
            await second[0].run(second[1], "go", workflow_id="l-1", lease_owner="b")
        release.set()
    assert (await second[0].resume(second[1], "l-1", lease_owner="b")).output == '{"wait":0}'


async def test_runtime_toolsets_are_refused_in_a_durable_run() -> None:
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.toolsets import FunctionToolset

    durability = AioCheckpointDurability(CheckpointManager())
    agent = Agent(TestModel(), name="rt", capabilities=[durability])
    extra = FunctionToolset[None]()

    @extra.tool_plain
    async def side(x: int) -> int:
        return x

    with pytest.raises(UserError):
        await durability.run(agent, "go", workflow_id="rt-1", toolsets=[extra])


async def test_event_handler_calls_are_units_and_replay_delivers_nothing_again() -> None:
    seen: list[str] = []

    async def handler(ctx: Any, events: Any) -> None:
        async for event in events:
            seen.append(type(event).__name__)

    manager = CheckpointManager()
    durability = AioCheckpointDurability(manager, event_stream_handler=handler)
    agent = Agent(TestModel(), name="ev", capabilities=[durability])

    @agent.tool_plain
    async def temp(city: str) -> str:
        return "t"

    await durability.run(agent, "x", workflow_id="e-1")
    assert "FunctionToolResultEvent" in seen and "PartStartEvent" in seen
    keys = sorted(record.key for record in await manager.get_effects("e-1", 0))
    assert keys == [
        "ev__event_stream_handler/0",
        "ev__event_stream_handler/1",
        "ev__function_toolset__<agent>.call_tool:temp@pyd_ai_tool_call_id__temp",
        "ev__model.request_stream/0",
        "ev__model.request_stream/1",
        "run.input",
    ]
    delivered = len(seen)
    await durability.resume(agent, "e-1")
    assert len(seen) == delivered


@pytest.mark.parametrize(
    "setting",
    [{"idempotent": "yes"}, {"reconcile": "later"}, {"retries": 3}],
)
async def test_a_bad_tool_setting_is_refused_before_the_tool_runs(setting: Any) -> None:
    ran: list[int] = []
    manager = CheckpointManager()
    durability = AioCheckpointDurability(manager)
    agent = Agent(TestModel(), name="bad", capabilities=[durability])

    @agent.tool_plain(metadata={"aiocheckpoint": setting})
    async def act(x: int) -> int:
        ran.append(x)
        return x

    with pytest.raises(InvalidArgumentError, match=r"aiocheckpoint (tool )?setting"):
        await durability.run(agent, "go", workflow_id="bs-1")
    assert ran == []
    with pytest.raises(InvalidArgumentError, match="not a str"):
        AioCheckpointDurability(manager, idempotent_tools="act")
    with pytest.raises(InvalidArgumentError, match="is a bool"):
        AioCheckpointDurability(manager, tools_idempotent="yes")  # type: ignore[arg-type]


class Forecast(BaseModel):
    city: str
    at: datetime
    celsius: float


async def test_typed_tool_results_replay_and_a_deleted_run_starts_afresh(
    managers: Managers,
) -> None:
    made: list[str] = []

    def make(manager: CheckpointManager) -> tuple[AioCheckpointDurability[None], Agent[None, str]]:
        durability = AioCheckpointDurability(manager)
        agent = Agent(TestModel(), name="typed", capabilities=[durability])

        @agent.tool_plain
        async def forecast(city: str) -> Forecast:
            made.append(city)
            return Forecast(
                city=city, at=datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc), celsius=1.5
            )

        return durability, agent

    first = make(managers())
    result = await first[0].run(first[1], "weather", workflow_id="f-1")
    assert "2026-01-02T03:04:00Z" in result.output and len(made) == 1
    second = make(managers())
    assert (await second[0].resume(second[1], "f-1")).output == result.output
    assert len(made) == 1
    # The journal goes with its workflow: deleted, the same id is a new run.
    await second[0].manager.delete_checkpoints("f-1")
    assert await second[0].recorded_input("f-1") is None
    assert (await second[0].run(second[1], "weather", workflow_id="f-1")).output == result.output
    assert len(made) == 2


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_finished_ttl_sweep_deletes_a_finished_run_and_its_journal(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """A run is a workflow: past ``finished_ttl`` a sweep deletes it, journal and all, and
    the same id then runs afresh."""
    policy = RetentionPolicy(finished_ttl=timedelta(days=1))
    storage = make_storage(kind, tmp_path, pg_schema)
    async with storage, CheckpointManager(storage, retention=policy) as manager:
        durability = AioCheckpointDurability[None](manager)
        log = CallLog(tmp_path / "calls.log")
        agent = build_agent(durability, log)
        await durability.run(agent, prompt_for("t-1"), workflow_id="t-1")
        assert (await manager.sweep()).deleted == 0  # finished just now: kept
        later = datetime.now(timezone.utc) + timedelta(days=2)
        report = await manager.sweep(now=later)
        assert report.workflows_deleted == {"finished": 1}
        assert await durability.recorded_input("t-1") is None
        assert await manager.get_effects("t-1", 0) == []
        made = len(calls(log, "model"))
        result = await durability.run(agent, prompt_for("t-1"), workflow_id="t-1")
        assert result.output == expected_output("t-1")
        assert len(calls(log, "model")) == made + 3  # made again: the journal was gone
