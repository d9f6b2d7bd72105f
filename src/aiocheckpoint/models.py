"""Data models: checkpoints, state snapshots and execution metrics (pydantic v2)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timezone
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AgentStatus",
    "Checkpoint",
    "ExecutionMetrics",
    "StateSnapshot",
    "StateVersion",
    "utcnow",
]


_M = TypeVar("_M", bound=BaseModel)

# The slots every pydantic model instance has, set through their descriptors directly:
# a third of the cost of ``object.__setattr__``, which looks each name up on the class.
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def built(cls: type[_M], **fields: Any) -> _M:
    """Make a model from complete, already-valid fields, skipping validation.

    What ``model_construct`` does, at a tenth of its cost: the checkpoint hot path builds
    four models per call from values it has just validated itself. ``fields`` becomes the
    instance's ``__dict__`` (a ``**`` dict is always a fresh one).
    """
    return _made(cls, fields, set(fields))


def rebuilt(model: _M, **changes: Any) -> _M:
    """:func:`built` of ``model``'s type from its fields, with ``changes`` in their place."""
    return built(type(model), **{**model.__dict__, **changes})


def _made(cls: type[_M], fields: dict[str, Any], fields_set: set[str]) -> _M:
    """:func:`built` with ``fields`` (a fresh dict) and the set of their names given."""
    obj = _new(cls)
    _set_dict(obj, fields)
    _set_fields_set(obj, fields_set)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


def utcnow() -> datetime:
    """Return the current time as a timezone-aware UTC datetime."""
    return datetime.now(timezone.utc)


class AgentStatus(str, Enum):
    """The status an agent reached at a step."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    BLOCKED = "blocked"

    def __str__(self) -> str:
        return self.value


class ExecutionMetrics(BaseModel):
    """Cost and progress counters of a workflow run."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    total_cost: float = 0.0
    total_steps: int = 0
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    start_time: datetime | None = None
    elapsed_seconds: float = 0.0


#: The fields of ``ExecutionMetrics()`` (never change it).
METRICS_DEFAULTS: dict[str, Any] = dict(ExecutionMetrics().__dict__)


def default_metrics() -> ExecutionMetrics:
    """``ExecutionMetrics()`` without validation (every default is immutable)."""
    # As ExecutionMetrics() leaves it: no field set.
    return _made(ExecutionMetrics, dict(METRICS_DEFAULTS), set())


class StateVersion(BaseModel):
    """One version of a :class:`~aiocheckpoint.SharedState`: who changed what, and when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 0
    timestamp: datetime = Field(default_factory=utcnow)
    agent_id: str | None = None
    changed_fields: list[str] = Field(default_factory=list)


class StateSnapshot(BaseModel):
    """An independent copy of a workflow's state at one version."""

    model_config = ConfigDict(extra="forbid")

    data: dict[str, Any] = Field(default_factory=dict)
    version: StateVersion = Field(default_factory=StateVersion)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Checkpoint(BaseModel):
    """A saved step of a workflow: who ran it, how it ended, and the state after it."""

    model_config = ConfigDict(extra="forbid")

    workflow_id: str
    step: int
    agent_id: str
    status: AgentStatus
    state_snapshot: StateSnapshot
    metrics: ExecutionMetrics = Field(default_factory=ExecutionMetrics)
    timestamp: datetime = Field(default_factory=utcnow)
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: The application version that wrote it (``CheckpointManager(app_version=...)``).
    app_version: str | None = None


def plain_snapshot(data: dict[str, Any], now: datetime) -> StateSnapshot:
    """The snapshot of a plain dict state (already copied) saved at ``now``: version 0."""
    version = _made(
        StateVersion,
        {"version": 0, "timestamp": now, "agent_id": None, "changed_fields": []},
        {"version", "timestamp", "agent_id", "changed_fields"},
    )
    return _made(
        StateSnapshot,
        {"data": data, "version": version, "metadata": {}},
        {"data", "version", "metadata"},
    )


class CheckpointDraft(NamedTuple):
    """A checkpoint as ``create_checkpoint`` was asked for it: its arguments checked.

    What the manager hands the record pipeline (:meth:`RecordCodec.save
    <aiocheckpoint.codec.RecordCodec.save>`), which copies the state, builds the models and
    stores them. Everything but ``state`` is already a private copy or an atom.
    """

    workflow_id: str
    step: int
    agent_id: str
    status: AgentStatus
    #: The caller's state, not yet copied: a dict, a mapping, a StateSnapshot or a SharedState.
    state: Any
    #: Whether ``state`` is a :class:`~aiocheckpoint.SharedState` (copied in slices).
    shared: bool
    #: The copied fields of the caller's ExecutionMetrics; None for ``ExecutionMetrics()``.
    metrics: dict[str, Any] | None
    #: A copy of the checkpoint's metadata, and whether its floats are all finite.
    metadata: dict[str, Any]
    metadata_finite: bool
    app_version: str | None


#: A :class:`CheckpointDraft` from the tuple of its fields, in order and complete: without
#: the Python frame of a NamedTuple's ``__new__`` (~0.2 us, and every save builds one).
make_draft: Callable[[tuple[Any, ...]], CheckpointDraft] = functools.partial(
    tuple.__new__, CheckpointDraft
)


class CheckpointFields(NamedTuple):
    """A checkpoint of a plain dict state before its models are built.

    What ``create_checkpoint`` keeps while the record is stored: private copies and atoms
    in one tuple, where the built models would be a dozen objects per waiting save for the
    garbage collector to promote (docs/performance.md). :meth:`checkpoint` builds them.
    """

    workflow_id: str
    step: int
    agent_id: str
    status: AgentStatus
    #: The copied state.
    data: dict[str, Any]
    #: The copied fields of the caller's ExecutionMetrics; None for ``ExecutionMetrics()``.
    metrics: dict[str, Any] | None
    timestamp: datetime
    metadata: dict[str, Any]
    app_version: str | None

    def checkpoint(self) -> Checkpoint:
        """The checkpoint these fields describe (its state at version 0).

        Its models are made with their dicts and field-name sets written out rather than
        through :func:`built`'s keywords: every save on the event loop builds one.
        """
        now, metrics = self.timestamp, self.metrics
        return _made(
            Checkpoint,
            {
                "workflow_id": self.workflow_id,
                "step": self.step,
                "agent_id": self.agent_id,
                "status": self.status,
                "state_snapshot": plain_snapshot(self.data, now),
                "metrics": default_metrics()
                if metrics is None
                else built(ExecutionMetrics, **metrics),
                "timestamp": now,
                "metadata": self.metadata,
                "app_version": self.app_version,
            },
            {
                "workflow_id",
                "step",
                "agent_id",
                "status",
                "state_snapshot",
                "metrics",
                "timestamp",
                "metadata",
                "app_version",
            },
        )


#: A :class:`CheckpointFields` from the tuple of its fields, as :data:`make_draft` makes drafts.
make_fields: Callable[[tuple[Any, ...]], CheckpointFields] = functools.partial(
    tuple.__new__, CheckpointFields
)
