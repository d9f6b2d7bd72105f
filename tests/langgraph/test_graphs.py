"""Real LangGraph graphs on the saver, compared with LangGraph's own savers.

The same scenario (a tool call, an interrupt resumed with ``Command``, a subgraph, time
travel from an older checkpoint and an ``update_state`` fork) runs on LangGraph's
``InMemorySaver`` and ``AsyncSqliteSaver`` and on ``AioCheckpointSaver`` over each
aiocheckpoint backend; the states and histories must be the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from aiocheckpoint import InvalidArgumentError
from tests.langgraph.conftest import SaverFactory
from tests.langgraph.graphs import agent_graph, question, resume, snapshot_view, values_view

THREAD = {"configurable": {"thread_id": "thread-1"}}


async def history(graph: Any, config: Any) -> list[dict[str, Any]]:
    return [snapshot_view(s) async for s in graph.aget_state_history(config)]


async def scenario(checkpointer: Any) -> dict[str, Any]:
    """Run the whole scenario on one checkpointer; return what must match everywhere."""
    graph = agent_graph(checkpointer)
    out: dict[str, Any] = {}
    first = await graph.ainvoke(question(), THREAD)
    out["interrupted"] = [i.value for i in first["__interrupt__"]]
    out["paused"] = snapshot_view(await graph.aget_state(THREAD))
    await graph.ainvoke(resume("yes"), THREAD)
    inner = (await graph.aget_state(THREAD, subgraphs=True)).tasks
    out["subgraph"] = [snapshot_view(task.state) for task in inner]
    out["final"] = values_view(await graph.ainvoke(resume("ok"), THREAD))
    out["history"] = await history(graph, THREAD)
    out["namespaces"] = sorted(
        {
            t.config["configurable"]["checkpoint_ns"].split(":")[0]
            async for t in checkpointer.alist({"configurable": {"thread_id": "thread-1"}})
        }
    )
    # Time travel: run again from the older, interrupted checkpoint.
    paused = [s async for s in graph.aget_state_history(THREAD) if s.next == ("approve",)]
    older = paused[0]
    out["replayed"] = values_view(await graph.ainvoke(resume("no"), older.config))
    # A fork: edit an older checkpoint's state and continue from the edit.
    forked = await graph.aupdate_state(
        older.config, {"messages": [AIMessage("edited answer", id="edited")]}
    )
    out["fork"] = snapshot_view(await graph.aget_state(forked))
    out["fork_final"] = values_view(await graph.ainvoke(resume("fork"), forked))
    out["history_after"] = await history(graph, THREAD)
    return out


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def reference(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    memory = await scenario(InMemorySaver())
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "ref.db")) as sqlite:
        return memory, await scenario(sqlite)


async def test_graph_matches_langgraph_savers(saver_factory: SaverFactory, tmp_path: Path) -> None:
    memory, sqlite = await reference(tmp_path)
    assert memory == sqlite  # the reference itself is deterministic
    async with saver_factory() as saver:
        ours = await scenario(saver)
    assert ours == memory
    assert ours["final"]["approved"] == "yes+ok"
    assert ours["subgraph"][0]["next"] == ["confirm"]
    assert ours["namespaces"] == ["", "summary"]
    assert ours["fork"]["values"]["messages"][-1] == ["AIMessage", "edited answer", []]


async def test_graph_resumes_from_a_reopened_store(saver_factory: SaverFactory) -> None:
    """A thread interrupted in one saver is resumed by another over the same store."""
    async with saver_factory() as saver:
        await agent_graph(saver).ainvoke(question(), THREAD)
        paused = snapshot_view(await agent_graph(saver).aget_state(THREAD))
    async with saver_factory() as again:
        graph = agent_graph(again)
        if paused != snapshot_view(await graph.aget_state(THREAD)):
            # The memory store is new on reopening: nothing to resume there.
            assert paused["next"] == ["approve"]
            return
        await graph.ainvoke(resume("later"), THREAD)
        final = await graph.ainvoke(resume("ok"), THREAD)
    assert final["approved"] == "later+ok"


async def test_sync_api_from_a_worker_thread(saver_factory: SaverFactory) -> None:
    """``invoke`` (the sync API) runs in a worker thread while the loop serves the saver."""
    async with saver_factory() as saver:
        graph = agent_graph(saver)
        await anyio.to_thread.run_sync(lambda: graph.invoke(question(), THREAD))
        await anyio.to_thread.run_sync(lambda: graph.invoke(resume("sync"), THREAD))
        final = await anyio.to_thread.run_sync(lambda: graph.invoke(resume("ok"), THREAD))
        assert final["approved"] == "sync+ok"
        assert len(await history(graph, THREAD)) == len(
            await anyio.to_thread.run_sync(lambda: list(graph.get_state_history(THREAD)))
        )
        with pytest.raises(InvalidArgumentError, match="inside the saver's own event loop"):
            saver.get_tuple(THREAD)
