"""The runs tests/pydanticai/test_kill.py makes in forked children and SIGKILLs.

A child finishes the started runs and starts new ones (``trip-0``, ``trip-1``...), in order,
until it dies: a ``Killer`` SIGKILLs it at random points (before and after every effect
record's write, before each checkpoint, inside each model request and tool call before and
after its logged action, and in half the children at a random moment from a timer thread).
The final pass (``p == 0``) finishes every started run and starts none. A ``book`` call left
in doubt is settled from the call log, as an operator would: it happened if it was logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pydantic_ai import Agent

from aiocheckpoint import CheckpointManager, CheckpointStorage, EffectInDoubtError
from aiocheckpoint.integrations.pydantic_ai import AioCheckpointDurability
from tests._effect_kill import CallLog, Killer, hook_records
from tests.pydanticai.agents import booking, build_agent, prompt_for

PREFIX = "trip-"


def child(
    open_store: Callable[[], CheckpointStorage], log: Path, seed: int, p: float, timer_s: float
) -> None:
    """A forked child: finish the started runs and start new ones, dying at random."""
    killer = Killer(seed, p, timer_s)
    hook_records(killer)
    lines = CallLog(log).lines()
    # Runs go in order, each finished before the next starts: every run before the one of
    # the last logged call is finished (the final pass checks them all).
    first = int(lines[-1][0].removeprefix(PREFIX)) if lines and p else 0

    async def main() -> None:
        async with CheckpointManager(open_store()) as manager:
            durability = AioCheckpointDurability[None](manager)
            agent = build_agent(durability, CallLog(log), killer)
            for n in range(first, 10_000):
                workflow_id = f"{PREFIX}{n}"
                point = await manager.get_resume_point(workflow_id)
                if point is not None and point[0] >= 1:
                    continue  # finished
                started = point is not None or await manager.get_effects(workflow_id, 0)
                if not started and not p:
                    return  # the final pass: every started run is finished
                await finish(durability, agent, workflow_id, CallLog(log))

    asyncio.run(main())


async def finish(
    durability: AioCheckpointDurability[None],
    agent: Agent[None, str],
    workflow_id: str,
    log: CallLog,
) -> None:
    """Run (or resume) ``workflow_id`` to its end, settling what was left in doubt."""
    while True:
        try:
            await durability.run(agent, prompt_for(workflow_id), workflow_id=workflow_id)
            return
        except EffectInDoubtError as doubt:
            await settle(durability.manager, doubt, log)


async def settle(manager: CheckpointManager, doubt: EffectInDoubtError, log: CallLog) -> None:
    """Resolve a ``book`` call in doubt by checking the call log, as a human would."""
    assert ".call_tool:book@" in doubt.key, doubt.key
    call_id = doubt.key.split("@", 1)[1]
    logged = [
        line for line in log.lines() if line[:4] == [doubt.workflow_id, "tool", "book", call_id]
    ]
    result = None
    if logged:
        result = {"result": booking(doubt.workflow_id, logged[0][4]), "kind": "tool_return"}
    await manager.resolve_effect(
        doubt.workflow_id, doubt.step, doubt.key, happened=bool(logged), result=result
    )
