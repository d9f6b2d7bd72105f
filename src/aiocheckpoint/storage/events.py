"""A workflow's event history: what the storage keeps, and the protocol of a store keeping it.

A completed step is its checkpoint; every other change of a workflow's life is an *event*,
appended by the storage in the same transaction (the same statement, on PostgreSQL) as the
change it describes: a pause, a resume, a failed run, a cancel, a retry, a finish, a lease
taken over from a runner that stopped renewing it. A plain checkpoint save writes none.

Each event is a row: its sequence number (store-wide, increasing: the order of the
history), its kind, the storage's time, the step and attempt it concerns (None where
none), and its data, a JSON object as text. The manager reads them with
:meth:`~aiocheckpoint.CheckpointManager.get_events`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Final, Protocol, runtime_checkable

from ..errors import InvalidArgumentError
from ..leases import Lease, WorkflowRecord, WorkflowStatus
from .base import WorkflowStorage

__all__ = [
    "MAX_EVENT_PAGE",
    "MAX_SLEEP",
    "EventKind",
    "EventNote",
    "ENTERED",
    "LEFT",
    "RESEAL_FIELDS",
    "EventStorage",
    "Reseal",
    "StoredEvent",
    "check_event_page",
    "check_events",
    "check_reseals",
    "check_sleep",
    "failure_events",
    "reseal_fields",
    "reseal_record",
    "status_event",
    "status_event_data",
    "taken_over",
]

#: The most events one read returns.
MAX_EVENT_PAGE: Final = 1000
#: The longest durable sleep: a year, in seconds.
MAX_SLEEP: Final = 366 * 86400.0


class EventKind(str, Enum):
    """What an event records."""

    #: A run failed in a step: ``attempt``, the error's ``type`` and ``message``.
    STEP_FAILED = "step_failed"
    #: The failed run is retried after a backoff: ``at``, when it becomes claimable.
    RETRY_SCHEDULED = "retry_scheduled"
    #: The workflow failed for good (its retries spent, or marked FAILED).
    FAILED = "failed"
    #: The workflow paused: ``reason`` and ``data`` when a driver paused it.
    PAUSED = "paused"
    #: A paused workflow was resumed: ``input``, what its next run reads.
    RESUMED = "resumed"
    #: The workflow sleeps until ``until`` (store's clock).
    SLEEPING = "sleeping"
    #: The workflow was cancelled: ``reason``.
    CANCELLED = "cancelled"
    #: A failed or cancelled workflow was made claimable again: ``previous`` status.
    RETRIED = "retried"
    #: The workflow finished.
    COMPLETED = "completed"
    #: A run stopped on an effect in doubt (a failed run whose error was the doubt).
    EFFECT_IN_DOUBT = "effect_in_doubt"
    #: The last effect in doubt was settled and the workflow is claimable again.
    EFFECT_RESOLVED = "effect_resolved"
    #: The workflow was forked from another: ``from``, ``step``.
    FORKED = "forked"
    #: A runner took the lease over from one whose lease had expired: ``previous_owner``.
    LEASE_TAKEN_OVER = "lease_taken_over"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored event: its sequence number, kind, time, step, attempt and data (JSON text)."""

    seq: int
    kind: str
    at: datetime
    step: int | None
    attempt: int | None
    data: str


@dataclass(frozen=True, slots=True)
class EventNote:
    """An event a caller asks a status write to append: its kind and data (JSON object text)."""

    kind: EventKind
    data: str = "{}"


#: What a :class:`Reseal` replaces: an event's data, or a workflow record's field.
RESEAL_FIELDS: Final = frozenset({"event", "resume_input", "error_message"})


@dataclass(frozen=True, slots=True)
class Reseal:
    """One text to replace where it still holds ``old`` (``rekey`` and ``encrypt``).

    ``field`` is ``"event"`` (the data of event ``seq``: ``old`` and ``new`` are the whole
    JSON object's text, compared as text), ``"resume_input"`` (the record's resume input)
    or ``"error_message"`` (the message of the record's ``last_error``); for these two
    ``old`` and ``new`` are JSON texts, compared as JSON values.
    """

    field: str
    old: str
    new: str
    seq: int | None = None


@runtime_checkable
class EventStorage(WorkflowStorage, Protocol):
    """A workflow storage that keeps each workflow's event history (optional).

    Contract (checked by :class:`aiocheckpoint.testing.EventStorageConformance`):

    * Every status change appends its event in the change's own transaction (see
      :func:`status_event`, :func:`failure_events`); ``set_workflow_status(...,
      note=EventNote(...))`` appends that event instead of the derived one, even when the
      status does not change. ``resume_workflow`` appends ``resumed`` with ``{"input"}``,
      ``cancel_workflow`` ``cancelled`` with ``{"reason"}``, ``retry_workflow``
      ``retried`` with ``{"previous"}``; ``acquire_lease`` and ``claim_next_workflow``
      append ``lease_taken_over`` with ``{"previous_owner"}`` when they grant a lease that
      another owner held and let expire. A save (or ``save_tree``) whose ``step_info``
      carries a ``note`` (a fork's first save: ``forked``) appends it in the save's
      transaction, after the record. A refused write appends nothing.
    * ``get_events(wf, after=seq, limit=n)`` returns the workflow's events with a sequence
      number above ``after``, oldest first, at most ``limit``
      (:data:`MAX_EVENT_PAGE` at most). An event's step is the record's ``latest_step``
      when it was written.
    * ``delete(wf)`` and ``delete_workflow`` delete the workflow's events with it;
      ``drop_orphan_effects(wf, below)`` and ``thin_many`` (each cut with a ``below``)
      delete its events whose step is below ``below`` (retention), in their transaction.
    * ``sleep_workflow(wf, seconds, fence=lease)`` makes the workflow UNFINISHED with
      ``retry_at`` ``seconds`` after the storage's clock (``claim_next_workflow`` passes it
      over until then) and no ``finished_at``, and appends ``sleeping`` with ``{"until"}``;
      fenced and guarded against a cancelled record as ``set_workflow_status`` is.
    * ``put_events(wf, events, replace=...)`` appends events carried from another store
      (``copy``, ``import``) with their kind, time, step, attempt and data, in order, in
      one transaction; with ``replace=True`` the workflow's events are deleted first, in
      the same transaction. The workflow's record exists (the caller writes it first).
    * ``reseal(wf, changes)`` replaces each :class:`Reseal`'s text that still holds its
      ``old`` with its ``new``, all in one transaction, and returns how many it replaced; a
      text that changed meanwhile (or is gone) is left as it is. Nothing else of the record
      or the events changes (not ``updated_at``).
    """

    async def set_workflow_status(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        *,
        fence: Lease | None = None,
        note: EventNote | None = None,
    ) -> WorkflowRecord:
        """Update the record with ``status``, appending its event (``note``'s, if given)."""
        ...

    async def get_events(
        self, workflow_id: str, *, after: int | None = None, limit: int = MAX_EVENT_PAGE
    ) -> list[StoredEvent]:
        """The workflow's events after sequence number ``after``, oldest first."""
        ...

    async def sleep_workflow(
        self, workflow_id: str, seconds: float, *, fence: Lease | None = None
    ) -> WorkflowRecord:
        """Make the workflow UNFINISHED, claimable only ``seconds`` from now; ``sleeping``."""
        ...

    async def put_events(
        self, workflow_id: str, events: Sequence[StoredEvent], *, replace: bool
    ) -> None:
        """Append ``events`` as they are (new sequence numbers); ``replace``: drop the rest."""
        ...

    async def reseal(self, workflow_id: str, changes: Sequence[Reseal]) -> int:
        """Replace each change's text that still holds its ``old``; how many were replaced."""
        ...


def check_event_page(after: object, limit: object) -> tuple[int | None, int]:
    """``after`` (None or an int >= 0) and ``limit`` (1 to :data:`MAX_EVENT_PAGE`), checked."""
    if after is not None and (type(after) is not int or after < 0):
        raise InvalidArgumentError(f"after must be None or an int >= 0, got {after!r}")
    if type(limit) is not int or not 1 <= limit <= MAX_EVENT_PAGE:
        raise InvalidArgumentError(
            f"limit must be an int from 1 to {MAX_EVENT_PAGE}, got {limit!r}"
        )
    return after, limit


#: The event a status write appends when the status changes to the key's, from any other.
ENTERED: Final = {
    WorkflowStatus.PAUSED: EventKind.PAUSED,
    WorkflowStatus.FINISHED: EventKind.COMPLETED,
    WorkflowStatus.FAILED: EventKind.FAILED,
}
#: ... and when it goes back to UNFINISHED, by the status it leaves.
LEFT: Final = {
    WorkflowStatus.PAUSED: EventKind.RESUMED,
    WorkflowStatus.FAILED: EventKind.RETRIED,
}


def status_event(old: WorkflowStatus | None, new: WorkflowStatus) -> EventKind | None:
    """The event of a status write from ``old`` (None: a new record) to ``new``, if any."""
    if old is new:
        return None
    if new is WorkflowStatus.UNFINISHED:
        return None if old is None else LEFT.get(old)
    return ENTERED.get(new)


def status_event_data(old: WorkflowStatus | None, kind: EventKind) -> str:
    """The data of a derived status event: ``{"previous": old}`` for a retry, else ``{}``."""
    if kind is EventKind.RETRIED and old is not None:
        return json.dumps({"previous": old.value})
    return "{}"


def check_sleep(seconds: object) -> float:
    """A sleep's length: a finite number of seconds from 0 to a year."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgumentError(f"a sleep is a number of seconds, not {seconds!r}")
    if not 0 <= seconds <= MAX_SLEEP:
        raise InvalidArgumentError(f"a sleep is 0 to {MAX_SLEEP:.0f} seconds, not {seconds!r}")
    return float(seconds)


def check_events(events: object) -> list[StoredEvent]:
    """Events to put: a sequence of StoredEvent whose kind and data are sound."""
    if not isinstance(events, Sequence) or not all(isinstance(e, StoredEvent) for e in events):
        raise InvalidArgumentError("events must be a sequence of StoredEvent")
    for event in events:
        if not isinstance(event.kind, str) or not 0 < len(event.kind) <= 64:
            raise InvalidArgumentError(f"an event kind is 1-64 characters, not {event.kind!r}")
        if event.at.tzinfo is None:
            raise InvalidArgumentError("an event's time must carry its time zone")
        for value in (event.step, event.attempt):
            if value is not None and (type(value) is not int or not 0 <= value < 2**63):
                raise InvalidArgumentError(f"an event's step or attempt is bad: {value!r}")
        try:
            fields = json.loads(event.data)
        except (TypeError, ValueError):
            fields = None
        if not isinstance(fields, dict):
            raise InvalidArgumentError("an event's data must be a JSON object's text")
    return list(events)


def check_reseals(changes: object) -> list[Reseal]:
    """Reseal changes: a sequence of :class:`Reseal` of known fields (an event's with a seq)."""
    if not isinstance(changes, Sequence) or not all(isinstance(c, Reseal) for c in changes):
        raise InvalidArgumentError("changes must be a sequence of Reseal")
    for change in changes:
        if change.field not in RESEAL_FIELDS:
            raise InvalidArgumentError(f"not a field reseal replaces: {change.field!r}")
        if (change.field == "event") != (type(change.seq) is int):
            raise InvalidArgumentError("an event's reseal has its seq, a record field's none")
        if not isinstance(change.old, str) or not isinstance(change.new, str):
            raise InvalidArgumentError("a reseal's old and new are texts")
    return list(changes)


def reseal_record(record: WorkflowRecord, change: Reseal) -> WorkflowRecord | None:
    """``record`` with ``change`` (a record field's) made, or None if it no longer holds ``old``."""
    old, new = json.loads(change.old), json.loads(change.new)
    if change.field == "resume_input":
        if record.resume_input is None or record.resume_input != old:
            return None
        return record.model_copy(update={"resume_input": new})
    error = record.last_error
    if error is None or "message" not in error or error["message"] != old:
        return None
    return record.model_copy(update={"last_error": {**error, "message": new}})


def reseal_fields(
    resume: str | None, error: str | None, changes: Sequence[Reseal]
) -> tuple[str | None, str | None, int]:
    """A record's stored ``resume_input`` and ``last_error`` texts with ``changes`` made.

    Returns the texts to store and how many changes were made: a change whose ``old`` the
    field no longer holds (compared as JSON values: the stored text may be spelled
    otherwise) is not made.
    """
    fields: Any = None if error is None else json.loads(error)
    done = 0
    for change in changes:
        old = json.loads(change.old)
        if change.field == "resume_input":
            if resume is not None and json.loads(resume) == old:
                resume, done = change.new, done + 1
        elif isinstance(fields, dict) and fields.get("message", ...) == old:
            fields = {**fields, "message": json.loads(change.new)}
            error, done = json.dumps(fields), done + 1
    return resume, error, done


def failure_events(
    error: str, status: WorkflowStatus, retry_at: str | None
) -> list[tuple[EventKind, str]]:
    """The events of a failed run: ``step_failed``, then ``retry_scheduled`` or ``failed``.

    ``error`` is the run's error as JSON text (``type`` and ``message``); a run stopped by
    an effect in doubt appends ``effect_in_doubt`` before the outcome.
    """
    events = [(EventKind.STEP_FAILED, error)]
    if _error_type(error) == "EffectInDoubtError":
        events.append((EventKind.EFFECT_IN_DOUBT, error))
    if status is WorkflowStatus.FAILED:
        events.append((EventKind.FAILED, "{}"))
    else:
        events.append((EventKind.RETRY_SCHEDULED, json.dumps({"at": retry_at})))
    return events


def _error_type(error: str) -> Any:
    try:
        fields = json.loads(error)
    except ValueError:
        return None
    return fields.get("type") if isinstance(fields, dict) else None


def taken_over(holder: str | None, expired: bool, owner: str) -> str | None:
    """The data of ``lease_taken_over`` when ``owner`` takes a lease ``holder`` let expire."""
    if holder is None or holder == owner or not expired:
        return None
    return json.dumps({"previous_owner": holder})
