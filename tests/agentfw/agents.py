"""An agent workflow for the tests: two ``AgentExecutor``s over a scripted agent (offline).

The framework's agent types (``Message``, ``Content``, ``AgentResponse``, and the
executors' request and response dataclasses) are registered in the manager's registry, as
docs/agent-framework.md shows: the first two through their own ``to_dict`` and
``from_dict``.
"""

from __future__ import annotations

from typing import Any

from agent_framework import (
    AgentExecutor,
    AgentExecutorRequest,
    AgentExecutorResponse,
    AgentResponse,
    BaseAgent,
    Content,
    Message,
    Workflow,
    WorkflowBuilder,
)

from aiocheckpoint import TypeRegistry

AGENTS = "agents"


class Scripted(BaseAgent):
    """Answers each run with what it saw: the last message's text, behind its name."""

    async def run(self, messages: Any = None, *, stream: bool = False, **kwargs: Any) -> Any:
        assert not stream
        last = messages[-1] if isinstance(messages, list) else messages
        text = last.text if isinstance(last, Message) else str(last)
        return AgentResponse(messages=[Message("assistant", [f"{self.name} saw: {text}"])])


def agent_types(types: TypeRegistry) -> TypeRegistry:
    """Register the framework's agent types in ``types``; return it."""
    for cls in (Message, Content, AgentResponse):
        types.register(cls, name=f"af.{cls.__name__}", encode=_to_dict, decode=cls.from_dict)
    types.register(AgentExecutorRequest, name="af.AgentExecutorRequest")
    types.register(AgentExecutorResponse, name="af.AgentExecutorResponse")
    return types


def _to_dict(value: Any) -> Any:
    return value.to_dict()


def build_agents(storage: Any) -> Workflow:
    """``writer`` answers the input; ``reviewer`` answers the writer's answer (the output)."""
    writer = AgentExecutor(Scripted(name="writer"), id="writer")
    reviewer = AgentExecutor(Scripted(name="reviewer"), id="reviewer")
    builder = WorkflowBuilder(
        name=AGENTS, start_executor=writer, checkpoint_storage=storage, output_from=[reviewer]
    )
    return builder.add_edge(writer, reviewer).build()


def texts(outputs: list[Any]) -> list[str]:
    """The outputs' texts (an ``AgentResponse`` compares by identity)."""
    return [output.text for output in outputs]
