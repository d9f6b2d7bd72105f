"""A workflow's event history on its page: a table of events and their spans on the timeline.

The table shows :data:`EVENTS` events, oldest first, from ``get_events``' cursor (the page
links to the next ones). The timeline follows the table's paging and draws further: the
events from the same cursor on, up to :data:`TIMELINE_EVENTS` of them (the table's page and
the pages after it, read a page at a time), so a workflow of up to that many events is
drawn whole from its first page, and a longer one a window at a time as its pages are
turned. A request thus reads at most :data:`TIMELINE_EVENTS` events and keeps each as a
row whose details are cut to :data:`DETAIL` characters. Each event becomes a row (its
time, step, attempt and details: an error's type and message, a pause's reason and data,
a resume's input...) and a span on the timeline: a failed attempt or a lease taken over
is an instant in the lane of its kind, a pause runs to the resume (or cancel) that ends
it, a sleep to its wake-up time.

Every text is the store's, so attacker-controlled: the template escapes it. A sealed text
of an encrypted store read without its key stays sealed and is shown locked; a page that
a key the inspector holds cannot open (another key, a damaged seal) is read again without
opening anything, every sealed text locked, and the page says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final
from urllib.parse import urlencode

from ..codec import is_sealed_text, locked_view
from ..errors import CheckpointError, InvalidArgumentError
from ..history import WorkflowEvent, get_events, keeps_events
from ..leases import Page
from ..manager import CheckpointManager
from .charts import Span
from .data import problem_of

__all__ = ["EVENTS", "TIMELINE_EVENTS", "EventRow", "History", "event_spans", "read_history"]

#: Events the table shows per page.
EVENTS: Final = 200
#: Events one request reads (and the timeline draws) at most, from the table's cursor on.
TIMELINE_EVENTS: Final = 2000
#: Characters of one detail shown at most.
DETAIL: Final = 500
#: Characters of one event's tooltip on the timeline at most.
TITLE: Final = 600
#: The details each kind shows, in order (other fields follow; unknown kinds show all).
_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "step_failed": ("type", "message"),
    "effect_in_doubt": ("type", "message"),
    "paused": ("reason", "data"),
    "resumed": ("input",),
    "cancelled": ("reason",),
    "sleeping": ("until",),
    "retry_scheduled": ("at",),
    "retried": ("previous",),
    "effect_resolved": ("step", "key"),
    "forked": ("from", "step"),
    "lease_taken_over": ("previous_owner",),
}
#: The timeline lane of each kind.
_LANES: Final = {
    "step_failed": "attempts",
    "retry_scheduled": "attempts",
    "failed": "attempts",
    "paused": "pauses",
    "resumed": "pauses",
    "sleeping": "sleeps",
    "effect_in_doubt": "effects",
    "effect_resolved": "effects",
    "lease_taken_over": "lease",
}


@dataclass(frozen=True)
class Detail:
    """One field of an event: its name, its text (JSON for a non-text) and if it is sealed."""

    name: str
    text: str
    locked: bool = False


@dataclass(frozen=True)
class EventRow:
    """One event as the page shows it."""

    kind: str
    time: datetime
    step: int | None
    attempt: int | None
    details: list[Detail]
    seq: int

    @property
    def css(self) -> str:
        """The stylesheet class of its kind (``event-step_failed``)."""
        return f"event-{_css(self.kind)}"


@dataclass
class History:
    """The page of a workflow's events the workflow page shows."""

    rows: list[EventRow] = field(default_factory=list)
    #: the cursor of the next page (None: this page is the last)
    next_cursor: str | None = None
    #: the cursor this page was read from (None: the first page)
    cursor: str | None = None
    #: the store keeps no event history (the file store)
    unsupported: bool = False
    #: why the sealed texts are shown locked though the inspector has keys, or why the
    #: history could not be read at all
    problem: str | None = None
    #: the rows the timeline draws: these and the ones after, :data:`TIMELINE_EVENTS` at most
    drawn: list[EventRow] = field(default_factory=list)
    #: whether events follow the last one drawn (the timeline stops before the history's end)
    drawn_more: bool = False


async def read_history(manager: CheckpointManager, workflow_id: str, cursor: str | None) -> History:
    """A page of the workflow's events after ``cursor``, oldest first, and those drawn.

    The table's page is :data:`EVENTS` events; the timeline's rows go on from it, a page
    at a time, to :data:`TIMELINE_EVENTS` events at most.
    """
    history = History(cursor=cursor)
    if not keeps_events(manager.storage):
        history.unsupported = True
        return history
    page = await _page(manager, workflow_id, cursor, EVENTS, history)
    if page is None:
        return history
    history.rows = [_row(event) for event in page]
    history.next_cursor = page.next_cursor
    history.drawn = list(history.rows)
    following = page.next_cursor
    while following is not None and len(history.drawn) < TIMELINE_EVENTS:
        limit = min(EVENTS, TIMELINE_EVENTS - len(history.drawn))
        more = await _page(manager, workflow_id, following, limit, history)
        if more is None:
            break
        history.drawn += [_row(event) for event in more]
        following = more.next_cursor
    history.drawn_more = following is not None
    return history


async def _page(
    manager: CheckpointManager, workflow_id: str, cursor: str | None, limit: int, into: History
) -> Page[WorkflowEvent] | None:
    """``limit`` events after ``cursor``; sealed texts left sealed if they cannot be opened.

    Why not is kept in ``into.problem``; None: not even that could be read.
    """
    try:
        return await manager.get_events(workflow_id, limit=limit, cursor=cursor)
    except InvalidArgumentError:
        raise  # a bad cursor: the request's fault
    except CheckpointError as exc:
        into.problem = problem_of(exc)
        try:  # the same page, its sealed texts left sealed: shown locked
            return await get_events(manager.storage, workflow_id, limit, cursor)
        except CheckpointError as again:
            into.problem = problem_of(again)
            return None


def _row(event: WorkflowEvent) -> EventRow:
    kind = str(event.kind)
    names = _FIELDS.get(kind, ())
    ordered = [n for n in names if n in event.data]
    ordered += sorted(n for n in event.data if n not in names)
    details = [_detail(name, event.data[name]) for name in ordered]
    return EventRow(kind, event.time, event.step, event.attempt, details, event.seq)


def _detail(name: str, value: Any) -> Detail:
    if is_sealed_text(value):
        return Detail(name, str(locked_view(value)), locked=True)
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(locked_view(value), ensure_ascii=False, sort_keys=True, default=str)
    cut = f" … ({len(text) - DETAIL} more characters)" if len(text) > DETAIL else ""
    return Detail(str(name), text[:DETAIL] + cut)


def event_spans(workflow_id: str, history: History, end: datetime | None) -> list[Span]:
    """The timeline's spans of the events drawn (``history.drawn``).

    ``end`` is as far as the page knows the workflow (its record's last update): an open
    pause or a sleep is drawn to it at most, so a far wake-up time cannot squash the rest.
    """
    spans: list[Span] = []
    paused: EventRow | None = None
    for row in history.drawn:
        if row.kind == "paused":
            paused = row
            continue
        if paused is not None and row.kind in ("resumed", "cancelled"):
            spans.append(_pause(workflow_id, paused, row.time, row))
            paused = None
        spans.append(_event_span(workflow_id, row, end))
    if paused is not None:
        spans.append(_pause(workflow_id, paused, max(end or paused.time, paused.time), None))
    return spans


def _event_span(workflow_id: str, row: EventRow, end: datetime | None) -> Span:
    lane = _LANES.get(row.kind, "workflow")
    stop = row.time
    if row.kind == "sleeping":
        until = _time(next((d.text for d in row.details if d.name == "until"), None))
        if until is not None and end is not None:
            stop = max(min(until, end), row.time)
    return Span(lane, row.time, stop, row.css, _title(row), _href(workflow_id, row))


def _pause(workflow_id: str, paused: EventRow, end: datetime, ended: EventRow | None) -> Span:
    title = _title(paused)
    if ended is not None:
        title += f"; {_title(ended)}"
    return Span("pauses", paused.time, end, "event-paused", title, _href(workflow_id, paused))


def _title(row: EventRow) -> str:
    attempt = f" (attempt {row.attempt})" if row.attempt is not None else ""
    step = f" at step {row.step}" if row.step is not None else ""
    details = ", ".join(f"{d.name}: {d.text[:200]}" for d in row.details)
    title = f"{row.kind}{attempt}{step}, {row.time.isoformat()}" + (
        f": {details}" if details else ""
    )
    return title if len(title) <= TITLE else title[: TITLE - 1] + "…"


def _href(workflow_id: str, row: EventRow) -> str | None:
    if row.step is None:
        return None
    return "/step?" + urlencode({"id": workflow_id, "step": row.step})


def _css(kind: str) -> str:
    """A kind as a class name: its letters, digits and underscores only."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "-" for c in kind)[:40]


def _time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.strip('"'))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None
