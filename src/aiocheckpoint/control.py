"""Operating workflows: cancel and retry (``docs/resuming.md``).

The manager's :meth:`~aiocheckpoint.CheckpointManager.cancel_workflow` and
:meth:`~aiocheckpoint.CheckpointManager.retry_workflow` delegate here.

A cancel never waits for, nor is refused by, the runner driving the workflow: the storage
revokes the runner's lease in the cancel's transaction (``storage/lifecycle.py``), so the
runner's next fenced write (its step's checkpoint, an effect's intent, a lease renewal)
fails; the driver then reads the record, finds it CANCELLED and raises
:class:`~aiocheckpoint.WorkflowCancelledError`. Nothing is added to the hot path: the driver
reads the record only after a write was refused.

A retry, and a resume from the command line, take the workflow's lease for their write and
release it after, as settling an effect does: a runner that still holds the lease makes them
raise :class:`~aiocheckpoint.LeaseHeldError`, and a stale runner cannot write after them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from ._telemetry import round_trip
from .codec import FieldSealer, is_sealed_text
from .errors import (
    CheckpointError,
    InvalidArgumentError,
    LeaseError,
    UnsupportedOperationError,
    WorkflowCancelledError,
)
from .leases import WorkflowRecord, WorkflowStatus
from .storage.base import CheckpointStorage, WorkflowControlStorage, WorkflowStorage
from .storage.lifecycle import cancel_reason, check_retry

__all__ = [
    "MAX_REASON",
    "OPERATOR",
    "cancel",
    "check_reason",
    "cancelled_error",
    "control_storage",
    "leased",
    "retry",
]

_T = TypeVar("_T")

#: The lease owner of an operator's write (a retry, a resume from the CLI).
OPERATOR: Final = "aiocheckpoint-operator"
#: The longest reason a cancel keeps.
MAX_REASON: Final = 1000
#: How long an operator's write may hold the lease (it releases it at once).
_OPERATOR_TTL: Final = 30.0


def control_storage(storage: CheckpointStorage) -> WorkflowControlStorage:
    """``storage`` if it can cancel and retry workflows, else UnsupportedOperationError."""
    if not isinstance(storage, WorkflowControlStorage):
        raise UnsupportedOperationError(
            f"{type(storage).__name__} cannot cancel or retry workflows; use a backend that "
            "can (in-memory, SQLite or PostgreSQL)"
        )
    return storage


def check_reason(reason: object) -> str | None:
    """A cancel's reason: None or a str of at most 1,000 characters."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidArgumentError(f"reason must be a str or None, not {type(reason).__name__}")
    if reason is not None and len(reason) > MAX_REASON:
        raise InvalidArgumentError(f"reason is longer than {MAX_REASON} characters")
    return reason


def markable(status: WorkflowStatus) -> WorkflowStatus:
    """``status``, unless it is CANCELLED: only a cancel revokes the runner's lease.

    The other way, out of CANCELLED, the storage's status write refuses in its own statement
    (atomic: a cancel may land between a read and the write) with
    :class:`~aiocheckpoint.storage.lifecycle.CancelledRecordError`, an InvalidArgumentError
    naming ``retry_workflow``: only a retry moves a cancelled workflow.
    """
    if status is WorkflowStatus.CANCELLED:
        raise InvalidArgumentError(
            "a workflow is cancelled with cancel_workflow, which also stops its runner"
        )
    return status


async def cancel(
    storage: CheckpointStorage, workflow_id: str, reason: str | None
) -> WorkflowRecord:
    """Cancel the workflow; its runner stops at its next fenced write (module docstring).

    ``reason`` was checked (:func:`check_reason`) and, on an encrypted store, sealed.
    """
    return await round_trip(control_storage(storage).cancel_workflow, workflow_id, reason)


async def retry(storage: CheckpointStorage, workflow_id: str) -> WorkflowRecord:
    """Make a FAILED or CANCELLED workflow claimable again, under a lease of its own."""
    controls = control_storage(storage)
    return await operate(
        controls, workflow_id, check_retry, lambda: controls.retry_workflow(workflow_id)
    )


async def operate(
    storage: WorkflowStorage,
    workflow_id: str,
    check: Callable[[WorkflowRecord | None, str], None],
    write: Callable[[], Awaitable[WorkflowRecord]],
) -> WorkflowRecord:
    """``write`` under the workflow's lease, if ``check`` passes; the record after it.

    ``check`` runs first, on the record as it is: taking the lease would create a missing
    workflow's record, and would move a refused one's token and time. The write checks
    again, in its own transaction.
    """
    check(await round_trip(storage.get_workflow, workflow_id), workflow_id)
    written = await leased(storage, workflow_id, write)
    return await released(storage, written)


async def leased(
    storage: WorkflowStorage, workflow_id: str, write: Callable[[], Awaitable[_T]]
) -> _T:
    """Run ``write`` holding the workflow's lease (LeaseHeldError while a runner holds it)."""
    own = await round_trip(storage.acquire_lease, workflow_id, OPERATOR, _OPERATOR_TTL)
    try:
        return await write()
    finally:
        await storage.release_lease(own)


async def released(storage: WorkflowStorage, written: WorkflowRecord) -> WorkflowRecord:
    """The record as it is after the operator's lease went (``written`` if it is gone)."""
    record = await round_trip(storage.get_workflow, written.workflow_id)
    return written if record is None else record


async def cancelled_error(
    storage: CheckpointStorage,
    workflow_id: str,
    refused: LeaseError,
    fields: FieldSealer | None = None,
) -> WorkflowCancelledError | None:
    """The error to raise instead of ``refused`` when the workflow was cancelled, else None.

    Asked only after a fenced write was refused, so it costs nothing on the hot path.
    ``fields`` opens a reason sealed on an encrypted store (one it cannot open is left out).
    """
    if not isinstance(storage, WorkflowStorage):
        return None
    try:
        record = await round_trip(storage.get_workflow, workflow_id)
    except Exception:
        return None  # the lease error stands: it is what the caller can act on
    if record is None or record.status is not WorkflowStatus.CANCELLED:
        return None
    reason = cancel_reason(record)
    if fields is not None and fields.sealing:
        try:
            reason = cancel_reason(await fields.open_record(record))
        except CheckpointError:
            reason = None
    return WorkflowCancelledError(workflow_id, None if is_sealed_text(reason) else reason)
