"""A small Agent Framework workflow: two executors in a loop, with shared state."""

from __future__ import annotations

from typing import Any

import anyio
from agent_framework import Workflow, WorkflowBuilder, WorkflowContext, executor

NAME = "counter"


def build(storage: Any, delay: float = 0.0) -> Workflow:
    """``add`` sums what it receives into the state and passes n + 1 to ``check``, which
    sends it back below 5 and yields the total after; one checkpoint per superstep.
    ``delay`` seconds of sleep in each step give a killer time to land mid-run."""

    @executor(id="add")
    async def add(n: int, ctx: WorkflowContext[int]) -> None:
        await anyio.sleep(delay)
        ctx.set_state("total", (ctx.get_state("total") or 0) + n)
        ctx.set_state("seen", [*(ctx.get_state("seen") or []), n])
        await ctx.send_message(n + 1)

    @executor(id="check")
    async def check(n: int, ctx: WorkflowContext[int, str]) -> None:
        if n > 4:
            await ctx.yield_output(f"total={ctx.get_state('total')} seen={ctx.get_state('seen')}")
        else:
            await ctx.send_message(n)

    builder = WorkflowBuilder(name=NAME, start_executor=add, checkpoint_storage=storage)
    return builder.add_edge(add, check).add_edge(check, add).build()
