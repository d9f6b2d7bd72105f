"""The ``aiocheckpoint`` command: inspect, verify, prune, copy, export and import stores.

Run ``aiocheckpoint --help`` (or ``python -m aiocheckpoint --help``); docs/cli.md describes
every command, the store URLs, the export format and the exit statuses. The command only
uses the public API (:class:`~aiocheckpoint.CheckpointManager`,
:func:`~aiocheckpoint.open_storage` and the storage protocol), so it works on every backend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

from . import __version__
from ._cli_diff import diff_states
from ._cli_output import Output, Progress, bar, compact, printable, when
from ._cli_store import (
    EXIT_NOT_FOUND,
    EXIT_PROBLEMS,
    EXIT_STORE,
    EXIT_USAGE,
    CommandError,
    Record,
    Unreadable,
    decode,
    iter_records,
    open_store,
    read_page,
)
from ._cli_transfer import cmd_copy, cmd_export, cmd_import
from ._validation import check_workflow_id
from .errors import (
    CheckpointError,
    CheckpointNotFoundError,
    InvalidArgumentError,
)
from .leases import WorkflowRecord, WorkflowStatus
from .manager import CheckpointManager
from .models import Checkpoint

__all__ = ["main"]

Command = Callable[[argparse.Namespace, Output], Coroutine[Any, Any, int]]


# --- inspecting --------------------------------------------------------------------------


async def cmd_workflows(args: argparse.Namespace, out: Output) -> int:
    """Table of workflows: steps, latest step and status, last write, finished or not."""
    async with open_store(args.url, must_exist=True) as manager:
        records: dict[str, WorkflowRecord] = {}
        if manager.supports_workflow_records():
            records = {r.workflow_id: r for r in await manager.list_workflow_records()}
        elif args.unfinished:
            raise CommandError(
                "--unfinished needs workflow records, and this store's backend "
                f"({type(manager.storage).__name__}) keeps none"
            )
        ids = sorted(set(await manager.list_workflows()) | set(records))
        if args.unfinished:
            ids = [i for i in ids if records[i].status is WorkflowStatus.UNFINISHED]
        progress = Progress(out.err)
        rows = []
        for n, workflow_id in enumerate(ids, 1):
            progress.update(f"workflows: {n}/{len(ids)}")
            rows.append(await _summary(manager, workflow_id, records.get(workflow_id)))
        progress.clear()
    if out.json_mode:
        out.json({"workflows": [_public(r) for r in rows]})
    elif not rows:
        out.note("no workflows" + (" unfinished" if args.unfinished else ""))
    else:
        out.table(
            ["WORKFLOW", "STEPS", "LATEST", "STATUS", "LAST WRITE", "FINISHED"],
            [
                [
                    printable(r["workflow_id"]),
                    str(r["steps"]),
                    "-" if r["latest_step"] is None else str(r["latest_step"]),
                    r["latest_status"] or "-",
                    r["_last_write"],
                    r["workflow_status"] or "-",
                ]
                for r in rows
            ],
            statuses=(3, 5),
        )
    return 0


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
        status = None if checkpoint is None else "corrupted"
        written = None
    return {
        "workflow_id": workflow_id,
        "steps": steps,
        "latest_step": None if latest is None else latest.step,
        "latest_status": status,
        "last_write": None if written is None else written.isoformat(),
        "_last_write": when(written),
        "workflow_status": None if record is None else record.status.value,
        "finished": None if record is None else record.status is not WorkflowStatus.UNFINISHED,
    }


async def cmd_history(args: argparse.Namespace, out: Output) -> int:
    """One page of a workflow's checkpoints, newest first."""
    workflow_id = check_workflow_id(args.workflow)
    async with open_store(args.url, must_exist=True) as manager:
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
            ["STEP", "AGENT", "STATUS", "TIME", "SIZE"],
            [
                [
                    str(e["step"]),
                    printable(e["agent_id"] or "-"),
                    e["status"],
                    when(e["_time"]),
                    str(e["size"]) if e["size"] is not None else "-",
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
                args.url,
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
    entry: dict[str, Any] = {"step": record.step, "size": size}
    if isinstance(result, Checkpoint):
        entry.update(
            agent_id=result.agent_id,
            status=result.status.value,
            timestamp=result.timestamp.isoformat(),
            _time=result.timestamp,
        )
    else:
        entry.update(agent_id=None, status="corrupted", timestamp=None, reason=result, _time=None)
    return entry


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


async def _checkpoint(
    manager: CheckpointManager, workflow_id: str, step: int | None
) -> tuple[Checkpoint, int]:
    """A checkpoint (the latest when ``step`` is None) and its record's size in bytes."""
    workflow_id = check_workflow_id(workflow_id)
    stored = await manager.storage.load(workflow_id, step)
    if stored is None:
        raise CheckpointNotFoundError(workflow_id, step)
    result = await decode(manager, workflow_id, stored)
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
    async with open_store(args.url, must_exist=True) as manager:
        checkpoint, size = await _checkpoint(manager, args.workflow, args.step)
    if out.json_mode:
        out.json(checkpoint_json(checkpoint, size))
        return 0
    version = checkpoint.state_snapshot.version
    changed = ", ".join(version.changed_fields) or "-"
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
        ("version", f"{version.version} (by {version.agent_id or '-'}; changed: {changed})"),
        ("metrics", " ".join(f"{k}={v}" for k, v in metrics.items()) or "-"),
        ("metadata", compact(checkpoint.metadata) if checkpoint.metadata else "-"),
    ]
    for name, value in fields:
        out.line(f"{out.style(f'{name:<9}', 'bold')} {value}")
    out.line(out.style("state:", "bold"))
    out.line(json.dumps(checkpoint.state_snapshot.data, ensure_ascii=False, indent=2))
    return 0


async def cmd_diff(args: argparse.Namespace, out: Output) -> int:
    """What changed in the state between two steps, path by path."""
    async with open_store(args.url, must_exist=True) as manager:
        old, _ = await _checkpoint(manager, args.workflow, args.step_a)
        new, _ = await _checkpoint(manager, args.workflow, args.step_b)
    changes = diff_states(old.state_snapshot.data, new.state_snapshot.data)
    if out.json_mode:
        out.json(
            {
                "workflow_id": old.workflow_id,
                "from_step": old.step,
                "to_step": new.step,
                "changes": [
                    {
                        "op": c.op,
                        "path": c.path,
                        "keys": list(c.keys),
                        **({"old": c.old} if c.op != "added" else {}),
                        **({"new": c.new} if c.op != "removed" else {}),
                    }
                    for c in changes
                ],
            }
        )
        return 0
    if not changes:
        out.line(f"no changes in the state between step {old.step} and step {new.step}")
        return 0
    for c in changes:
        path = printable(c.path)
        if c.op == "added":
            out.line(out.style(f"+ {path}: {compact(c.new, 200)}", "green"))
        elif c.op == "removed":
            out.line(out.style(f"- {path}: {compact(c.old, 200)}", "red"))
        else:
            line = f"~ {path}: {compact(c.old, 100)} -> {compact(c.new, 100)}"
            out.line(out.style(line, "yellow"))
    plural = "" if len(changes) == 1 else "s"
    out.note(f"{len(changes)} change{plural} from step {old.step} to step {new.step}")
    return 0


# --- maintaining -------------------------------------------------------------------------


async def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    """Decode and check every checkpoint of every workflow."""
    progress = Progress(out.err)
    corrupted: list[dict[str, Any]] = []
    checked = 0
    async with open_store(args.url, must_exist=True) as manager:
        ids = await manager.list_workflows()
        for n, workflow_id in enumerate(ids, 1):
            async for record in iter_records(manager.storage, workflow_id):
                checked += 1
                result = await decode(manager, workflow_id, record)
                if isinstance(result, str):
                    corrupted.append(
                        {"workflow_id": workflow_id, "step": record.step, "reason": result}
                    )
                progress.update(
                    f"verify: {bar(n - 1, len(ids))} workflows, {checked} checkpoints, "
                    f"{len(corrupted)} corrupted"
                )
    progress.clear()
    if out.json_mode:
        out.json(
            {
                "ok": not corrupted,
                "workflows": len(ids),
                "checkpoints": checked,
                "corrupted": corrupted,
            }
        )
    else:
        if corrupted:
            out.table(
                ["WORKFLOW", "STEP", "PROBLEM"],
                [[printable(c["workflow_id"]), str(c["step"]), c["reason"]] for c in corrupted],
            )
        summary = (
            f"checked {checked} checkpoints in {len(ids)} workflows: {len(corrupted)} corrupted"
        )
        out.line(out.style(summary, "red" if corrupted else "green"))
    return EXIT_PROBLEMS if corrupted else 0


async def cmd_prune(args: argparse.Namespace, out: Output) -> int:
    """Delete all but the newest N checkpoints of one workflow or of every workflow."""
    results: list[dict[str, Any]] = []
    async with open_store(args.url, must_exist=True) as manager:
        if args.workflow is not None:
            ids = [check_workflow_id(args.workflow)]
            if not await manager.has_checkpoint(ids[0]):
                raise CheckpointNotFoundError(ids[0])
        else:
            ids = await manager.list_workflows()
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
    async with open_store(args.url, must_exist=True) as manager:
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


# --- the parser ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a step number: {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"a step is between 0 and 2**63 - 1, got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``aiocheckpoint`` command."""
    parser = _Parser(
        prog="aiocheckpoint",
        description="Inspect and maintain aiocheckpoint stores. A store is named by a URL: "
        "memory://, file:///abs/dir, file:rel/dir, sqlite:///abs/path.db, sqlite:rel/path.db "
        "or postgresql://user@host:port/db[?schema=NAME].",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    common = _Parser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = command("workflows", cmd_workflows, "list workflows: steps, latest step, last write")
    p.add_argument("url", metavar="URL")
    p.add_argument("--unfinished", action="store_true", help="only unfinished workflows")

    p = command("history", cmd_history, "a workflow's checkpoints, newest first, paged")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--limit", type=_positive, default=20, help="checkpoints per page (20)")
    p.add_argument("--before", type=_step, help="only steps below this one (the next page)")

    p = command("show", cmd_show, "one checkpoint (the latest by default)")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("step", metavar="STEP", type=_step, nargs="?")

    p = command("diff", cmd_diff, "what changed in the state between two steps")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("step_a", metavar="STEP_A", type=_step)
    p.add_argument("step_b", metavar="STEP_B", type=_step)

    p = command("verify", cmd_verify, "decode and check every checkpoint; exit 1 if corrupted")
    p.add_argument("url", metavar="URL")

    p = command("prune", cmd_prune, "keep only the newest N checkpoints of each workflow")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW", nargs="?")
    p.add_argument("--keep", type=_positive, required=True, metavar="N")
    p.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    p = command("rm", cmd_rm, "delete one checkpoint, or a whole workflow")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("step", metavar="STEP", type=_step, nargs="?")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask before deleting")

    p = command("copy", cmd_copy, "copy every checkpoint into another store (resumable)")
    p.add_argument("src", metavar="SRC_URL")
    p.add_argument("dst", metavar="DST_URL")
    p.add_argument("--overwrite", action="store_true", help="replace differing records")

    p = command("export", cmd_export, "write a store to a JSON-lines file ('-': stdout)")
    p.add_argument("url", metavar="URL")
    p.add_argument("file", metavar="FILE.jsonl")

    p = command("import", cmd_import, "load a JSON-lines export into a store ('-': stdin)")
    p.add_argument("file", metavar="FILE.jsonl")
    p.add_argument("url", metavar="URL")
    p.add_argument("--overwrite", action="store_true", help="replace differing records")
    return parser


# --- running -------------------------------------------------------------------------------


def _status_of(exc: CheckpointError) -> int:
    if isinstance(exc, InvalidArgumentError):
        return EXIT_USAGE
    if isinstance(exc, CheckpointNotFoundError):
        return EXIT_NOT_FOUND
    return EXIT_STORE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    out = Output(json_mode=args.json)
    func: Command = args.func
    # Checkpoints may hold ints of any size; printing them must not hit Python's digit limit.
    get_digits = getattr(sys, "get_int_max_str_digits", None)
    set_digits = getattr(sys, "set_int_max_str_digits", None)
    digits = get_digits() if get_digits is not None else None
    try:
        if set_digits is not None:
            set_digits(0)
        return asyncio.run(func(args, out))
    except CommandError as exc:
        return _fail(parser, str(exc), exc.status, exc)
    except CheckpointError as exc:
        return _fail(parser, str(exc), _status_of(exc), exc)
    except ImportError as exc:
        return _fail(parser, f"a backend is not installed: {exc}", EXIT_STORE, exc)
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{parser.prog}: interrupted\n")
        return 130
    finally:
        if set_digits is not None:
            set_digits(digits)


def _fail(parser: argparse.ArgumentParser, message: str, status: int, exc: Exception) -> int:
    if os.environ.get("AIOCHECKPOINT_DEBUG"):
        raise exc
    first = message.splitlines()[0] if message else type(exc).__name__
    sys.stderr.write(f"{parser.prog}: error: {first}\n")
    return status
