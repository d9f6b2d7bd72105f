"""``diff``: what changed in the state between two steps, path by path (``plan.items[2].title``)."""

from __future__ import annotations

import argparse

from ..format.statediff import Change, diff_states, format_path
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
        old, _ = await load_checkpoint(manager, args.workflow, args.step_a)
        new, _ = await load_checkpoint(manager, args.workflow, args.step_b)
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
