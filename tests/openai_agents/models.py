"""A scripted, offline ``agents.models.interface.Model``: it replays the turns it is given."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Usage
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


def text(content: str) -> ResponseOutputMessage:
    """An assistant message saying ``content``."""
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=content, annotations=[])],
    )


def call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    """A call of tool ``name``."""
    return ResponseFunctionToolCall(
        id=f"fc-{call_id}",
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(arguments),
    )


class ScriptedModel(Model):
    """Answers each request with the next scripted turn, and records every input it saw."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = list(turns)
        self.inputs: list[str | list[TResponseInputItem]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.inputs.append(input)
        output = self.turns.pop(0)
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the scripted model does not stream")
