"""The agent the pydantic-ai tests run: a scripted FunctionModel and two tools that log calls.

Every model request and tool call appends a line to a ``CallLog`` (fsynced) before it returns:
``wf|model|n|pid`` for the model's n-th request of run ``wf``, ``wf|tool|name|call id|arg|pid``
for a tool call. The script: request 0 looks up two cities (two tool calls in parallel),
request 1 books the better one, request 2 answers with what the tools returned. Everything
the run returns depends on the workflow id only, so an interrupted run ends as an
uninterrupted one.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from aiocheckpoint.integrations.pydantic_ai import AioCheckpointDurability
from tests._effect_kill import CallLog, Killer

NAME = "planner"
CITIES = ("Paris", "Rome")


def prompt_for(workflow_id: str) -> str:
    """The prompt of run ``workflow_id`` (the model reads the id back from it)."""
    return f"plan a trip for {workflow_id}"


def score(workflow_id: str, city: str) -> int:
    """What ``lookup`` returns: a number that depends on the run and the city."""
    return hashlib.sha256(f"{workflow_id}/{city}".encode()).digest()[0]


def booking(workflow_id: str, city: str) -> str:
    """What ``book`` returns."""
    return f"bk-{workflow_id}-{city}"


def expected_output(workflow_id: str) -> str:
    """The answer of run ``workflow_id``, interrupted or not."""
    scores = {city: score(workflow_id, city) for city in CITIES}
    best = max(CITIES, key=lambda city: (scores[city], city))
    return f"booked {booking(workflow_id, best)}; scores {scores['Paris']},{scores['Rome']}"


def _workflow_of(messages: list[ModelMessage]) -> str:
    first = messages[0]
    assert isinstance(first, ModelRequest)
    part = first.parts[-1]
    assert isinstance(part, UserPromptPart) and isinstance(part.content, str)
    return part.content.removeprefix("plan a trip for ")


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                out.setdefault(part.tool_name, []).append(part.content)
    return out


def script(messages: list[ModelMessage]) -> ModelResponse:
    """The model's answer to ``messages``: a function of the tool results so far."""
    workflow_id = _workflow_of(messages)
    n = sum(isinstance(m, ModelResponse) for m in messages)
    if n == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"city": c}) for c in CITIES])
    returns = _returns(messages)
    if n == 1:
        scores = {city: score(workflow_id, city) for city in CITIES}
        assert sorted(returns["lookup"]) == sorted(scores.values())
        best = max(CITIES, key=lambda city: (scores[city], city))
        return ModelResponse(parts=[ToolCallPart("book", {"city": best})])
    return ModelResponse(parts=[TextPart(expected_output(workflow_id))])


def build_agent(
    durability: AioCheckpointDurability[None], log: CallLog, killer: Killer | None = None
) -> Agent[None, str]:
    """The planner agent on ``durability``, logging its calls to ``log``."""

    def maybe_die() -> None:
        if killer is not None:
            killer.maybe()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        maybe_die()
        response = script(messages)
        n = sum(isinstance(m, ModelResponse) for m in messages)
        log.append(f"{_workflow_of(messages)}|model|{n}|{os.getpid()}")
        maybe_die()
        return response

    agent = Agent(FunctionModel(model), name=NAME, capabilities=[durability])

    def log_call(ctx: RunContext[None], tool: str, city: str) -> str:
        workflow_id = str(ctx.run_id).rsplit(":", 1)[0]
        maybe_die()
        log.append(f"{workflow_id}|tool|{tool}|{ctx.tool_call_id}|{city}|{os.getpid()}")
        maybe_die()
        return workflow_id

    @agent.tool(metadata={"aiocheckpoint": {"idempotent": True}})
    async def lookup(ctx: RunContext[None], city: str) -> int:
        """How good ``city`` is now."""
        return score(log_call(ctx, "lookup", city), city)

    @agent.tool
    async def book(ctx: RunContext[None], city: str) -> str:
        """Book a trip to ``city`` (not idempotent: it books again if called again)."""
        return booking(log_call(ctx, "book", city), city)

    return agent
