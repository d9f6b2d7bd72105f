"""Maintaining a store: ``verify``, ``prune``, ``rm`` and ``fork``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from .._validation import check_workflow_id
from ..errors import CheckpointNotFoundError
from ..manager import CheckpointManager
from .keys import command_keys
from .output import Output, Progress, bar, note_foreign, printable
from .store import (
    EXIT_PROBLEMS,
    EXIT_UNREADABLE,
    CommandError,
    Locked,
    decode,
    foreign_json,
    iter_records,
    open_store,
    read_page,
    workflow_ids,
)

__all__ = ["cmd_fork", "cmd_prune", "cmd_rm", "cmd_verify"]


async def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    """Decode and check every checkpoint of every workflow.

    Records the keys given cannot read are counted apart from corrupted ones: their bytes
    may be sound (exit status 5 when nothing is corrupted).
    """
    progress = Progress(out.err)
    corrupted: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    checked = 0
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        ids, foreign = await workflow_ids(manager)
        for n, workflow_id in enumerate(ids, 1):
            async for record in iter_records(manager.storage, workflow_id):
                checked += 1
                result = await decode(manager, workflow_id, record)
                if isinstance(result, str):
                    found = unreadable if isinstance(result, Locked) else corrupted
                    found.append(
                        {"workflow_id": workflow_id, "step": record.step, "reason": result}
                    )
                progress.update(
                    f"verify: {bar(n - 1, len(ids))} workflows, {checked} checkpoints, "
                    f"{len(corrupted)} corrupted, {len(unreadable)} unreadable"
                )
    progress.clear()
    status = _verify_status(corrupted or foreign, unreadable)
    if out.json_mode:
        out.json(
            {
                "ok": status == 0,
                "workflows": len(ids),
                "checkpoints": checked,
                "corrupted": corrupted,
                **({"unreadable": unreadable} if unreadable else {}),
                **foreign_json(foreign),
            }
        )
        return status
    problems = [
        [printable(c["workflow_id"]), str(c["step"]), c["reason"]] for c in corrupted + unreadable
    ]
    problems += [[f.shown, "-", f"foreign row: {f.reason}"] for f in foreign]
    if problems:
        out.table(["WORKFLOW", "STEP", "PROBLEM"], problems)
    summary = f"checked {checked} checkpoints in {len(ids)} workflows: {len(corrupted)} corrupted"
    summary += f", {len(unreadable)} unreadable with these keys" if unreadable else ""
    summary += f", {len(foreign)} foreign rows" if foreign else ""
    out.line(out.style(summary, "green" if status == 0 else "red"))
    return status


def _verify_status(damaged: object, unreadable: list[dict[str, Any]]) -> int:
    """1 if anything is damaged, else 5 if a record needs keys not given, else 0."""
    if damaged:
        return EXIT_PROBLEMS
    return EXIT_UNREADABLE if unreadable else 0


async def cmd_prune(args: argparse.Namespace, out: Output) -> int:
    """Delete all but the newest N checkpoints of one workflow or of every workflow."""
    results: list[dict[str, Any]] = []
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        if args.workflow is not None:
            ids = [check_workflow_id(args.workflow)]
            if not await manager.has_checkpoint(ids[0]):
                raise CheckpointNotFoundError(ids[0])
        else:
            ids, foreign = await workflow_ids(manager)
            note_foreign(out, foreign)
        for workflow_id in ids:
            deleted = await _prune_one(manager, workflow_id, args.keep, dry_run=args.dry_run)
            results.append({"workflow_id": workflow_id, "deleted": deleted})
    total = sum(r["deleted"] for r in results)
    verb = "would delete" if args.dry_run else "deleted"
    if out.json_mode:
        out.json(
            {"keep": args.keep, "dry_run": args.dry_run, "deleted": total, "workflows": results}
        )
    else:
        for r in results:
            if r["deleted"]:
                out.line(f"{printable(r['workflow_id'])}: {verb} {r['deleted']}")
        out.line(
            f"{verb} {total} checkpoints in {len(ids)} workflows, keeping the newest {args.keep}"
        )
    return 0


async def _prune_one(
    manager: CheckpointManager, workflow_id: str, keep: int, *, dry_run: bool
) -> int:
    newest = await read_page(manager.storage, workflow_id, limit=keep, descending=True)
    if len(newest) < keep:
        return 0
    deleted = 0
    async for record in iter_records(manager.storage, workflow_id, before=newest[-1].step):
        if dry_run or await manager.delete_checkpoints(workflow_id, record.step):
            deleted += 1
    return deleted


async def cmd_rm(args: argparse.Namespace, out: Output) -> int:
    """Delete one checkpoint, or a whole workflow after confirmation."""
    workflow_id = check_workflow_id(args.workflow)
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        if args.step is not None:
            if not await manager.delete_checkpoints(workflow_id, args.step):
                raise CheckpointNotFoundError(workflow_id, args.step)
            message = f"deleted step {args.step} of workflow {printable(workflow_id)}"
        else:
            latest = await manager.storage.load(workflow_id)
            if latest is None:
                raise CheckpointNotFoundError(workflow_id)
            if not args.yes and not await _confirm(out, workflow_id, latest.step):
                out.note("aborted: nothing deleted")
                return EXIT_PROBLEMS
            await manager.delete_checkpoints(workflow_id)
            message = f"deleted workflow {printable(workflow_id)}"
    if out.json_mode:
        out.json({"deleted": True, "workflow_id": workflow_id, "step": args.step})
    else:
        out.line(message)
    return 0


async def _confirm(out: Output, workflow_id: str, latest: int) -> bool:
    if not sys.stdin.isatty():
        raise CommandError(
            f"refusing to delete workflow {workflow_id!r} without confirmation: stdin is not "
            "a terminal; pass --yes to delete it"
        )
    out.err.write(
        f"delete workflow {printable(workflow_id)!r} and all its checkpoints "
        f"(latest step {latest})? [y/N] "
    )
    out.err.flush()
    answer = await asyncio.to_thread(sys.stdin.readline)
    return answer.strip().lower() in ("y", "yes")


async def cmd_fork(args: argparse.Namespace, out: Output) -> int:
    """Copy a workflow's history up to a step into a new workflow (blobs are shared)."""
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        copied = await manager.fork_workflow(args.source, args.step, args.new_id)
    if out.json_mode:
        out.json(
            {
                "source": args.source,
                "step": args.step,
                "workflow_id": args.new_id,
                "checkpoints": copied,
            }
        )
        return 0
    out.line(
        f"forked {printable(args.source)} at step {args.step} into {printable(args.new_id)} "
        f"({copied} checkpoints)"
    )
    return 0
