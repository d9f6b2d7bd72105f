"""The workflow that tests/test_effects_kill.py runs in forked children and SIGKILLs.

Each workflow has 3 steps of 3, 4 and 5 effects (odd ones with explicit keys, even ones
keyed by call order; the last of each step idempotent). Every effect's function appends
a line to a call log and fsyncs it *before* returning: the durable count of the calls that
happened. A child may SIGKILL itself at any of the points a crash can fall on: before an
effect record is written and after it (before the intent, between intent and call, between
call and result, after the result), inside the call before and after its action, and
before each step's checkpoint; and, from a timer thread, at a random moment (inside a
storage write, a group commit, the event loop: anywhere).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiocheckpoint import (
    CheckpointManager,
    CheckpointStorage,
    EffectInDoubtError,
    EffectRecord,
    Lease,
    LeaseLostError,
    ResumableWorkflow,
)
from aiocheckpoint.journal import EffectJournal

STEPS = 3


def effects_in(step: int) -> int:
    """How many effects step ``step`` makes (3 to 5)."""
    return 3 + step


def key_of(label: int) -> str | None:
    """The key effect ``label`` is called with (None: derived from the call order)."""
    return f"e{label}" if label % 2 else None


def label_of(key: str) -> int:
    """Which effect a recorded key stands for."""
    if key.startswith("#"):
        return 2 * int(key[1:])  # the derived keys are the even labels, in order
    return int(key[1:])


def expected(workflow_id: str, step: int, label: int) -> dict[str, Any]:
    """What effect ``label`` of ``step`` returns."""
    return {"wf": workflow_id, "step": step, "label": label}


class Killer:
    """SIGKILLs this process at a point with probability ``p``.

    Half the children also arm a timer that SIGKILLs the process at a random moment of its
    first ``timer_s`` seconds, wherever it is (a write in a worker thread included).
    """

    def __init__(self, seed: int, p: float, timer_s: float = 0.0) -> None:
        self.random = random.Random(seed)
        self.p = p
        if p and timer_s and self.random.random() < 0.5:
            timer = threading.Timer(self.random.uniform(0, timer_s), _die)
            timer.daemon = True
            timer.start()

    def maybe(self) -> None:
        """Die here, sometimes."""
        if self.p and self.random.random() < self.p:
            os.kill(os.getpid(), signal.SIGKILL)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class CallLog:
    """The durable log of calls: one fsynced line per call that happened."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, line: str) -> None:
        """Append ``line`` and fsync it before returning."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def lines(self) -> list[list[str]]:
        """Every logged call, split into its fields."""
        if not self.path.exists():
            return []
        return [line.split("|") for line in self.path.read_text().splitlines()]


def hook_records(killer: Killer) -> None:
    """Make every effect record and checkpoint write a kill point, before and after."""
    # Every effect write, a runner's (record_effect) or a settle's, is EffectJournal.record.
    record = EffectJournal.record
    checkpoint = CheckpointManager.create_checkpoint

    async def record_effect(self: EffectJournal, *args: Any, **kwargs: Any) -> EffectRecord:
        killer.maybe()
        stored = await record(self, *args, **kwargs)
        killer.maybe()
        return stored

    async def create_checkpoint(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        killer.maybe()
        return await checkpoint(self, *args, **kwargs)

    EffectJournal.record = record_effect  # type: ignore[method-assign]
    CheckpointManager.create_checkpoint = create_checkpoint  # type: ignore[method-assign]


async def run_workflow(
    manager: CheckpointManager,
    workflow_id: str,
    log: CallLog,
    killer: Killer,
    *,
    lease: Lease | None = None,
    stall: Callable[[], None] | None = None,
) -> None:
    """Run (or resume) the workflow; settle in-doubt effects from the call log on the way."""
    async with ResumableWorkflow(workflow_id, manager, lease=lease) as wf:
        step = wf.resume_step
        while step < STEPS:
            try:
                async with wf.step(step, agent_id="agent"):
                    await _effects(wf, step, log, killer, stall)
            except EffectInDoubtError as doubt:
                await settle(manager, doubt, log, wf.lease)
                continue  # the step again
            step += 1


async def _effects(
    wf: ResumableWorkflow,
    step: int,
    log: CallLog,
    killer: Killer,
    stall: Callable[[], None] | None,
) -> None:
    token = "" if wf.lease is None else str(wf.lease.token)

    async def act(label: int, idempotency_key: str = "") -> dict[str, Any]:
        killer.maybe()  # inside the call, before its action
        log.append(f"{wf.workflow_id}|{step}|{label}|{idempotency_key}|{token}")
        killer.maybe()  # inside the call, after its action
        return expected(wf.workflow_id, step, label)

    last = effects_in(step) - 1
    for label in range(effects_in(step)):
        if stall is not None:
            stall()  # a paused runner, about to start an effect
        result = await wf.effect(key_of(label), act, label, idempotent=label == last)
        assert result == expected(wf.workflow_id, step, label), result


async def settle(
    manager: CheckpointManager, doubt: EffectInDoubtError, log: CallLog, lease: Lease | None
) -> None:
    """Resolve an in-doubt effect as a human would: by checking whether it happened."""
    label = label_of(doubt.key)
    wanted = [doubt.workflow_id, str(doubt.step), str(label)]
    happened = any(line[:3] == wanted for line in log.lines())
    result = expected(doubt.workflow_id, doubt.step, label) if happened else None
    await manager.resolve_effect(
        doubt.workflow_id, doubt.step, doubt.key, happened=happened, result=result, lease=lease
    )


def child(
    open_store: Callable[[], CheckpointStorage], log: Path, seed: int, p: float, timer_s: float
) -> None:
    """A forked child: run the unfinished workflows (names in order), dying at random."""
    killer = Killer(seed, p, timer_s)
    hook_records(killer)
    calls = CallLog(log).lines()
    # Children go in order and finish a workflow before the next: every one before the
    # workflow of the last logged call is finished (the final pass checks them all).
    first = int(calls[-1][0].removeprefix("wf-")) if calls and p else 0

    async def main() -> None:
        async with CheckpointManager(open_store()) as manager:
            for n in range(first, 10_000):
                workflow_id = f"wf-{n}"
                point = await manager.get_resume_point(workflow_id)
                if point is not None and point[0] >= STEPS:
                    continue
                started = point is not None or await manager.get_effects(workflow_id, 0)
                if not started and not p:
                    return  # the final pass: every started workflow is finished
                await run_workflow(manager, workflow_id, CallLog(log), killer)

    asyncio.run(main())


def pool_child(
    open_store: Callable[[], CheckpointStorage], log: Path, seed: int, ttl: float
) -> None:
    """A forked runner: claim workflows with a lease and run them; die or stall at random.

    A stall blocks the event loop for longer than the lease (a paused process: its lease
    is not renewed and another runner takes the workflow over) before an effect is called.
    Every claim is logged after it returns, so a call logged after a newer claim of the
    same workflow would be a stale runner's call after takeover.
    """
    killer = Killer(seed, 0.01)
    stalls = random.Random(seed)
    hook_records(killer)
    calls = CallLog(log)

    def stall() -> None:
        if stalls.random() < 0.03:
            time.sleep(ttl * 1.5)

    async def main() -> None:
        async with CheckpointManager(open_store()) as manager:
            while (lease := await manager.claim_workflow(f"runner-{seed}", ttl)) is not None:
                calls.append(f"claim|{lease.workflow_id}|{lease.token}")
                try:
                    await run_workflow(
                        manager, lease.workflow_id, calls, killer, lease=lease, stall=stall
                    )
                except LeaseLostError:
                    calls.append(f"lost|{lease.workflow_id}|{lease.token}")
                    continue

    asyncio.run(main())
