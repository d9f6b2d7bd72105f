"""``events``: a workflow's event history; and what ``history`` shows of it per step.

See docs/cli.md and docs/operating.md. Every text an event holds (a pause's reason, an
error message, an owner) is printed escaped, as every other command prints stored text; a
field sealed on an encrypted store and read without ``--keys`` is printed as
``[sealed: key ID]``.
"""

from __future__ import annotations

import argparse
import shlex
from collections import Counter
from typing import Any

from .._validation import check_workflow_id
from ..codec import locked_view
from ..errors import UnknownKeyError
from ..history import WorkflowEvent, get_events, keeps_events
from ..manager import CheckpointManager
from .keys import command_keys
from .output import Output, compact, when
from .redact import redact_url
from .store import EXIT_USAGE, CommandError, open_store

__all__ = ["cmd_events", "event_json", "events_by_step", "step_summary"]

#: The most events ``history`` reads to summarise its steps.
_HISTORY_EVENTS = 10_000
#: What ``history``'s EVENTS column counts, and its words.
_SHOWN = {
    "step_failed": "failed",
    "paused": "paused",
    "resumed": "resumed",
    "retry_scheduled": "retry",
    "effect_in_doubt": "in doubt",
    "sleeping": "slept",
}


async def cmd_events(args: argparse.Namespace, out: Output) -> int:
    """A workflow's events, oldest first, a page at a time."""
    workflow_id = check_workflow_id(args.workflow)
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        if not keeps_events(manager.storage):
            raise CommandError(
                f"{type(manager.storage).__name__} keeps no event history", EXIT_USAGE
            )
        page = await manager.get_events(workflow_id, limit=args.limit, cursor=args.cursor)
    if out.json_mode:
        events = [event_json(e) for e in page]
        out.json({"workflow_id": workflow_id, "events": events, "next_cursor": page.next_cursor})
        return 0
    if page:
        out.table(
            ["TIME", "KIND", "STEP", "ATTEMPT", "DATA"],
            [
                [
                    when(e.time),
                    str(e.kind),
                    "-" if e.step is None else str(e.step),
                    "-" if e.attempt is None else str(e.attempt),
                    compact(locked_view(e.data), 100) if e.data else "-",
                ]
                for e in page
            ],
            fit=4,
        )
    else:
        after = " after the cursor" if args.cursor else ""
        out.note(f"no events of workflow {workflow_id}{after}")
    if page.next_cursor is not None:
        command = ["aiocheckpoint", "events", redact_url(args.url), workflow_id]
        command += ["--limit", str(args.limit), "--cursor", page.next_cursor]
        out.note(f"more: {shlex.join(command)}")
    return 0


def event_json(event: WorkflowEvent) -> dict[str, Any]:
    """One event as JSON."""
    return {
        "seq": event.seq,
        "kind": str(event.kind),
        "time": event.time.isoformat(),
        "step": event.step,
        "attempt": event.attempt,
        "data": locked_view(event.data),
    }


async def events_by_step(
    manager: CheckpointManager, workflow_id: str
) -> dict[int, list[WorkflowEvent]] | None:
    """The workflow's events grouped by step (None: the store keeps none).

    Sealed under a key the keys given lack, they are read sealed (shown locked): ``history``
    counts their kinds all the same.
    """
    if not keeps_events(manager.storage):
        return None
    grouped: dict[int, list[WorkflowEvent]] = {}
    try:
        page = await manager.get_events(workflow_id, limit=1000)
    except UnknownKeyError:
        return await _sealed_by_step(manager, workflow_id)
    read = 0
    while True:
        for event in page:
            if event.step is not None:
                grouped.setdefault(event.step, []).append(event)
        read += len(page)
        if page.next_cursor is None or read >= _HISTORY_EVENTS:
            return grouped
        page = await manager.get_events(workflow_id, limit=1000, cursor=page.next_cursor)


async def _sealed_by_step(
    manager: CheckpointManager, workflow_id: str
) -> dict[int, list[WorkflowEvent]]:
    grouped: dict[int, list[WorkflowEvent]] = {}
    cursor = None
    for _ in range(_HISTORY_EVENTS // 1000):
        page = await get_events(manager.storage, workflow_id, 1000, cursor)
        for event in page:
            if event.step is not None:
                grouped.setdefault(event.step, []).append(event)
        if (cursor := page.next_cursor) is None:
            break
    return grouped


def step_summary(events: list[WorkflowEvent] | None) -> str:
    """A step's attempts and pauses: ``2 failed, 1 paused, 1 resumed`` (``-``: none)."""
    counts = Counter(_SHOWN[str(e.kind)] for e in events or () if str(e.kind) in _SHOWN)
    return ", ".join(f"{n} {word}" for word, n in sorted(counts.items())) or "-"
