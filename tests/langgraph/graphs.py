"""Real LangGraph graphs for the saver's tests (and the bench): no model, no network.

``agent_graph`` is a chat agent in miniature: a model node (scripted, deterministic) that
calls a tool through LangGraph's ``ToolNode``, a human approval step (``interrupt()``,
resumed with ``Command(resume=...)``) and a summarising subgraph that interrupts too.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    approved: str


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model(state: State) -> dict[str, Any]:
    """A scripted model: call ``add`` for a question, then answer with its result."""
    last = state["messages"][-1]
    n = len(state["messages"])
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(f"the sum is {last.content}", id=f"ai-{n}")]}
    call = {"name": "add", "args": {"a": 2, "b": 3}, "id": f"call-{n}", "type": "tool_call"}
    return {"messages": [AIMessage("", tool_calls=[call], id=f"ai-{n}")]}


def route(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else "approve"


def approve(state: State) -> dict[str, Any]:
    """A human approves the answer: the graph stops here until it is resumed."""
    answer = interrupt({"question": "send this answer?", "answer": state["messages"][-1].content})
    return {"approved": str(answer)}


def _summary_graph() -> Any:
    def summarise(state: State) -> dict[str, Any]:
        text = f"summary of {len(state['messages'])} messages, approved={state['approved']}"
        return {"messages": [AIMessage(text, id=f"sum-{len(state['messages'])}")]}

    def confirm(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "keep the summary?"})
        return {"approved": f"{state['approved']}+{answer}"}

    sub = StateGraph(State)
    sub.add_node("summarise", summarise)
    sub.add_node("confirm", confirm)
    sub.add_edge(START, "summarise")
    sub.add_edge("summarise", "confirm")
    sub.add_edge("confirm", END)
    return sub.compile()


def agent_graph(checkpointer: Any) -> Any:
    """The agent graph, compiled with ``checkpointer``."""
    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([add]))
    graph.add_node("approve", approve)
    graph.add_node("summary", _summary_graph())
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", "approve"])
    graph.add_edge("tools", "model")
    graph.add_edge("approve", "summary")
    graph.add_edge("summary", END)
    return graph.compile(checkpointer=checkpointer)


def question(text: str = "what is 2 + 3?") -> dict[str, Any]:
    """The first input of a thread."""
    return {"messages": [HumanMessage(text, id="human-0")], "approved": ""}


def resume(answer: str) -> Command[Any]:
    """The input that resumes an interrupted thread."""
    return Command(resume=answer)


def message_view(message: Any) -> list[Any]:
    """A message without its id (LangGraph gives tool messages random ids)."""
    calls = [(c["name"], c["args"]) for c in getattr(message, "tool_calls", [])]
    return [type(message).__name__, message.content, calls]


def values_view(values: dict[str, Any]) -> dict[str, Any]:
    """A state's values, comparable between runs."""
    return {
        "messages": [message_view(m) for m in values.get("messages", [])],
        "approved": values.get("approved"),
    }


def snapshot_view(snapshot: Any) -> dict[str, Any]:
    """A ``StateSnapshot``, comparable between runs and savers (no ids or times)."""
    return {
        "values": values_view(snapshot.values),
        "next": list(snapshot.next),
        "step": snapshot.metadata.get("step") if snapshot.metadata else None,
        "source": snapshot.metadata.get("source") if snapshot.metadata else None,
        "interrupts": [i.value for task in snapshot.tasks for i in task.interrupts],
        "has_parent": snapshot.parent_config is not None,
    }


class LoopState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    count: int


def loop_graph(checkpointer: Any, *, steps: int, pause: float = 0.0, report: Any = None) -> Any:
    """A node that runs ``steps`` times, each time appending a ~1 KB message.

    ``pause`` seconds are spent in each step (the process tests kill or race it there);
    ``report(count)`` is called as each step starts.
    """

    def work(state: LoopState) -> dict[str, Any]:
        count = state.get("count", 0)
        if report is not None:
            report(count)
        if pause:
            time.sleep(pause)
        text = f"step {count}: " + "x" * 1000
        return {"messages": [AIMessage(text, id=f"m-{count}")], "count": count + 1}

    def again(state: LoopState) -> str:
        return "work" if state["count"] < steps else END

    graph = StateGraph(LoopState)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    graph.add_conditional_edges("work", again, ["work", END])
    return graph.compile(checkpointer=checkpointer)


def loop_input() -> dict[str, Any]:
    """The first input of a loop thread."""
    return {"messages": [HumanMessage("go", id="go")], "count": 0}
