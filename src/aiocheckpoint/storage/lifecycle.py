"""What the workflow-record backends share about cancel and retry: which status may go where.

A cancel takes an UNFINISHED or PAUSED workflow to CANCELLED and *revokes its lease* in the
same transaction: the fencing token moves on and the owner is cleared, so a runner driving
it fails its next fenced write (a checkpoint, an effect's intent, a renewal) with
:class:`~aiocheckpoint.LeaseLostError` and reads the record to learn why. A retry takes a
FAILED or CANCELLED workflow back to UNFINISHED with a fresh attempt budget.

Nothing else moves a CANCELLED record: every other status write (``set_workflow_status``,
``record_failure``) carries the guard in its own statement (atomic, not read-then-write) and
is refused with :class:`CancelledRecordError`, so a driver without a lease, which no revoked
lease stops, cannot overwrite the cancel when it finishes.
"""

from __future__ import annotations

import json
from typing import Final

from ..errors import CheckpointNotFoundError, InvalidArgumentError, WorkflowCancelledError
from ..leases import WorkflowRecord, WorkflowStatus

__all__ = [
    "CANCELLABLE",
    "CANCELLED_ERROR",
    "CancelledRecordError",
    "RETRYABLE",
    "cancel_error",
    "check_cancel",
    "check_resume",
    "check_retry",
    "cancel_reason",
    "cancelled_refusal",
]

#: The statuses a cancel accepts.
CANCELLABLE: Final = (WorkflowStatus.UNFINISHED, WorkflowStatus.PAUSED)
#: The statuses a retry accepts.
RETRYABLE: Final = (WorkflowStatus.FAILED, WorkflowStatus.CANCELLED)
#: ``last_error["type"]`` of a cancelled workflow (its ``message`` is the reason).
CANCELLED_ERROR: Final = "WorkflowCancelledError"


class CancelledRecordError(WorkflowCancelledError, InvalidArgumentError):
    """A status write met a CANCELLED record: refused, nothing changed.

    Both a :class:`~aiocheckpoint.WorkflowCancelledError` (what a driver raises) and an
    :class:`~aiocheckpoint.InvalidArgumentError` (what ``mark_workflow`` raises): only
    ``retry_workflow`` moves a cancelled workflow.
    """

    def __init__(self, workflow_id: str, reason: str | None = None) -> None:
        super().__init__(workflow_id, reason)
        self.args = (
            f"{self.args[0]}; only retry_workflow moves a cancelled workflow (nothing changed)",
        )


def cancelled_refusal(record: WorkflowRecord) -> CancelledRecordError:
    """The refusal of a status write that met ``record``, which is CANCELLED."""
    return CancelledRecordError(record.workflow_id, cancel_reason(record))


def _checked(record: WorkflowRecord | None, workflow_id: str) -> WorkflowRecord:
    if record is None:
        raise CheckpointNotFoundError(workflow_id)
    return record


def check_cancel(record: WorkflowRecord | None, workflow_id: str) -> None:
    """Refuse a cancel of a missing workflow or one that is not UNFINISHED or PAUSED."""
    status = _checked(record, workflow_id).status
    if status not in CANCELLABLE:
        raise InvalidArgumentError(
            f"workflow {workflow_id!r} is {status}: only an unfinished or paused workflow "
            "can be cancelled"
        )


def check_retry(record: WorkflowRecord | None, workflow_id: str) -> None:
    """Refuse a retry of a missing workflow or one that is not FAILED or CANCELLED."""
    status = _checked(record, workflow_id).status
    if status not in RETRYABLE:
        raise InvalidArgumentError(
            f"workflow {workflow_id!r} is {status}: only a failed or cancelled workflow "
            "can be retried"
        )


def check_resume(record: WorkflowRecord | None, workflow_id: str) -> None:
    """Refuse a resume of a missing workflow or one that is not PAUSED."""
    status = _checked(record, workflow_id).status
    if status is not WorkflowStatus.PAUSED:
        raise InvalidArgumentError(
            f"workflow {workflow_id!r} is {status}, not paused: nothing to resume"
        )


def cancel_error(reason: str | None) -> str:
    """The JSON text stored as a cancelled workflow's ``last_error``."""
    return json.dumps({"type": CANCELLED_ERROR, "message": reason or ""})


def cancel_reason(record: WorkflowRecord) -> str | None:
    """The reason a cancelled workflow's record keeps (None if none was given)."""
    error = record.last_error or {}
    return error.get("message") or None
