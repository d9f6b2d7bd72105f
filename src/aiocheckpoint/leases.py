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

import re
from datetime import datetime
from enum import Enum
from typing import Any, Final, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import InvalidArgumentError, LeaseLostError

__all__ = [
    "WORKFLOW_KIND",
    "Lease",
    "Page",
    "RetryPolicy",
    "WorkflowRecord",
    "WorkflowStatus",
    "check_kind",
    "check_ttl",
    "fence_token",
]

_T = TypeVar("_T")
#: The kind of a workflow that runners drive: the only kind ``claim_workflow`` hands out.
WORKFLOW_KIND: Final = "workflow"
_KIND = re.compile(r"[a-z][a-z0-9_-]{0,31}")
#: The most attempts a retry policy may allow (its delays travel with every failure).
MAX_ATTEMPTS = 1000


class WorkflowStatus(str, Enum):
    """Where a workflow stands as a whole."""

    UNFINISHED = "unfinished"
    FINISHED = "finished"
    FAILED = "failed"
    #: Waiting for :meth:`~aiocheckpoint.CheckpointManager.resume_workflow` (a human, an
    #: event, a budget): never claimed by runners.
    PAUSED = "paused"
    #: Stopped by :meth:`~aiocheckpoint.CheckpointManager.cancel_workflow` (its reason in
    #: ``last_error``): never claimed; :meth:`~aiocheckpoint.CheckpointManager.retry_workflow`
    #: makes it claimable again.
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


class RetryPolicy(BaseModel):
    """How a runner pool retries a workflow whose run failed.

    A run that fails with a retryable error puts the workflow back in the pool
    (``unfinished``) until ``max_attempts`` runs have failed; runners cannot claim it before
    its backoff has elapsed (by the storage's clock). The delay before retry ``n`` (1-based)
    is ``backoff * backoff_factor ** (n - 1)``, at most ``max_backoff`` seconds.
    ``retry_on`` names the retryable exception types (a type or its ``__qualname__``; a
    subclass of a named type counts too); empty means every ``Exception``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS, strict=True)
    backoff: float = Field(default=1.0, ge=0, le=10**7)
    backoff_factor: float = Field(default=2.0, ge=1, le=100)
    max_backoff: float = Field(default=300.0, ge=0, le=10**7)
    retry_on: tuple[str, ...] = ()

    def __init__(self, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            raise InvalidArgumentError(f"invalid RetryPolicy: {exc}") from None

    @field_validator("retry_on", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, (str, type)):
            value = (value,)
        if isinstance(value, (list, tuple)):
            return tuple(v.__qualname__ if isinstance(v, type) else v for v in value)
        return value

    def delays(self) -> list[float]:
        """The delay before each retry: ``max_attempts - 1`` of them."""
        return [
            min(self.backoff * self.backoff_factor**n, self.max_backoff)
            for n in range(self.max_attempts - 1)
        ]

    def retryable(self, error: BaseException) -> bool:
        """Whether a run that raised ``error`` may be retried."""
        if not isinstance(error, Exception):
            return False
        names = {c.__qualname__ for c in type(error).__mro__}
        return not self.retry_on or not names.isdisjoint(self.retry_on)


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
    #: The pool's retry policy, when the lease came from ``claim_workflow(retry=...)``.
    retry: RetryPolicy | None = None


class WorkflowRecord(BaseModel):
    """A workflow's status, timestamps, current lease (if any), metadata and progress.

    ``metadata`` is what the workflow was registered with (tenant, user, kind...);
    ``latest_step``, ``latest_agent_id`` and ``latest_agent_status`` describe its
    highest checkpoint, kept up to date by every save in the same transaction.
    ``attempts`` counts the runs that failed, ``last_error`` is the latest failure
    (``{"type": ..., "message": ...}``) and ``retry_at`` is when a workflow waiting to be
    retried may be claimed again. ``resume_input`` is what
    :meth:`~aiocheckpoint.CheckpointManager.resume_workflow` delivered to the next run,
    until that run writes its first checkpoint. ``kind`` says who writes the workflow:
    ``"workflow"`` (:data:`WORKFLOW_KIND`) for one that runners drive, another name for a
    store's other users (``"langgraph"``: a LangGraph thread), which runners never claim.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    status: WorkflowStatus
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    fencing_token: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    latest_step: int | None = None
    latest_agent_id: str | None = None
    latest_agent_status: str | None = None
    attempts: int = 0
    last_error: dict[str, str] | None = None
    retry_at: datetime | None = None
    resume_input: Any = None
    kind: str = WORKFLOW_KIND


class Page(list[_T], Generic[_T]):
    """One page of a listing: a list, plus the cursor of the next page (None: the last)."""

    next_cursor: str | None

    def __init__(self, items: Any = (), next_cursor: str | None = None) -> None:
        super().__init__(items)
        self.next_cursor = next_cursor


def check_ttl(ttl: object) -> float:
    """A lease TTL: a number of seconds > 0 (``bool`` refused); else InvalidArgumentError."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < 10**9:
        raise InvalidArgumentError(f"ttl must be a positive number of seconds, got {ttl!r}")
    return float(ttl)


def check_kind(kind: object) -> str:
    """A workflow kind: 1-32 of ``a-z``, ``0-9``, ``_``, ``-``, starting with a letter."""
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise InvalidArgumentError(
            f"a workflow kind is 1-32 of a-z, 0-9, '_' and '-', starting with a letter: {kind!r}"
        )
    return kind


def fence_token(fence: object, workflow_id: str) -> int:
    """The fencing token of ``fence``, which must be a lease on ``workflow_id``."""
    if not isinstance(fence, Lease):
        raise InvalidArgumentError(f"lease must be a Lease, not {type(fence).__qualname__}")
    if fence.workflow_id != workflow_id:
        raise LeaseLostError(
            f"the lease is for workflow {fence.workflow_id!r}, not {workflow_id!r}"
        )
    return fence.token
