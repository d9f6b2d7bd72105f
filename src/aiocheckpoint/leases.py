"""Workflow records and leases: dividing workflows between many runners, safely.

A *workflow record* says whether a workflow is unfinished, finished or failed. A *lease*
gives one owner the right to drive a workflow until it expires; each grant carries a fencing
token that only grows, and a checkpoint written under a lease whose token is no longer the
workflow's current one is rejected with :class:`~aiocheckpoint.LeaseLostError`. A runner
that was paused past its lease's expiry, while another runner took the workflow over, can
therefore never overwrite the newer runner's work.

Backends that support this implement
:class:`~aiocheckpoint.storage.base.WorkflowStorage`.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from pydantic import BaseModel, ConfigDict

from .errors import InvalidArgumentError, LeaseLostError

__all__ = ["Lease", "WorkflowRecord", "WorkflowStatus", "check_ttl", "fence_token"]


class WorkflowStatus(str, Enum):
    """Where a workflow stands as a whole."""

    UNFINISHED = "unfinished"
    FINISHED = "finished"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class Lease(BaseModel):
    """The right of ``owner`` to drive ``workflow_id`` until ``expires_at``.

    ``token`` is the fencing token: it grows with every grant of the workflow's lease, so a
    newer grant always has a larger token than any older one. ``ttl`` is the number of
    seconds it was granted (or last renewed) for.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    owner: str
    token: int
    expires_at: datetime
    ttl: float


class WorkflowRecord(BaseModel):
    """A workflow's status, timestamps and current lease (if any)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    status: WorkflowStatus
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    fencing_token: int = 0


def check_ttl(ttl: object) -> float:
    """A lease TTL: a number of seconds > 0 (``bool`` refused); else InvalidArgumentError."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < 10**9:
        raise InvalidArgumentError(f"ttl must be a positive number of seconds, got {ttl!r}")
    return float(ttl)


def fence_token(fence: object, workflow_id: str) -> int:
    """The fencing token of ``fence``, which must be a lease on ``workflow_id``."""
    if not isinstance(fence, Lease):
        raise InvalidArgumentError(f"lease must be a Lease, not {type(fence).__qualname__}")
    if fence.workflow_id != workflow_id:
        raise LeaseLostError(
            f"the lease is for workflow {fence.workflow_id!r}, not {workflow_id!r}"
        )
    return fence.token
