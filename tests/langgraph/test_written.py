"""A task's written message is serialized once: its write's encoding serves the checkpoint's
list (``integrations/langgraph/written.py``) exactly when that gives the same bytes."""

from __future__ import annotations

import gc
from typing import Annotated, Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    ToolMessage,
)
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from aiocheckpoint.integrations.langgraph import AioCheckpointSaver, records, written
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage

MESSAGES: list[Any] = [
    AIMessage("plain", id="a"),
    AIMessage(
        "",
        id="b",
        tool_calls=[{"name": "add", "args": {"a": 2, "b": [1, {"c": None}]}, "id": "c1"}],
        additional_kwargs={"k": {"nested": [1.5, True, "é\u0000"]}},
        response_metadata={"model": "x", 7: "non-str key"},
    ),
    HumanMessage([{"type": "text", "text": "blocks"}, {"type": "image", "url": "u"}], id="c"),
    ToolMessage("42", tool_call_id="c1", id="d", artifact={"rows": list(range(40))}),
    AIMessage("long " * 20_000, id="e"),  # over 64 KiB: the array header is still 0x91
]


class Sub(JsonPlusSerializer):
    """A serializer of another class: its list encoding is not assumed to be msgpack's."""


def note(serde: Any, value: Any) -> written.Noted:
    noted: written.Noted = {}
    records.merge_writes(serde, [], [("messages", value)], "task", "", noted)
    return noted


def checkpoint_list(serde: Any, value: list[Any], noted: written.Noted) -> list[str]:
    cp = generate_checkpoint(channel_values={"messages": value})
    cp["channel_versions"] = {"messages": 1}
    state, _ = records.checkpoint_state(serde, cp, {}, {}, {}, noted=noted)
    return list(state["values"]["messages"]["items"])


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: str(m.id))
def test_an_item_written_alone_in_a_list_is_encoded_as_the_checkpoint_encodes_it(
    message: Any,
) -> None:
    """The write's ``[message]`` gives, less its array byte, the message's own encoding:
    the checkpoint's list stores the same text it would have made itself."""
    serde = JsonPlusSerializer()
    noted = note(serde, [message])
    assert [entry[2] for entry in noted.values()] == [records.typed(serde, message)]
    assert checkpoint_list(serde, [message], noted) == [records.typed(serde, message)]
    assert noted == {}  # taken by the checkpoint that used it


def test_the_checkpoint_reuses_the_writes_encoding_rather_than_serializing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A noted item is not serialized for the checkpoint's list; an item not noted is."""
    serde = JsonPlusSerializer()
    old, new = AIMessage("old", id="old"), AIMessage("new", id="new")
    noted = note(serde, [new])
    encoded: list[Any] = []
    plain = records.typed

    def counting(serde_: Any, value: Any) -> str:
        encoded.append(value)
        return plain(serde_, value)

    monkeypatch.setattr(records, "typed", counting)
    codes = checkpoint_list(serde, [old, new], noted)
    assert [id(value) for value in encoded if isinstance(value, AIMessage)] == [id(old)]
    assert codes == [plain(serde, old), plain(serde, new)]


@pytest.mark.parametrize(
    ("serde", "value", "kept"),
    [
        (JsonPlusSerializer(), AIMessage("bare", id="x"), True),  # the same call: any serde
        (Sub(), AIMessage("bare", id="x"), True),
        (Sub(), [AIMessage("in a list", id="x")], False),  # list bytes not assumed
        (JsonPlusSerializer(), [AIMessage("no id")], False),  # add_messages sets one later
        (JsonPlusSerializer(), [AIMessage("a", id="1"), AIMessage("b", id="2")], False),
        (JsonPlusSerializer(), [{"id": "x", "content": "a dict"}], False),  # no weak reference
        (JsonPlusSerializer(), ("tuple", "x"), False),
        (JsonPlusSerializer(), 7, False),
        (JsonPlusSerializer(), None, False),
    ],
)
def test_only_items_with_provably_the_same_encoding_are_noted(
    serde: Any, value: Any, kept: bool
) -> None:
    noted = note(serde, value)
    assert bool(noted) is kept
    if kept:
        assert [entry[2] for entry in noted.values()] == [records.typed(serde, value)]


def test_an_item_changed_or_gone_since_its_write_is_encoded_again() -> None:
    """A new id (the only change LangGraph makes in place) or a dead item: not reused."""
    serde = JsonPlusSerializer()
    message = AIMessage("before", id="m")
    noted = note(serde, [message])
    message.id = "m2"
    assert written.reused(noted, message) is None
    gone = AIMessage("gone", id="g")
    noted = note(serde, [gone])
    (key,) = noted
    del gone
    gc.collect()
    newcomer = AIMessage("another object", id="g")
    noted = {id(newcomer): noted[key]}  # as if it took the dead item's address
    assert written.reused(noted, newcomer) is None


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    n: int


def _chat(checkpointer: Any) -> Any:
    def speak(state: Chat) -> dict[str, Any]:
        n = state["n"]
        # Every other message without an id: add_messages gives it one after the write.
        message = AIMessage(f"turn {n}", id=None if n % 2 else f"m{n}")
        return {"messages": [message] if n % 3 else message, "n": n + 1}

    graph = StateGraph(Chat)
    graph.add_node("speak", speak)
    graph.add_edge(START, "speak")
    graph.add_conditional_edges("speak", lambda s: "speak" if s["n"] < 12 else END)
    return graph.compile(checkpointer=checkpointer)


async def test_a_graph_reads_back_what_langgraphs_own_saver_does() -> None:
    """Messages written in lists and bare, with ids and without: every checkpoint of the
    thread reads back as ``InMemorySaver``'s, message ids included."""
    config: Any = {"configurable": {"thread_id": "t"}}
    start = {"messages": [HumanMessage("go", id="go")], "n": 0}
    theirs = _chat(InMemorySaver())
    await theirs.ainvoke(start, config)
    async with AioCheckpointSaver(InMemoryCheckpointStorage()) as saver:
        ours = _chat(saver)
        await ours.ainvoke(start, config)
        got = [s.values async for s in ours.aget_state_history(config)]
    want = [s.values async for s in theirs.aget_state_history(config)]

    def view(values: dict[str, Any]) -> list[Any]:
        # Generated ids differ between the two runs; a message's id is kept where given.
        return [
            (m.content, m.id if str(m.id).count("-") != 4 else "generated")
            for m in values.get("messages", [])
        ]

    assert [view(v) for v in got] == [view(v) for v in want]
    assert len(got) == 14
