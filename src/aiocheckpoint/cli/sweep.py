"""``aiocheckpoint sweep``: apply a retention policy to a store once (``docs/retention.md``)."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgumentError
from ..retention import RetentionPolicy, SweepReport
from .keys import KEYS_VARIABLE, command_keys
from .output import Output, printable
from .store import EXIT_UNREADABLE, open_store

__all__ = ["cmd_sweep", "duration"]

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: The RetentionPolicy fields the options set (each is unset unless given).
_RULES = (
    "keep_last",
    "keep_every",
    "keep_interval",
    "finished_ttl",
    "failed_ttl",
    "idle_ttl",
)


def duration(text: str) -> timedelta:
    """A duration such as ``90s``, ``15m``, ``12h``, ``30d`` or ``2w``."""
    found = _DURATION.match(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"not a duration (like 30d, 12h, 15m, 90s): {text!r}")
    return timedelta(**{_UNITS[found.group(2)]: int(found.group(1))})


def _policy(args: argparse.Namespace) -> RetentionPolicy:
    rules: dict[str, Any] = {
        name: getattr(args, name) for name in _RULES if getattr(args, name) is not None
    }
    if not rules:
        raise InvalidArgumentError(
            "sweep needs a rule: --keep-last, --finished-ttl, --failed-ttl or --idle-ttl"
        )
    return RetentionPolicy(
        **rules,
        keep_terminal=not args.drop_terminal,
        keep_paused=not args.thin_paused,
    )


async def cmd_sweep(args: argparse.Namespace, out: Output) -> int:
    """Delete what the policy given by the options does not keep (or count it).

    Exit status 5 when it kept checkpoints it could not read for want of a key: a sweep
    that kept everything because it read nothing must not look like one that succeeded.
    """
    policy = _policy(args)
    keys = command_keys(args)
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=keys
    ) as manager:
        report = await manager.sweep(
            policy=policy, dry_run=args.dry_run, collect_garbage=not args.no_gc
        )
    if out.json_mode:
        out.json(report.as_dict())
    else:
        out.line(_summary(report))
    if not report.skipped_no_key:
        return 0
    out.note(_no_key(report, given=keys is not None))
    return EXIT_UNREADABLE


def _no_key(report: SweepReport, *, given: bool) -> str:
    """What the sweep could not read, and how to read it."""
    named = ", ".join(printable(k) for k in report.missing_keys) or "unnamed"
    where = "not in the keyring" if given else f"no keys given: --keys FILE or ${KEYS_VARIABLE}"
    return (
        f"kept {report.skipped_no_key} checkpoints it could not read, without judging them: "
        f"unreadable: sealed under key {named} ({where})"
    )


def _summary(report: SweepReport) -> str:
    verb = "would delete" if report.dry_run else "deleted"
    gone = ", ".join(f"{n} {why}" for why, n in sorted(report.workflows_deleted.items()))
    if report.workflow_bytes:
        gone += f"; {report.workflow_bytes} bytes"
    text = (
        f"{verb} {sum(report.workflows_deleted.values())} workflows ({gone or 'none'}) and "
        f"{report.checkpoints_deleted} checkpoints ({report.checkpoint_bytes} bytes) "
        f"in {report.workflows_thinned} workflows"
    )
    if report.effects_deleted:
        text += f"; dropped {report.effects_deleted} effect records"
    if report.blobs_freed:
        text += f"; freed {report.blobs_freed} blobs"
    if report.blobs_held:
        text += "; deleted no blob: a record cannot be read (verify lists it)"
    if report.skipped_leased:
        text += f"; kept {report.skipped_leased} leased workflows"
    if report.skipped_changed:
        text += f"; kept {report.skipped_changed} workflows changed during the sweep"
    if report.skipped_corrupted:
        text += f"; kept {report.skipped_corrupted} corrupted checkpoints"
    return text
