"""``diff``: what changed in the state between two steps, path by path (``plan.items[2].title``).

Two tree records (an incremental store's; encrypted ones with ``--keys``) are diffed by
walking both trees (:meth:`~aiocheckpoint.CheckpointManager.diff_records`, the web
inspector's diff too): what both hold is skipped unread, so a one-key edit in a 50 MB state
reads the nodes on the way to it. Other records, and any error on the way, are read whole
as before, which names what is wrong; the changes printed are the same either way.
"""

from __future__ import annotations

import argparse

from .._validation import check_workflow_id
from ..errors import CheckpointError
from ..format.statediff import Change, diff_states, format_path
from ..manager import CheckpointManager
from .inspect import load_checkpoint
from .keys import command_keys
from .output import Output, compact, printable
from .store import open_store

__all__ = ["Change", "cmd_diff", "diff_states", "format_path"]


async def cmd_diff(args: argparse.Namespace, out: Output) -> int:
    """What changed in the state between two steps, path by path."""
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        changes = await _walked(manager, args.workflow, args.step_a, args.step_b)
        if changes is None:
            old, _ = await load_checkpoint(manager, args.workflow, args.step_a)
            new, _ = await load_checkpoint(manager, args.workflow, args.step_b)
            changes = diff_states(old.state_snapshot.data, new.state_snapshot.data)
    return _print(out, check_workflow_id(args.workflow), args.step_a, args.step_b, changes)


async def _walked(
    manager: CheckpointManager, workflow_id: str, step_a: int, step_b: int
) -> list[Change] | None:
    """The changes from a walk of both trees; None: read both states whole instead."""
    workflow_id = check_workflow_id(workflow_id)
    try:
        old = await manager.storage.load(workflow_id, step_a)
        new = await manager.storage.load(workflow_id, step_b)
        if old is None or new is None:
            return None
        changes = await manager.diff_records(workflow_id, old, new)
        return None if changes is None else [change async for change in changes]
    except CheckpointError:
        return None  # the whole read names it, as it always did


def _print(out: Output, workflow_id: str, step_a: int, step_b: int, changes: list[Change]) -> int:
    """The changes as lines (or JSON), the exit code 0."""
    if out.json_mode:
        out.json(
            {
                "workflow_id": workflow_id,
                "from_step": step_a,
                "to_step": step_b,
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
        out.line(f"no changes in the state between step {step_a} and step {step_b}")
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
    out.note(f"{len(changes)} change{plural} from step {step_a} to step {step_b}")
    return 0
