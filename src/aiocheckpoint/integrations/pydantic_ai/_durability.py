"""``AioCheckpointDurability``: pydantic-ai's durable execution on a ``CheckpointManager``."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import anyio
from pydantic_ai.agent import AgentRunResult, EventStreamHandler
from pydantic_ai.agent.abstract import AbstractAgent
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    ToolsetKind,
    conversation_id_from_run_id,
)
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import ToolsetTool
from pydantic_core import to_jsonable_python

from ... import sleeping
from ...errors import CheckpointNotFoundError, InvalidArgumentError
from ...leases import Lease
from ...manager import CheckpointManager
from ...workflow import ResumableWorkflow
from ._backend import EffectConfig, EffectOperationBackend, check_config, merged, role_config
from ._scope import current_scope, run_scope
from ._sleep import Asleep, RunSleeping, has_timer, sleep_until_woken

OutputT = TypeVar("OutputT")

#: The effect that records a run's input (its first unit), read back by ``resume``.
INPUT_KEY = "run.input"
#: The one step of a run's workflow: every unit of the run is an effect of it.
RUN_STEP = 0


@dataclass(init=False, kw_only=True)
class AioCheckpointDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent's runs durable in an aiocheckpoint store (``docs/pydantic-ai.md``).

    Attach it to the agent (``Agent(..., name="support", capabilities=[durability])``) and
    start a run with :meth:`run`: the run is a workflow, and each of its durable units (a
    model request, a tool call, a toolset listing, an event handler call...) is one effect
    of that workflow's step, recorded once and replayed by every later run of the same
    workflow id. After a crash, :meth:`resume` finishes the run in any process: recorded
    units return their results without being called again.

    A unit that was running when the process died is *in doubt*, as ``wf.effect`` defines
    it: model requests (``model_requests_idempotent``), event handler calls and read-only
    units are made again; a tool call raises :class:`~aiocheckpoint.EffectInDoubtError`
    unless the tool is idempotent (``idempotent_tools``, ``tools_idempotent``, or the
    tool's metadata ``{"aiocheckpoint": {"idempotent": True}}``; a ``"reconcile"``
    callback there asks whether it happened).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="aiocheckpoint",
        durable_unit_noun="effect",
        durable_container_noun="workflow",
        codec=JSON_CODEC,  # results are journaled as pydantic's JSON form, never pickled
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",  # units run in the run's own process
            "dynamic": "enter-never",
        },
        journal_discovery=True,
        sequential_tools_in_durable_context=False,  # tool calls are keyed by their call id
        tool_config_key="aiocheckpoint",
        control_flow_error_types=(Asleep,),  # a long durable sleep ends the run: no failure
    )

    def __init__(
        self,
        manager: CheckpointManager,
        *,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        idempotent_tools: Collection[str] = (),
        tools_idempotent: bool = False,
        model_requests_idempotent: bool = True,
        capabilities_idempotent: bool = False,
    ) -> None:
        """Durability on ``manager``'s store.

        ``name`` names the agent's units (defaults to the agent's ``name``); ``models``
        registers extra models by id, as for pydantic-ai's other engines.
        """
        if not isinstance(manager, CheckpointManager):
            raise InvalidArgumentError(
                f"manager must be a CheckpointManager, not {type(manager).__qualname__}"
            )
        if isinstance(idempotent_tools, str):
            raise InvalidArgumentError("idempotent_tools is a collection of tool names, not a str")
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self.manager = manager
        self._idempotent_tools = frozenset(idempotent_tools)
        self._tool_config = check_config({"idempotent": tools_idempotent})
        self._model_config = check_config({"idempotent": model_requests_idempotent})
        self._capability_config = check_config({"idempotent": capabilities_idempotent})

    @property
    def in_durable_context(self) -> bool:
        """Whether a run started by :meth:`run` is in progress in this task."""
        return current_scope() is not None

    def get_default_run_id(self) -> str | None:
        """The run's id: its workflow id and its ordinal, the same on every run of it."""
        scope = current_scope()
        if scope is None:
            return None
        return f"{scope.workflow.workflow_id}:{scope.next_number('run_id')}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        """A conversation id derived from the replay-stable run id."""
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def durable_sleep(self, seconds: float) -> None:
        """Sleep durably: end the run until the store wakes it, or wait a short while here.

        A sleep of more than :data:`~aiocheckpoint.sleeping.SHORT_SLEEP` seconds, on a store
        that keeps workflow records (in-memory, SQLite, PostgreSQL), is the store's durable
        timer, as for ``wf.sleep``: its wake-up time is written by the store's clock, the
        run ends with :class:`RunSleeping`, ``claim_workflow`` hands it out only after that
        time, and :meth:`resume` replays the run's units and goes on after the sleep (not
        taken again). A shorter one, or any on the file store, waits in this process until
        a deadline recorded in the journal: a resumed run waits only what is left.
        """
        scope = current_scope()
        if scope is None:
            await anyio.sleep(max(seconds, 0))
            return
        key = f"{self.name}__sleep/{scope.next_number('sleep')}"
        workflow = scope.workflow
        if seconds > sleeping.SHORT_SLEEP and has_timer(workflow.checkpoint_manager):
            await sleep_until_woken(workflow, key, seconds)
            return
        deadline = await workflow.effect(key, sleep_deadline, seconds, idempotent=True)
        await anyio.sleep(max(float(deadline) - time.time(), 0))

    def get_durable_operation_backend(self) -> DurableOperationBackend[EffectConfig]:
        """Each unit as one ``wf.effect``, named by pydantic-ai's journal convention."""
        resolve = self._build_resolve_tool_config(self._tool_config)

        def tool_config(
            operation_id: DurableOperationId, tool: object | None, tool_name: str
        ) -> EffectConfig | Literal[False]:
            config = resolve(cast("ToolsetTool[Any] | None", tool), tool_name)
            if config is False:
                return False
            if tool_name in self._idempotent_tools:
                return merged(config, {"idempotent": True})
            return merged(config)

        return EffectOperationBackend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=role_config(
                model=self._model_config,
                event={"idempotent": True},
                capability=self._capability_config,
                tool=self._tool_config,
                resolve_tool=tool_config,
            ),
        )

    def _toolset_base_config(self, kind: ToolsetKind) -> Any:
        return self._tool_config

    async def run(
        self,
        agent: AbstractAgent[AgentDepsT, OutputT],
        user_prompt: str | None = None,
        *,
        workflow_id: str,
        lease_owner: str | None = None,
        lease: Lease | None = None,
        **run_kwargs: Any,
    ) -> AgentRunResult[OutputT]:
        """Run ``agent`` durably as workflow ``workflow_id``, or finish that run.

        The first call records ``user_prompt`` and runs; a later call with the same id (after
        a crash, in any process) replays every recorded unit and runs the rest. A finished
        run's id returns its result again, calling nothing. ``run_kwargs`` (``deps``,
        ``message_history``...) go to ``agent.run`` and are not stored: pass the same ones
        again. ``lease_owner`` holds the workflow's lease for the run; ``lease`` drives a
        run handed out by ``claim_workflow``. A long durable sleep ends the run with
        :class:`RunSleeping` (see :meth:`durable_sleep`).
        """
        self._check_agent(agent)
        given = _input(user_prompt)
        recorded = await self.recorded_input(workflow_id)
        if recorded is not None and recorded != given:
            raise InvalidArgumentError(
                f"workflow {workflow_id!r} was started with another prompt "
                "(resume it with resume(), or use a new workflow id)"
            )
        workflow = ResumableWorkflow(
            workflow_id, self.manager, lease_owner=lease_owner, lease=lease
        )
        try:
            async with workflow as wf, wf.step(RUN_STEP, agent_id=self._agent_name(agent)):
                with run_scope(wf):
                    await wf.effect(INPUT_KEY, record_input, given, idempotent=True)
                    result: AgentRunResult[OutputT] = await agent.run(user_prompt, **run_kwargs)
                wf.state.set("output", to_jsonable_python(result.output))
        except Asleep as asleep:
            raise RunSleeping(workflow_id, asleep.seconds, asleep.wake_at) from None
        return result

    async def resume(
        self,
        agent: AbstractAgent[AgentDepsT, OutputT],
        workflow_id: str,
        *,
        lease: Lease | None = None,
        **run_kwargs: Any,
    ) -> AgentRunResult[OutputT]:
        """Finish the run ``workflow_id`` that :meth:`run` started, with its recorded prompt.

        After a crash, or woken from a long durable sleep (pass the ``lease`` that
        ``claim_workflow`` returned). Raises :class:`~aiocheckpoint.CheckpointNotFoundError`
        when no run of that id was started in this store.
        """
        recorded = await self.recorded_input(workflow_id)
        if recorded is None:
            raise CheckpointNotFoundError(workflow_id, RUN_STEP)
        prompt = recorded["user_prompt"]
        return await self.run(agent, prompt, workflow_id=workflow_id, lease=lease, **run_kwargs)

    async def recorded_input(self, workflow_id: str) -> dict[str, Any] | None:
        """The input the run ``workflow_id`` was started with (None: not started)."""
        for record in await self.manager.get_effects(workflow_id, RUN_STEP):
            if record.key == INPUT_KEY and isinstance(record.result, dict):
                return record.result
        return None

    def _check_agent(self, agent: AbstractAgent[Any, Any]) -> None:
        bound = AioCheckpointDurability.from_agent(agent)
        if bound is None or bound.manager is not self.manager:
            raise InvalidArgumentError(
                "the agent does not run with this AioCheckpointDurability: "
                "pass it in the agent's capabilities=[...]"
            )

    def _agent_name(self, agent: AbstractAgent[Any, Any]) -> str:
        return self.name or agent.name or "agent"


def _input(user_prompt: object) -> dict[str, Any]:
    if user_prompt is not None and not isinstance(user_prompt, str):
        raise InvalidArgumentError(
            f"a durable run's prompt is a str or None, not {type(user_prompt).__qualname__}"
        )
    return {"user_prompt": user_prompt}


async def record_input(value: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
    """The run's input, as its journal records it (the function ``run.input`` names)."""
    return value


async def sleep_deadline(seconds: float, idempotency_key: str | None = None) -> float:
    """When a durable sleep of ``seconds`` that starts now ends (a POSIX time)."""
    return time.time() + max(seconds, 0)
