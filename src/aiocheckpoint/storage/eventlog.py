"""The in-memory store's event histories (:class:`~aiocheckpoint.storage.events.EventStorage`)."""

from __future__ import annotations

import bisect
import dataclasses
from datetime import datetime

from ..leases import WorkflowRecord
from .events import EventKind, StoredEvent

__all__ = ["EventLog"]


class EventLog:
    """Each workflow's events in order, numbered by one store-wide counter."""

    __slots__ = ("_events", "_seq")

    def __init__(self) -> None:
        self._events: dict[str, list[StoredEvent]] = {}
        self._seq = 0

    def append(self, record: WorkflowRecord, kind: EventKind, data: str, at: datetime) -> None:
        """Append an event of ``record`` (its latest step and attempts as they are now)."""
        self._seq += 1
        attempt = record.attempts if kind in _COUNTED else None
        event = StoredEvent(self._seq, kind.value, at, record.latest_step, attempt, data)
        self._events.setdefault(record.workflow_id, []).append(event)

    def page(self, workflow_id: str, after: int | None, limit: int) -> list[StoredEvent]:
        """The events after sequence number ``after``, oldest first, at most ``limit``."""
        events = self._events.get(workflow_id, [])
        start = 0 if after is None else bisect.bisect_right([e.seq for e in events], after)
        return events[start : start + limit]

    def put(self, workflow_id: str, events: list[StoredEvent], replace: bool) -> None:
        """Append carried events with new sequence numbers (after dropping the rest)."""
        if replace:
            self.drop(workflow_id)
        log = self._events.setdefault(workflow_id, [])
        for event in events:
            self._seq += 1
            log.append(StoredEvent(self._seq, *_fields(event)))

    def reseal(self, workflow_id: str, seq: int, old: str, new: str) -> bool:
        """Replace event ``seq``'s data with ``new`` if it still is ``old``."""
        events = self._events.get(workflow_id, [])
        at = bisect.bisect_left([e.seq for e in events], seq)
        if at == len(events) or events[at].seq != seq or events[at].data != old:
            return False
        events[at] = dataclasses.replace(events[at], data=new)
        return True

    def thin(self, workflow_id: str, below: int) -> None:
        """Forget the workflow's events of steps below ``below`` (a retention sweep's)."""
        events = self._events.get(workflow_id)
        if events:
            events[:] = [e for e in events if e.step is None or e.step >= below]

    def drop(self, workflow_id: str) -> None:
        """Forget the workflow's events."""
        self._events.pop(workflow_id, None)

    def clear(self) -> None:
        """Forget every event."""
        self._events.clear()


def _fields(event: StoredEvent) -> tuple[str, datetime, int | None, int | None, str]:
    return event.kind, event.at, event.step, event.attempt, event.data


#: The kinds whose ``attempt`` is the record's count of failed runs.
_COUNTED = frozenset(
    {
        EventKind.STEP_FAILED,
        EventKind.RETRY_SCHEDULED,
        EventKind.FAILED,
        EventKind.EFFECT_IN_DOUBT,
    }
)
