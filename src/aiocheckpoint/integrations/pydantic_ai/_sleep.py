"""A long durable sleep of a run: the store's timer (``wf.sleep``'s), inside the run's step.

A pydantic-ai run is one step of its workflow, and every unit of it an effect, so a sleep
cannot end the run *between* steps as ``wf.sleep`` does. It ends it inside the step instead:
the sleep is an effect whose body writes the wake-up time
(:func:`~aiocheckpoint.sleeping.sleep_workflow`: UNFINISHED, claimable once the store's
clock passes it, a ``sleeping`` event), and the run leaves its workflow block with
:class:`Asleep`, which writes nothing more (the block only gives its lease back). A run
that resumes replays every recorded unit, the sleep's too, and goes on after it: the sleep
is not taken again.

Killed after the write but before the effect's outcome was recorded, the sleep is in doubt
and, idempotent, taken again on resume: at worst once more, never skipped.
"""

from __future__ import annotations

from datetime import datetime

from ... import sleeping
from ...manager import CheckpointManager
from ...storage.events import EventStorage
from ...workflow import ResumableWorkflow

__all__ = ["Asleep", "RunSleeping", "has_timer", "sleep_until_woken"]


class RunSleeping(Exception):
    """The durable run ended for a long durable sleep; it is not a failure.

    Raised by :meth:`AioCheckpointDurability.run
    <aiocheckpoint.integrations.pydantic_ai.AioCheckpointDurability.run>` and ``resume``
    when the agent slept longer than :data:`~aiocheckpoint.sleeping.SHORT_SLEEP` seconds on
    a store with workflow records. The workflow is UNFINISHED; ``claim_workflow`` hands it
    out once the store's clock passes :attr:`wake_at`, and ``resume`` then finishes the run
    (the sleep is not taken again).
    """

    def __init__(self, workflow_id: str, seconds: float, wake_at: datetime | None) -> None:
        self.workflow_id = workflow_id
        self.seconds = seconds
        #: When the store hands the run out again (by the store's clock).
        self.wake_at = wake_at
        when = "later" if wake_at is None else f"at {wake_at.isoformat()}"
        super().__init__(f"run {workflow_id!r} sleeps {seconds:g} s; it wakes {when}")


class Asleep(BaseException):
    """Leaves the run's step and workflow block after the sleep was written.

    A ``BaseException``, as the pause's: the agent's and the block's ``except Exception``
    do not take it for a failure.
    """

    def __init__(self, seconds: float, wake_at: str | None) -> None:
        super().__init__("run sleeping")
        self.seconds = seconds
        self.wake_at = None if wake_at is None else datetime.fromisoformat(wake_at)


def has_timer(manager: CheckpointManager) -> bool:
    """Whether ``manager``'s store can wake a run later (it keeps workflow records)."""
    return isinstance(manager.storage, EventStorage)


async def sleep_until_woken(workflow: ResumableWorkflow, key: str, seconds: float) -> None:
    """Write the sleep as the effect ``key`` and raise :class:`Asleep`; replayed, return."""
    seconds = sleeping.check_delay(seconds)
    storage = sleeping.sleep_storage(workflow.checkpoint_manager)
    started = False

    async def durable_sleep(idempotency_key: str | None = None) -> str | None:
        nonlocal started
        started = True
        record = await sleeping.sleep_workflow(
            storage, workflow.workflow_id, seconds, workflow.lease
        )
        return None if record.retry_at is None else record.retry_at.isoformat()

    wake_at = await workflow.effect(key, durable_sleep, idempotent=True)
    if started:
        raise Asleep(seconds, wake_at)
