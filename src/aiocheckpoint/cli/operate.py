"""``resume``, ``retry`` and ``cancel``: an operator's hand on a workflow's life cycle.

See docs/cli.md and docs/resuming.md. ``resume`` and ``retry`` take the workflow's lease
for their write (:func:`aiocheckpoint.control.operate`), so a runner holding it refuses
them; ``cancel`` takes the lease *away* from the runner, which stops at its next step
boundary or effect.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._validation import check_workflow_id
from ..codec import locked_view
from ..control import operate
from ..errors import LeaseHeldError
from ..leases import WorkflowRecord
from ..manager import CheckpointManager
from ..storage.base import WorkflowStorage
from ..storage.lifecycle import cancel_reason, check_resume
from .keys import command_keys
from .output import Output, printable
from .store import EXIT_STORE, EXIT_USAGE, CommandError, open_store

__all__ = ["cmd_cancel", "cmd_resume", "cmd_retry", "input_value"]


def input_value(text: str) -> Any:
    """``--input``'s JSON text, parsed (argparse reports a bad one as a usage error)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--input is not JSON: {exc}") from None


async def cmd_resume(args: argparse.Namespace, out: Output) -> int:
    """``resume``: a PAUSED workflow becomes claimable, with ``--input`` for its next run."""
    workflow_id = check_workflow_id(args.workflow)
    async with _open(args) as manager:
        storage = _records(manager)
        record = await _held(
            workflow_id,
            operate(
                storage,
                workflow_id,
                check_resume,
                lambda: manager.resume_workflow(workflow_id, args.input),
            ),
        )
        record = await manager.get_workflow(workflow_id) or record  # opened with the keys
    return _report(out, record, "resumed: the next runner claims it")


async def cmd_retry(args: argparse.Namespace, out: Output) -> int:
    """``retry``: a FAILED or CANCELLED workflow becomes claimable, attempts back to 0."""
    workflow_id = check_workflow_id(args.workflow)
    async with _open(args) as manager:
        _records(manager)
        record = await _held(workflow_id, manager.retry_workflow(workflow_id))
    return _report(out, record, "retried: the next runner claims it")


async def cmd_cancel(args: argparse.Namespace, out: Output) -> int:
    """``cancel``: the workflow is CANCELLED; a runner driving it stops at its next step."""
    workflow_id = check_workflow_id(args.workflow)
    async with _open(args) as manager:
        storage = _records(manager)
        before = await storage.get_workflow(workflow_id)
        record = await manager.cancel_workflow(workflow_id, reason=args.reason)
    runner = _live_owner(before)
    if out.json_mode:
        out.json({**_record_json(record), "stopped_runner": runner})
        return 0
    reason = cancel_reason(record)
    why = "" if reason is None else f" ({printable(locked_view(reason))})"
    out.line(f"workflow {printable(workflow_id)}: cancelled{why}")
    if runner is not None:
        out.line(
            f"runner {printable(runner)} held its lease: it stops at its next step boundary "
            "or effect"
        )
    return 0


def _open(args: argparse.Namespace) -> Any:
    return open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    )


def _records(manager: CheckpointManager) -> WorkflowStorage:
    storage = manager.storage
    if not isinstance(storage, WorkflowStorage):
        raise CommandError(f"{type(storage).__name__} keeps no workflow records", EXIT_USAGE)
    return storage


async def _held(workflow_id: str, write: Any) -> WorkflowRecord:
    """Await ``write``; a runner holding the lease is one plain line (exit status 4)."""
    try:
        record: WorkflowRecord = await write
    except LeaseHeldError as exc:
        raise CommandError(
            f"a runner holds workflow {printable(workflow_id)}'s lease, so nothing was "
            f"changed; try again once it has stopped ({exc})",
            EXIT_STORE,
        ) from exc
    return record


def _live_owner(record: WorkflowRecord | None) -> str | None:
    """The owner of the record's lease, if it had one (expired or not: it was revoked)."""
    return None if record is None else record.lease_owner


def _report(out: Output, record: WorkflowRecord, what: str) -> int:
    if out.json_mode:
        out.json(_record_json(record))
    else:
        out.line(f"workflow {printable(record.workflow_id)}: {what}")
    return 0


def _record_json(record: WorkflowRecord) -> dict[str, Any]:
    return {
        "workflow_id": record.workflow_id,
        "status": str(record.status),
        "attempts": record.attempts,
        "last_error": locked_view(record.last_error),
        "resume_input": locked_view(record.resume_input),
        "updated_at": record.updated_at.isoformat(),
    }
