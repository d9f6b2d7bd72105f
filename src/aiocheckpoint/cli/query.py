"""``workflows`` with filters: one page of workflow records, read from indexes.

Any of ``--status``, ``--agent-status``, ``--meta``, ``--updated-after``,
``--updated-before``, ``--limit`` or ``--cursor`` turns ``workflows`` into a query of the
workflow records (``CheckpointManager.list_workflow_records``; ``--in-doubt`` keeps those
with an effect in doubt): nothing is counted or decoded, so a page costs about its size
however many workflows the store holds.
"""

from __future__ import annotations

import argparse
import json
import shlex
from datetime import datetime, timezone
from typing import Any

from ..codec import locked_view
from ..errors import InvalidArgumentError
from ..leases import WorkflowRecord
from .effects import doubts_json, in_doubt_of, print_doubts
from .keys import command_keys
from .output import Output, printable, when
from .redact import redact_url
from .store import CommandError, open_store

__all__ = ["QUERY_OPTIONS", "cmd_query", "wants_query"]

#: The options that make ``workflows`` a query (argparse destinations).
QUERY_OPTIONS = (
    "status",
    "agent_status",
    "meta",
    "updated_after",
    "updated_before",
    "limit",
    "cursor",
)


def wants_query(args: argparse.Namespace) -> bool:
    """Whether any query option was given."""
    return any(getattr(args, name, None) is not None for name in QUERY_OPTIONS)


def meta_pair(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``: VALUE as JSON when it parses (``3``, ``true``), else as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def moment(text: str) -> datetime:
    """An ISO 8601 time; without a zone, UTC."""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


async def cmd_query(args: argparse.Namespace, out: Output) -> int:
    """One page of workflow records passing the filters, and the command for the next."""
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        if not manager.supports_workflow_records():
            raise CommandError(
                "filters need workflow records, and this store's backend "
                f"({type(manager.storage).__name__}) keeps none"
            )
        try:
            page = await manager.list_workflow_records(
                args.status,
                agent_status=args.agent_status,
                metadata=dict(args.meta) if args.meta else None,
                updated_after=args.updated_after,
                updated_before=args.updated_before,
                limit=args.limit or 50,
                cursor=args.cursor,
                in_doubt=True if args.in_doubt else None,
            )
        except InvalidArgumentError as exc:
            raise CommandError(str(exc)) from exc
        doubts = [await in_doubt_of(manager, r.workflow_id) for r in page] if args.in_doubt else []
    if out.json_mode:
        rows = [_row(r) for r in page]
        for row, found in zip(rows, doubts, strict=False):
            row["in_doubt"] = doubts_json(found)
        out.json({"workflows": rows, "next_cursor": page.next_cursor})
        return 0
    if not page:
        out.note("no workflows match")
    elif args.in_doubt:
        pairs = zip(page, doubts, strict=True)
        print_doubts(out, args.url, [(r.workflow_id, r.status.value, d) for r, d in pairs])
    else:
        out.table(
            ["WORKFLOW", "LATEST", "AGENT", "STATUS", "UPDATED", "WORKFLOW STATUS", "ATTEMPTS"],
            [_cells(r) for r in page],
            statuses=(3, 5),
        )
    if page.next_cursor is not None:
        out.note(f"more: {_next_command(args, page.next_cursor)}")
    return 0


def _row(record: WorkflowRecord) -> dict[str, Any]:
    return {
        "workflow_id": record.workflow_id,
        "workflow_status": record.status.value,
        "kind": record.kind,
        "latest_step": record.latest_step,
        "latest_agent_id": record.latest_agent_id,
        "latest_status": record.latest_agent_status,
        "updated_at": record.updated_at.isoformat(),
        "attempts": record.attempts,
        "last_error": locked_view(record.last_error),
        "metadata": record.metadata,
    }


def _cells(record: WorkflowRecord) -> list[str]:
    return [
        printable(record.workflow_id),
        "-" if record.latest_step is None else str(record.latest_step),
        printable(record.latest_agent_id or "-"),
        record.latest_agent_status or "-",
        when(record.updated_at),
        record.status.value,
        str(record.attempts),
    ]


def _next_command(args: argparse.Namespace, cursor: str) -> str:
    words = ["aiocheckpoint", "workflows", redact_url(args.url)]
    for flag, value in (
        ("--status", args.status),
        ("--agent-status", args.agent_status),
        ("--updated-after", args.updated_after and args.updated_after.isoformat()),
        ("--updated-before", args.updated_before and args.updated_before.isoformat()),
        ("--limit", args.limit and str(args.limit)),
    ):
        if value is not None:
            words += [flag, value]
    if args.in_doubt:
        words.append("--in-doubt")
    for key, value in args.meta or ():
        words += ["--meta", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    return shlex.join([*words, "--cursor", cursor])
