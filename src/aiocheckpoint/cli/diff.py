"""``diff``: what changed in the state between two steps, path by path (``plan.items[2].title``)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .inspect import load_checkpoint
from .keys import command_keys
from .output import Output, compact, printable
from .store import open_store

__all__ = ["Change", "cmd_diff", "diff_states", "format_path"]

_PLAIN_KEY_BANNED = frozenset(".[]\"'")


@dataclass(frozen=True)
class Change:
    """One difference: ``op`` is ``added``, ``removed`` or ``changed``."""

    op: str
    keys: tuple[str | int, ...]
    old: Any = None
    new: Any = None

    @property
    def path(self) -> str:
        """The dot path of the value, as :class:`~aiocheckpoint.SharedState` spells it."""
        return format_path(self.keys)


def format_path(keys: tuple[str | int, ...]) -> str:
    """Dot path for dict keys, ``[i]`` for list indexes, ``["k.k"]`` for awkward keys."""
    out = ""
    for key in keys:
        if isinstance(key, int):
            out += f"[{key}]"
        elif key and key.isprintable() and not key.isspace() and not _PLAIN_KEY_BANNED & set(key):
            out += f".{key}" if out else key
        else:
            out += f"[{json.dumps(key, ensure_ascii=False)}]"
    return out


def diff_states(old: Any, new: Any) -> list[Change]:
    """Every added, removed and changed value between two JSON-like trees, in tree order."""
    return list(_walk(old, new, ()))


def _walk(old: Any, new: Any, keys: tuple[str | int, ...]) -> Iterator[Change]:
    if type(old) is dict and type(new) is dict:
        for key, value in old.items():
            if key not in new:
                yield Change("removed", (*keys, key), old=value)
            else:
                yield from _walk(value, new[key], (*keys, key))
        for key, value in new.items():
            if key not in old:
                yield Change("added", (*keys, key), new=value)
    elif type(old) is list and type(new) is list:
        for i in range(max(len(old), len(new))):
            if i >= len(new):
                yield Change("removed", (*keys, i), old=old[i])
            elif i >= len(old):
                yield Change("added", (*keys, i), new=new[i])
            else:
                yield from _walk(old[i], new[i], (*keys, i))
    elif not _same(old, new):
        yield Change("changed", keys, old=old, new=new)


def _same(a: Any, b: Any) -> bool:
    # Stricter than ==: True is not 1, 1 is not 1.0; NaN equals NaN (it did not change).
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


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
