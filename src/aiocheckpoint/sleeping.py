"""Durable sleep: :meth:`ResumableWorkflow.sleep <aiocheckpoint.ResumableWorkflow.sleep>`.

A sleep longer than :data:`SHORT_SLEEP` seconds (or any, with ``durable=True``) ends the run
as a pause does: the driver writes a PENDING checkpoint of the step that comes next, its
metadata ``{"sleep": {"seconds": ...}}``, then leaves its ``async with`` block, which
makes the workflow UNFINISHED and claimable only once the storage's clock passes the wake-up
time (its ``retry_at``), and appends ``sleeping`` with ``until``. The run that claims it
then resumes at that step, and its own call of the same ``sleep`` returns at once: no step
repeats, and the sleep is not taken twice. A shorter sleep in a live driver simply waits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from ._telemetry import round_trip
from .errors import CheckpointNotFoundError, InvalidArgumentError, UnsupportedOperationError
from .leases import Lease, WorkflowRecord
from .manager import CheckpointManager
from .models import AgentStatus
from .storage.events import EventStorage, check_sleep

__all__ = [
    "SHORT_SLEEP",
    "Sleeping",
    "already_slept",
    "check_delay",
    "check_outside",
    "marker",
    "sleep_storage",
    "sleep_workflow",
]

#: A sleep of at most this many seconds in a live driver just waits (``durable=None``).
SHORT_SLEEP: Final = 5.0
#: The agent of a sleep's checkpoint.
AGENT: Final = "workflow"


class Sleeping(BaseException):
    """Raised by a durable sleep to leave the block; the block's exit writes the sleep.

    A ``BaseException``, like the pause's: an ``except Exception`` in the block does not
    swallow it.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__("workflow sleeping")
        self.seconds = seconds


def check_delay(delay: object) -> float:
    """A sleep's seconds: a number or a ``timedelta``, 0 to a year."""
    if isinstance(delay, timedelta):
        return check_sleep(delay.total_seconds())
    return check_sleep(delay)


def marker(seconds: float) -> dict[str, Any]:
    """The metadata of a sleep's checkpoint."""
    return {"sleep": {"seconds": seconds}}


def sleep_storage(manager: CheckpointManager) -> EventStorage:
    """The manager's storage, if it can sleep durably; else UnsupportedOperationError."""
    storage = manager.storage
    if not isinstance(storage, EventStorage):
        raise UnsupportedOperationError(
            f"{type(storage).__name__} keeps no workflow records, so it cannot wake a "
            f"workflow later: sleep at most {SHORT_SLEEP:.0f} seconds, or use a backend "
            "that can (in-memory, SQLite or PostgreSQL)"
        )
    return storage


async def already_slept(manager: CheckpointManager, workflow_id: str, step: int) -> bool:
    """Whether ``step``'s checkpoint is a sleep's (this run woke from it)."""
    try:
        checkpoint = await manager.get_checkpoint(workflow_id, step)
    except CheckpointNotFoundError:
        return False
    return checkpoint.status is AgentStatus.PENDING and "sleep" in checkpoint.metadata


def check_outside(in_step: bool) -> None:
    """A durable sleep is taken between steps: InvalidArgumentError inside one."""
    if in_step:
        raise InvalidArgumentError(
            "a durable sleep is taken between steps, not inside wf.step(); leave the step first"
        )


async def sleep_workflow(
    storage: EventStorage, workflow_id: str, seconds: float, lease: Lease | None
) -> WorkflowRecord:
    """Write the sleep: UNFINISHED, claimable ``seconds`` from the storage's now."""
    return await round_trip(storage.sleep_workflow, workflow_id, seconds, fence=lease)
