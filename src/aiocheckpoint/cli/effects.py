"""The effects of a step, as ``history`` and ``show`` print them, and ``effect resolve``.

See docs/effects.md: ``effect resolve`` settles an effect in doubt without code.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from .._validation import check_workflow_id
from ..codec import EffectRecord, EffectState
from ..errors import CheckpointCorruptedError, EncryptionError
from ..manager import CheckpointManager
from .keys import command_keys
from .output import Output, printable, when
from .redact import redact_url
from .store import CommandError, locked, open_store, problem

__all__ = [
    "Doubts",
    "cmd_effect",
    "doubts_json",
    "effect_counts",
    "effects_json",
    "in_doubt_of",
    "json_value",
    "print_doubts",
    "print_effects",
    "step_effects",
]

#: A workflow's effects in doubt, or the reason its journal does not verify.
Doubts = list[EffectRecord] | str

#: How each state is printed (an intent without an outcome is "in doubt").
_LABELS = {EffectState.DONE: "done", EffectState.FAILED: "failed", EffectState.IN_DOUBT: "in doubt"}


async def step_effects(
    manager: CheckpointManager, workflow_id: str, step: int
) -> list[EffectRecord] | str:
    """The step's effect journal; the reason as text if it does not verify."""
    if not manager.supports_effects():
        return []
    try:
        return await manager.get_effects(workflow_id, step)
    except CheckpointCorruptedError as exc:
        return exc.reason
    except EncryptionError as exc:  # a key the keys given lack: not damage
        return locked(exc, b"", effect=True)


async def in_doubt_of(manager: CheckpointManager, workflow_id: str) -> Doubts:
    """The workflow's effects in doubt, every step's; the reason as text if they do not verify."""
    try:
        return await manager.list_in_doubt_effects(workflow_id)
    except CheckpointCorruptedError as exc:
        return f"corrupted: {exc.reason}"
    except EncryptionError as exc:  # a key the keys given lack: not damage
        return locked(exc, b"", effect=True)


def doubts_json(doubts: Doubts) -> list[dict[str, Any]] | dict[str, str]:
    """The effects in doubt as JSON: each with its ``step``, what ``effect resolve`` takes."""
    if isinstance(doubts, str):  # the reason: "unreadable: ..." (a key) or "corrupted: ..."
        return {problem(doubts): doubts}
    entries = effects_json(doubts)
    assert isinstance(entries, list)
    return [{"step": e.step, **entry} for e, entry in zip(doubts, entries, strict=True)]


def print_doubts(out: Output, url: str, doubts: list[tuple[str, str, Doubts]]) -> None:
    """One row per effect in doubt (workflow, step, key, function...), then how to settle."""
    rows = []
    for workflow_id, status, found in doubts:
        if isinstance(found, str):
            rows.append([workflow_id, "-", "-", found, "-", "-", status])
            continue
        for e in found:
            rows.append(
                [workflow_id, str(e.step), e.key, e.name, str(e.attempt), when(e.intent_at), status]
            )
    headers = ["WORKFLOW", "STEP", "KEY", "FUNCTION", "ATTEMPT", "INTENT", "WORKFLOW STATUS"]
    out.table(headers, rows, fit=3, statuses=(6,))
    out.note(
        f"settle one: aiocheckpoint effect resolve {redact_url(url)} WORKFLOW STEP KEY "
        "--result JSON (it happened, with this result) or --rerun (it did not)"
    )


def effect_counts(effects: list[EffectRecord] | str) -> str:
    """``2 done, 1 in doubt`` (``-`` for none, ``corrupted`` or ``unreadable`` if unread)."""
    if isinstance(effects, str):
        return problem(effects)
    counts = Counter(_LABELS[e.state] for e in effects)
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) or "-"


def effects_json(effects: list[EffectRecord] | str) -> list[dict[str, Any]] | dict[str, str]:
    """The journal as JSON: one object per effect (result included), or the corruption."""
    if isinstance(effects, str):
        return {problem(effects): effects}
    return [
        {
            "key": e.key,
            "state": e.state.value,
            "attempt": e.attempt,
            "function": e.name,
            "intent_at": e.intent_at.isoformat(),
            "finished_at": None if e.finished_at is None else e.finished_at.isoformat(),
            "idempotency_key": e.idempotency_key,
            "result": e.result,
            "error": e.error,
        }
        for e in effects
    ]


def json_value(text: str) -> Any:
    """``--result``'s JSON text, parsed (argparse reports a bad one as a usage error)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--result is not JSON: {exc}") from None


async def cmd_effect(args: argparse.Namespace, out: Output) -> int:
    """``effect resolve``: record an in-doubt effect's result, or that it must run again."""
    workflow_id = check_workflow_id(args.workflow)
    happened = not args.rerun
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        if not manager.supports_effects():
            raise CommandError(f"{type(manager.storage).__name__} keeps no effect journal")
        record = await manager.resolve_effect(
            workflow_id, args.step, args.key, happened=happened, result=args.result
        )
    if out.json_mode:
        entries: Any = effects_json([record])
        out.json({"workflow_id": workflow_id, "step": args.step, **entries[0]})
        return 0
    what = "done (its result recorded)" if happened else "failed (the next run calls it again)"
    out.line(
        f"effect {printable(record.key)} of step {args.step} of workflow "
        f"{printable(workflow_id)}: {what}"
    )
    return 0


def print_effects(out: Output, effects: list[EffectRecord] | str) -> None:
    """A table of the step's effects under an ``effects:`` heading (nothing when none)."""
    if isinstance(effects, str):
        out.line(f"{out.style('effects:', 'bold')} {problem(effects)} ({printable(effects)})")
        return
    if not effects:
        return
    out.line(out.style("effects:", "bold"))
    rows = [
        [
            e.key,
            _LABELS[e.state],
            str(e.attempt),
            e.name,
            when(e.intent_at),
            e.error["type"] if e.error else "-",
        ]
        for e in effects
    ]
    out.table(["KEY", "STATE", "ATTEMPT", "FUNCTION", "INTENT", "ERROR"], rows, fit=3)
