"""Effects in doubt, from finding them to settling them (``docs/effects.md``).

A run that stops on an effect in doubt fails with :class:`~aiocheckpoint.EffectInDoubtError`,
and the workflow is FAILED once its retries (if any) are spent: runners no longer claim it.
Settling its last effect in doubt (:meth:`CheckpointManager.resolve_effect
<aiocheckpoint.CheckpointManager.resolve_effect>`) removes the only reason it failed, so the
workflow goes back to UNFINISHED, as :meth:`~aiocheckpoint.CheckpointManager.mark_workflow`
would put it, with its retry budget back. A workflow whose last run failed with another
error stays FAILED: the settle says nothing about that error.

The status change is written under the settle's lease, *before* the settle's own write: a
crash between the two leaves the workflow UNFINISHED with its effect still in doubt, so its
next run stops on the same effect again (FAILED, listed in doubt) and settling it again
completes both. The other order would leave it FAILED with nothing left to settle.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ._telemetry import round_trip
from .codec import EffectRecord, EffectState
from .errors import CheckpointCorruptedError, EffectInDoubtError
from .leases import Lease, WorkflowRecord, WorkflowStatus
from .storage.base import EffectStorage, StoredEffect, WorkflowStorage
from .storage.events import EventKind, EventNote, EventStorage

__all__ = ["open_records", "reopen_before_settle", "settled", "stopped_by_doubt"]

#: ``last_error["type"]`` of a run that stopped on an effect in doubt.
_IN_DOUBT = EffectInDoubtError.__qualname__
#: The error a settle that says "it did not happen" records (the next run calls it again).
_NOT_HAPPENED = {"type": "NotHappened", "message": "resolved: the call did not happen"}

#: ``open_effect(workflow_id, step, key, data)``: a stored record, unsealed and decoded.
OpenEffect = Callable[[str, int, str, bytes], Awaitable[EffectRecord]]


async def open_records(
    open_effect: OpenEffect, workflow_id: str, stored: Sequence[StoredEffect]
) -> list[EffectRecord]:
    """The stored records of ``workflow_id`` decoded; one filed under another name is corrupt."""
    records = []
    for item in stored:
        record = await open_effect(workflow_id, item.step, item.key, item.data)
        if (record.workflow_id, record.step, record.key) != (workflow_id, item.step, item.key):
            raise CheckpointCorruptedError(
                f"effect record {item.key!r} is stored under another workflow, step or key",
                workflow_id=workflow_id,
                step=item.step,
            )
        records.append(record)
    return records


def settled(found: EffectRecord, happened: bool, result: Any) -> EffectRecord:
    """The record that settles ``found``: done with ``result``, or failed (call it again)."""
    if happened:
        return found.finished(EffectState.DONE, result=result)
    return found.finished(EffectState.FAILED, error=dict(_NOT_HAPPENED))


def stopped_by_doubt(record: WorkflowRecord | None) -> bool:
    """Whether the workflow is FAILED because its last run stopped on an effect in doubt."""
    if record is None or record.status is not WorkflowStatus.FAILED:
        return False
    return record.last_error is not None and record.last_error.get("type") == _IN_DOUBT


async def reopen_before_settle(
    workflows: WorkflowStorage, effects: EffectStorage, settling: EffectRecord, fence: Lease
) -> bool:
    """Make the workflow UNFINISHED if ``settling`` is the last doubt it FAILED on.

    Called under the settle's lease ``fence``, before the settle's write (see the module
    docstring); True if it changed the status.
    """
    workflow_id = settling.workflow_id
    if not stopped_by_doubt(await round_trip(workflows.get_workflow, workflow_id)):
        return False
    doubts = await round_trip(effects.in_doubt_effects, workflow_id)
    if any((e.step, e.key) != (settling.step, settling.key) for e in doubts):
        return False
    unfinished = WorkflowStatus.UNFINISHED
    if isinstance(workflows, EventStorage):
        data = json.dumps({"step": settling.step, "key": settling.key})
        note = EventNote(EventKind.EFFECT_RESOLVED, data)
        await round_trip(
            workflows.set_workflow_status, workflow_id, unfinished, fence=fence, note=note
        )
    else:
        await round_trip(workflows.set_workflow_status, workflow_id, unfinished, fence=fence)
    return True
