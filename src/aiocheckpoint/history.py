"""A workflow's event history, as the manager reads and writes it (``docs/operating.md``).

A completed step is its checkpoint; every other change of a workflow's life is an event the
storage appends in the change's own transaction (:mod:`aiocheckpoint.storage.events`). The
manager's :meth:`~aiocheckpoint.CheckpointManager.get_events` delegates here.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._telemetry import round_trip
from .codec import FieldSealer
from .errors import CheckpointCorruptedError, InvalidArgumentError, UnsupportedOperationError
from .leases import Lease, Page, WorkflowRecord, WorkflowStatus
from .storage.base import CheckpointStorage
from .storage.events import MAX_EVENT_PAGE, EventKind, EventNote, EventStorage, StoredEvent

__all__ = [
    "WorkflowEvent",
    "event_storage",
    "forked_note",
    "get_events",
    "keeps_events",
    "mark_with_note",
    "pause_note",
]


@dataclass(frozen=True, slots=True)
class WorkflowEvent:
    """One event of a workflow's history (``docs/operating.md``).

    ``kind`` is an :class:`~aiocheckpoint.EventKind` (a plain str for a kind this version
    does not know), ``time`` the storage's clock when it was written, ``step`` the
    workflow's latest step then, ``attempt`` the count of failed runs for the failure
    kinds (None for others), ``data`` the kind's details (a JSON object), ``seq`` its
    place in the store's order.
    """

    kind: EventKind | str
    time: datetime
    step: int | None
    attempt: int | None
    data: dict[str, Any]
    seq: int


def keeps_events(storage: CheckpointStorage) -> bool:
    """Whether ``storage`` keeps event histories."""
    return isinstance(storage, EventStorage)


def event_storage(storage: CheckpointStorage) -> EventStorage:
    """``storage`` if it keeps event histories, else UnsupportedOperationError."""
    if not isinstance(storage, EventStorage):
        raise UnsupportedOperationError(
            f"{type(storage).__name__} keeps no event history; use a backend that does "
            "(in-memory, SQLite or PostgreSQL)"
        )
    return storage


async def get_events(
    storage: CheckpointStorage,
    workflow_id: str,
    limit: object,
    cursor: object,
    fields: FieldSealer | None = None,
) -> Page[WorkflowEvent]:
    """The workflow's events oldest first: all of them, or a page of ``limit`` after ``cursor``.

    ``fields`` opens the sealed fields of an encrypted store (:mod:`aiocheckpoint.codec`).
    """
    events = event_storage(storage)
    if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_EVENT_PAGE):
        raise InvalidArgumentError(
            f"limit must be None or an int from 1 to {MAX_EVENT_PAGE}, got {limit!r}"
        )
    after = None if cursor is None else _decode_cursor(cursor)
    found: list[WorkflowEvent] = []
    while True:
        want = MAX_EVENT_PAGE if limit is None else limit - len(found)
        page = await round_trip(events.get_events, workflow_id, after=after, limit=want)
        for stored in page:
            event = _event(workflow_id, stored)
            if fields is not None and fields.sealing:
                data = await fields.open_event(workflow_id, stored.kind, event.data)
                event = dataclasses.replace(event, data=data)
            found.append(event)
        if len(page) < want or (limit is not None and len(found) >= limit):
            break
        after = page[-1].seq
    full = limit is not None and len(found) == limit
    return Page(found, _encode_cursor(found[-1].seq) if full else None)


def _event(workflow_id: str, stored: StoredEvent) -> WorkflowEvent:
    try:
        data = json.loads(stored.data)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise CheckpointCorruptedError(
            f"event {stored.seq} ({stored.kind}) holds no JSON object", workflow_id=workflow_id
        )
    try:
        kind: EventKind | str = EventKind(stored.kind)
    except ValueError:
        kind = stored.kind
    return WorkflowEvent(kind, stored.at, stored.step, stored.attempt, data, stored.seq)


def _encode_cursor(seq: int) -> str:
    text = json.dumps({"seq": seq})
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def _decode_cursor(cursor: object) -> int:
    if not isinstance(cursor, str) or len(cursor) > 128:
        raise InvalidArgumentError(f"not an event listing cursor: {cursor!r}")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        seq = json.loads(raw.decode("ascii"))["seq"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise InvalidArgumentError(f"not an event listing cursor: {cursor!r}") from None
    if type(seq) is not int or seq < 0:
        raise InvalidArgumentError(f"not an event listing cursor: {cursor!r}")
    return seq


async def pause_note(
    fields: FieldSealer, workflow_id: str, reason: str, data_text: str
) -> EventNote:
    """The ``paused`` event of a pause: ``reason`` and data (JSON text), sealed if encrypting."""
    return EventNote(EventKind.PAUSED, await fields.pause_data(workflow_id, reason, data_text))


def forked_note(source_id: str, step: int) -> tuple[str, str]:
    """The ``forked`` event (``from``, ``step``) a fork's first save carries (``StepInfo.note``)."""
    return EventKind.FORKED.value, json.dumps({"from": source_id, "step": step})


async def mark_with_note(
    storage: EventStorage,
    workflow_id: str,
    status: WorkflowStatus,
    lease: Lease | None,
    note: EventNote,
) -> WorkflowRecord:
    """Set the workflow's status (fenced by ``lease``), appending ``note`` as its event."""
    return await round_trip(
        storage.set_workflow_status, workflow_id, status, fence=lease, note=note
    )
