"""The runner that tests/test_rotation_kill.py forks during a rolling key rotation.

A runner is on the old keyring (``k1``) or the new one (``k1`` and ``k2``, writing under
``k2``). It claims workflows with a lease and runs them: 3 steps of 3, 4 and 5 effects, none
idempotent (an effect in doubt is settled from the call log, as an operator would). It
SIGKILLs itself at random points (tests/_effect_kill.py: around every effect record and
checkpoint write, inside each call, and at a timer's random moment). Besides each call, the
log gets a ``begin`` line when a step's body starts and a ``done`` line once its COMPLETED
checkpoint is stored, so a completed step that runs again shows as a ``begin`` after a
``done``. An old runner that meets a record it has no key for logs ``nokey`` and claims
another workflow; after a few it stops, as it would be restarted with the new keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiocheckpoint import (
    CheckpointManager,
    CheckpointStorage,
    EffectInDoubtError,
    Keyring,
    Lease,
    LeaseLostError,
    ResumableWorkflow,
    UnknownKeyError,
)
from tests._effect_kill import STEPS, CallLog, Killer, effects_in, expected, hook_records, settle
from tests._effect_kill import key_of as key_of

__all__ = ["key_of", "runner"]

#: An old runner stops after meeting this many workflows it has no key for.
_MISSING = 4


async def _run(
    manager: CheckpointManager, lease: Lease, log: CallLog, killer: Killer, ring: str
) -> None:
    """Run (or resume) the leased workflow to its end."""
    async with ResumableWorkflow(lease.workflow_id, manager, lease=lease) as wf:
        step = wf.resume_step
        while step < STEPS:
            try:
                async with wf.step(step, agent_id="agent"):
                    log.append(f"begin|{wf.workflow_id}|{step}|{lease.token}|{ring}")
                    await _effects(wf, step, log, killer, f"{lease.token}|{ring}")
            except EffectInDoubtError as doubt:
                await settle(manager, doubt, log, wf.lease)
                continue  # the step again
            log.append(f"done|{wf.workflow_id}|{step}|{lease.token}|{ring}")
            step += 1


async def _effects(
    wf: ResumableWorkflow, step: int, log: CallLog, killer: Killer, who: str
) -> None:
    async def act(label: int) -> dict[str, Any]:
        killer.maybe()  # inside the call, before its action
        log.append(f"{wf.workflow_id}|{step}|{label}||{who}")
        killer.maybe()  # inside the call, after its action
        return expected(wf.workflow_id, step, label)

    for label in range(effects_in(step)):
        result = await wf.effect(key_of(label), act, label)
        assert result == expected(wf.workflow_id, step, label), result


def runner(
    open_store: Callable[[], CheckpointStorage],
    log_path: Any,
    seed: int,
    keys: dict[str, bytes],
    ttl: float,
) -> None:
    """A forked runner on the keyring ``keys`` (its last id is the primary)."""
    ring = "new" if len(keys) > 1 else "old"
    keyring = Keyring(keys=keys, primary=list(keys)[-1])
    killer = Killer(seed, 0.04, timer_s=0.6)
    hook_records(killer)
    log = CallLog(log_path)

    async def main() -> None:
        missing = 0
        async with CheckpointManager(open_store(), encryption=keyring) as manager:
            while (lease := await manager.claim_workflow(f"runner-{seed}", ttl)) is not None:
                log.append(f"claim|{lease.workflow_id}|{lease.token}|{ring}")
                try:
                    await _run(manager, lease, log, killer, ring)
                except LeaseLostError:
                    log.append(f"lost|{lease.workflow_id}|{lease.token}|{ring}")
                except UnknownKeyError as exc:
                    key_id = getattr(exc, "key_id", "?")  # as a runner would say what it lacks
                    log.append(f"nokey|{lease.workflow_id}|{exc.step}|{key_id}|{ring}")
                    missing += 1
                    if missing == _MISSING:
                        return  # restarted with the new keys, as an operator would

    asyncio.run(main())
