"""The effects of a step, as ``history`` and ``show`` print them (docs/effects.md)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..codec.effects import EffectRecord, EffectState
from ..errors import CheckpointCorruptedError
from ..manager import CheckpointManager
from .output import Output, printable, when

__all__ = ["effect_counts", "effects_json", "print_effects", "step_effects"]

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


def effect_counts(effects: list[EffectRecord] | str) -> str:
    """``2 done, 1 in doubt`` (``-`` for none, ``corrupted`` for a bad journal)."""
    if isinstance(effects, str):
        return "corrupted"
    counts = Counter(_LABELS[e.state] for e in effects)
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) or "-"


def effects_json(effects: list[EffectRecord] | str) -> list[dict[str, Any]] | dict[str, str]:
    """The journal as JSON: one object per effect (result included), or the corruption."""
    if isinstance(effects, str):
        return {"corrupted": effects}
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


def print_effects(out: Output, effects: list[EffectRecord] | str) -> None:
    """A table of the step's effects under an ``effects:`` heading (nothing when none)."""
    if isinstance(effects, str):
        out.line(f"{out.style('effects:', 'bold')} corrupted ({printable(effects)})")
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
