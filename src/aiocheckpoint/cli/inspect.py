"""Reading a store: ``workflows``, ``history`` and ``show``."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from .._validation import check_workflow_id
from ..codec import EffectRecord
from ..errors import CheckpointNotFoundError
from ..leases import WORKFLOW_KIND, WorkflowRecord, WorkflowStatus
from ..manager import CheckpointManager
from ..models import Checkpoint
from .effects import (
    doubts_json,
    effect_counts,
    effects_json,
    in_doubt_of,
    print_doubts,
    print_effects,
    step_effects,
)
from .events import event_json, events_by_step, step_summary
from .keys import command_keys
from .output import Output, Progress, compact, dumps, int_text, note_foreign, printable, when
from .query import cmd_query, wants_query
from .redact import redact_url
from .store import (
    EXIT_STORE,
    EXIT_UNREADABLE,
    CommandError,
    Locked,
    Record,
    Unreadable,
    decode,
    foreign_json,
    iter_records,
    open_store,
    problem,
    read_page,
    workflow_ids,
)

__all__ = ["checkpoint_json", "cmd_history", "cmd_show", "cmd_workflows", "load_checkpoint"]


async def cmd_workflows(args: argparse.Namespace, out: Output) -> int:
    """Table of workflows: steps, latest step and status, last write, finished or not."""
    if wants_query(args):
        return await cmd_query(args, out)
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        records: dict[str, WorkflowRecord] = {}
        if manager.supports_workflow_records():
            records = {r.workflow_id: r for r in await manager.list_workflow_records(kind=None)}
        elif args.unfinished:
            raise CommandError(
                "--unfinished needs workflow records, and this store's backend "
                f"({type(manager.storage).__name__}) keeps none"
            )
        ids, foreign = await workflow_ids(manager, records)
        if args.in_doubt:  # those too that have no checkpoint yet (killed in their first step)
            ids = await manager.list_in_doubt_workflows()
        if args.unfinished:  # what runners drive: not a LangGraph thread
            ids = [i for i in ids if i in records and _unfinished(records[i])]
        progress = Progress(out.err)
        rows = []
        for n, workflow_id in enumerate(ids, 1):
            progress.update(f"workflows: {n}/{len(ids)}")
            rows.append(await _summary(manager, workflow_id, records.get(workflow_id)))
            if args.in_doubt:
                rows[-1]["_in_doubt"] = await in_doubt_of(manager, workflow_id)
                rows[-1]["in_doubt"] = doubts_json(rows[-1]["_in_doubt"])
        progress.clear()
    if out.json_mode:
        out.json({"workflows": [_public(r) for r in rows], **foreign_json(foreign)})
        return 0
    note_foreign(out, foreign)
    if not rows:
        out.note("no workflows" + _filtered(args))
    elif args.in_doubt:
        doubts = [(r["workflow_id"], r["workflow_status"] or "-", r["_in_doubt"]) for r in rows]
        print_doubts(out, args.url, doubts)
    else:
        out.table(
            ["WORKFLOW", "STEPS", "LATEST", "STATUS", "LAST WRITE", "WORKFLOW STATUS"],
            [
                [
                    printable(r["workflow_id"]),
                    str(r["steps"]),
                    _latest(r),
                    r["latest_status"] or "-",
                    r["_last_write"],
                    _workflow_status(r),
                ]
                for r in rows
            ],
            statuses=(3, 5),
        )
    return 0


def _unfinished(record: WorkflowRecord) -> bool:
    return record.status is WorkflowStatus.UNFINISHED and record.kind == WORKFLOW_KIND


def _latest(row: dict[str, Any]) -> str:
    """The latest step; none for another kind's workflow (a LangGraph step is a time)."""
    if row["latest_step"] is None or row["kind"] not in (None, WORKFLOW_KIND):
        return "-"
    return str(row["latest_step"])


def _workflow_status(row: dict[str, Any]) -> str:
    """The record's status, or the kind of a workflow runners do not drive."""
    if row["kind"] not in (None, WORKFLOW_KIND):
        return f"({row['kind']})"
    return row["workflow_status"] or "-"


def _filtered(args: argparse.Namespace) -> str:
    words = [" unfinished" if args.unfinished else "", " in doubt" if args.in_doubt else ""]
    return "".join(words)


async def _summary(
    manager: CheckpointManager, workflow_id: str, record: WorkflowRecord | None
) -> dict[str, Any]:
    steps = 0
    latest: Record | None = None
    async for stored in iter_records(manager.storage, workflow_id):
        steps += 1
        latest = stored
    checkpoint = None if latest is None else await decode(manager, workflow_id, latest)
    if isinstance(checkpoint, Checkpoint):
        status: str | None = checkpoint.status.value
        written = checkpoint.timestamp
    else:
        status = None if checkpoint is None else problem(checkpoint)
        written = None
    return {
        "workflow_id": workflow_id,
        "steps": steps,
        "latest_step": None if latest is None else latest.step,
        "latest_status": status,
        "last_write": None if written is None else written.isoformat(),
        "_last_write": when(written),
        "workflow_status": None if record is None else record.status.value,
        "kind": None if record is None else record.kind,
        "finished": None if record is None else record.status is not WorkflowStatus.UNFINISHED,
    }


async def cmd_history(args: argparse.Namespace, out: Output) -> int:
    """One page of a workflow's checkpoints, newest first."""
    workflow_id = check_workflow_id(args.workflow)
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        page = await read_page(
            manager.storage,
            workflow_id,
            before=args.before,
            limit=args.limit + 1,
            descending=True,
        )
        if not page and not await manager.has_checkpoint(workflow_id):
            raise CheckpointNotFoundError(workflow_id)
        more = len(page) > args.limit
        page = page[: args.limit]
        entries = [await _entry(manager, workflow_id, record) for record in page]
        by_step = await events_by_step(manager, workflow_id)
    for entry in entries:
        events = None if by_step is None else by_step.get(entry["step"], [])
        entry["_events"] = events
        entry["events"] = None if events is None else [event_json(e) for e in events]
    next_before = page[-1].step if more else None
    if out.json_mode:
        out.json(
            {
                "workflow_id": workflow_id,
                "checkpoints": [_public(e) for e in entries],
                "next_before": next_before,
            }
        )
        return 0
    if entries:
        out.table(
            ["STEP", "AGENT", "STATUS", "TIME", "SIZE", "EFFECTS", "EVENTS"],
            [
                [
                    str(e["step"]),
                    printable(e["agent_id"] or "-"),
                    e["status"],
                    when(e["_time"]),
                    str(e["size"]) if e["size"] is not None else "-",
                    effect_counts(e["_effects"]),
                    step_summary(e["_events"]),
                ]
                for e in entries
            ],
            fit=1,
            statuses=(2,),
        )
    else:
        out.note(f"no checkpoints before step {args.before}")
    if next_before is not None:
        command = shlex.join(
            [
                "aiocheckpoint",
                "history",
                redact_url(args.url),
                workflow_id,
                "--limit",
                str(args.limit),
                "--before",
                str(next_before),
            ]
        )
        out.note(f"more: {command}")
    return 0


async def _entry(manager: CheckpointManager, workflow_id: str, record: Any) -> dict[str, Any]:
    result = await decode(manager, workflow_id, record)
    size = None if isinstance(record, Unreadable) else len(record.data)
    effects = await step_effects(manager, workflow_id, record.step)
    entry: dict[str, Any] = {
        "step": record.step,
        "size": size,
        "effects": effects_json(effects),
        "_effects": effects,
    }
    if isinstance(result, Checkpoint):
        entry.update(
            agent_id=result.agent_id,
            status=result.status.value,
            timestamp=result.timestamp.isoformat(),
            _time=result.timestamp,
        )
    else:
        status = problem(result)
        entry.update(agent_id=None, status=status, timestamp=None, reason=result, _time=None)
    return entry


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


async def load_checkpoint(
    manager: CheckpointManager, workflow_id: str, step: int | None
) -> tuple[Checkpoint, int]:
    """A checkpoint (the latest when ``step`` is None) and its record's size in bytes."""
    workflow_id = check_workflow_id(workflow_id)
    stored = await manager.storage.load(workflow_id, step)
    if stored is None:
        raise CheckpointNotFoundError(workflow_id, step)
    result = await decode(manager, workflow_id, stored)
    if isinstance(result, Locked):
        where = f"workflow {workflow_id!r} step {stored.step}"
        raise CommandError(f"{where}: {result}", EXIT_UNREADABLE)
    if isinstance(result, str):
        where = f"workflow {workflow_id!r} step {stored.step}"
        raise CommandError(f"corrupted checkpoint: {where}: {result}", EXIT_STORE)
    return result, len(stored.data)


def checkpoint_json(checkpoint: Checkpoint, size: int) -> dict[str, Any]:
    """A checkpoint as JSON, shaped like its record's body, plus the record's size."""
    snapshot = checkpoint.state_snapshot
    return {
        "workflow_id": checkpoint.workflow_id,
        "step": checkpoint.step,
        "agent_id": checkpoint.agent_id,
        "status": checkpoint.status.value,
        "timestamp": checkpoint.timestamp.isoformat(),
        "size": size,
        "metrics": checkpoint.metrics.model_dump(mode="json"),
        "metadata": checkpoint.metadata,
        "state": {
            "data": snapshot.data,
            "version": snapshot.version.model_dump(mode="json"),
            "metadata": snapshot.metadata,
        },
    }


async def cmd_show(args: argparse.Namespace, out: Output) -> int:
    """One checkpoint with its state pretty-printed."""
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        try:
            checkpoint, size = await load_checkpoint(manager, args.workflow, args.step)
        except CheckpointNotFoundError:
            # A run stopped inside a step leaves its effects there before any checkpoint.
            if args.step is None:
                raise
            effects = await step_effects(manager, check_workflow_id(args.workflow), args.step)
            if not effects:
                raise
            return _show_effects_only(out, args.workflow, args.step, effects)
        effects = await step_effects(manager, checkpoint.workflow_id, checkpoint.step)
    if out.json_mode:
        out.json({**checkpoint_json(checkpoint, size), "effects": effects_json(effects)})
        return 0
    version = checkpoint.state_snapshot.version
    changed = printable(", ".join(version.changed_fields)) or "-"
    by = printable(version.agent_id or "-")
    metrics = {
        k: v
        for k, v in checkpoint.metrics.model_dump(mode="json").items()
        if v not in (None, 0, 0.0)
    }
    fields = [
        ("workflow", printable(checkpoint.workflow_id)),
        ("step", str(checkpoint.step)),
        ("agent", printable(checkpoint.agent_id)),
        ("status", out.status(checkpoint.status.value)),
        ("time", when(checkpoint.timestamp)),
        ("size", f"{size} bytes"),
        ("version", f"{int_text(version.version)} (by {by}; changed: {changed})"),
        ("metrics", " ".join(f"{k}={compact(v)}" for k, v in metrics.items()) or "-"),
        ("metadata", compact(checkpoint.metadata) if checkpoint.metadata else "-"),
    ]
    for name, value in fields:
        out.line(f"{out.style(f'{name:<9}', 'bold')} {value}")
    print_effects(out, effects)
    out.line(out.style("state:", "bold"))
    out.line(dumps(checkpoint.state_snapshot.data, indent=2))
    return 0


def _show_effects_only(
    out: Output, workflow_id: str, step: int, effects: list[EffectRecord] | str
) -> int:
    """``show`` of a step that has effects and no checkpoint."""
    if out.json_mode:
        out.json(
            {
                "workflow_id": workflow_id,
                "step": step,
                "checkpoint": None,
                "effects": effects_json(effects),
            }
        )
        return 0
    fields = [
        ("workflow", printable(workflow_id)),
        ("step", str(step)),
        ("status", "no checkpoint (the step is running, or a run stopped inside it)"),
    ]
    for name, value in fields:
        out.line(f"{out.style(f'{name:<9}', 'bold')} {value}")
    print_effects(out, effects)
    return 0
