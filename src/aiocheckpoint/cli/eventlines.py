"""A workflow's event history through ``copy``, ``export`` and ``import``.

``copy`` and ``import`` write the workflow's status at the destination first (which
appends its own events there), then put the source's history in their place: the
destination's history is the source's, and a copy run again writes the same one.
An export writes a workflow's event lines after its workflow line (export format 3).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..manager import CheckpointManager
from ..storage.events import MAX_EVENT_PAGE, EventStorage, StoredEvent

__all__ = ["carry_events", "event_line", "parse_event", "put_events", "read_events"]


async def read_events(manager: CheckpointManager, workflow_id: str) -> list[StoredEvent]:
    """Every event of the workflow at ``manager``'s store, oldest first (none: no history)."""
    storage = manager.storage
    if not isinstance(storage, EventStorage):
        return []
    found: list[StoredEvent] = []
    after: int | None = None
    while page := await storage.get_events(workflow_id, after=after, limit=MAX_EVENT_PAGE):
        found += page
        after = page[-1].seq
    return found


async def put_events(
    manager: CheckpointManager, workflow_id: str, events: list[StoredEvent]
) -> bool:
    """Make ``events`` the workflow's history at ``manager``'s store; False if it keeps none."""
    storage = manager.storage
    if not isinstance(storage, EventStorage):
        return False
    await storage.put_events(workflow_id, events, replace=True)
    return True


async def carry_events(src: CheckpointManager, dst: CheckpointManager, workflow_id: str) -> int:
    """Copy the workflow's history from ``src`` to ``dst``; how many events were carried."""
    events = await read_events(src, workflow_id)
    if not events or not await put_events(dst, workflow_id, events):
        return 0
    return len(events)


def event_line(workflow_id: str, event: StoredEvent) -> dict[str, Any]:
    """An export's line of one event."""
    return {
        "type": "event",
        "workflow_id": workflow_id,
        "kind": event.kind,
        "at": event.at.isoformat(),
        "step": event.step,
        "attempt": event.attempt,
        "data": json.loads(event.data),
    }


def parse_event(obj: dict[str, Any]) -> StoredEvent:
    """An event line's event; ValueError if a field is bad (checked again when put)."""
    at = obj.get("at")
    data = obj.get("data")
    if not isinstance(at, str) or not isinstance(data, dict):
        raise ValueError("an event line needs its time (ISO text) and data (an object)")
    when = datetime.fromisoformat(at)
    if when.tzinfo is None:
        raise ValueError("an event's time must carry its time zone")
    step, attempt, kind = obj.get("step"), obj.get("attempt"), obj.get("kind")
    for value in (step, attempt):
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"an event's step or attempt is bad: {value!r}")
    if not isinstance(kind, str) or not 0 < len(kind) <= 64:
        raise ValueError("an event's kind is 1-64 characters")
    return StoredEvent(0, kind, when, step, attempt, json.dumps(data, ensure_ascii=False))
