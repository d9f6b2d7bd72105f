"""Quickstart: a multi-agent workflow that crashes part way, then resumes without redoing work.

Run it with ``python examples/quickstart.py``. Checkpoints go to a SQLite database (the
embedded default: no server needed). The first run is interrupted at step 2; the second run
resumes from the database and runs only the steps that had not completed, so no agent's
"tool call" happens twice.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from aiocheckpoint import CheckpointManager, ResumableWorkflow, SQLiteCheckpointStorage

AGENTS = ["planner", "researcher", "analyst", "writer"]


class Interrupted(Exception):
    """Stands in for a crash, a deploy or a lost machine."""


async def call_tool(agent: str, topic: str, tool_log: list[str]) -> str:
    """A stand-in for an expensive LLM or tool call: we record every call made."""
    tool_log.append(agent)
    await asyncio.sleep(0.01)
    return f"{agent} output on {topic}"


async def run(db: Path, tool_log: list[str], interrupt_at: int | None = None) -> dict[str, str]:
    """Run (or resume) the workflow; raise Interrupted when reaching ``interrupt_at``."""
    async with (
        CheckpointManager(SQLiteCheckpointStorage(db), max_checkpoints=10) as manager,
        ResumableWorkflow("report-42", manager, initial_state={"topic": "tides"}) as wf,
    ):
        if wf.is_resumed:
            print(f"resuming at step {wf.resume_step}")
        for step, agent in enumerate(AGENTS):
            if wf.is_completed(step):
                continue  # done in an earlier run: skip it, don't call the tool again
            if step == interrupt_at:
                raise Interrupted(f"interrupted before step {step}")
            async with wf.step(step, agent_id=agent):
                result = await call_tool(agent, wf.state.get("topic"), tool_log)
                wf.state.set(f"results.{agent}", result, agent_id=agent)
                wf.metrics.total_tokens += 100
        results: dict[str, str] = wf.state.get("results")
        return results


async def main(db: Path) -> None:
    """Run once with an interruption, then again to finish."""
    tool_log: list[str] = []
    try:
        await run(db, tool_log, interrupt_at=2)
    except Interrupted as exc:
        print(f"first run: {exc}; tool calls so far: {tool_log}")
    results = await run(db, tool_log)
    print(f"second run finished; all tool calls: {tool_log}")
    assert tool_log == AGENTS, "a completed step ran twice"
    for agent, text in results.items():
        print(f"  {agent}: {text}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp) / "checkpoints.db"))
