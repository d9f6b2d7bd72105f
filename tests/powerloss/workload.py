"""What the writers write and what must survive: workflows, states, digests, the ledger.

Shared by the writer processes (which make the states) and the parent (which keeps the
ledger of what each writer announced and acknowledged, and works out what a cut may not
take away).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Steps of run ``r`` of a store are ``r * STRIDE + i``: runs never overwrite each other.
STRIDE = 1_000_000
#: A large state: this many regions of REGION_BYTES random bytes (hex), CHANGED of them
#: rewritten per step, so the incremental encoder shares the rest with the previous step.
REGIONS = 24
REGION_BYTES = 1000
CHANGED = 2


@dataclass(frozen=True)
class Workflow:
    """One workflow of a writer: its task, its kind of state and its retention."""

    name: str
    task: int
    big: bool
    keep: int | None  # max_checkpoints, or None: every checkpoint is kept


#: The kinds of workflow, dealt round-robin to the writer tasks: (big state, retention).
_KINDS = ((True, 3), (False, 4), (False, None), (False, None), (False, None))


def workflows(tasks: int, retention: bool = True) -> list[Workflow]:
    """The workflows of a writer with ``tasks`` concurrent tasks.

    One task cycles through one workflow of each kind; with more, each task owns one
    workflow and the kinds go round (a fifth of them large, with retention). Without
    ``retention`` (systems that have none) every checkpoint is kept.
    """
    if tasks == 1:
        chosen = [(0, big, keep) for big, keep in _KINDS[:3]]
    else:
        chosen = [(i, *_KINDS[i % len(_KINDS)]) for i in range(tasks)]
    out = []
    for i, (task, big, keep) in enumerate(chosen):
        kept = keep if retention else None
        name = f"t{task:02d}-{i:02d}-{'big' if big else 'small'}-{kept or 'all'}"
        out.append(Workflow(name, task, big, kept))
    return out


def digest(data: Any) -> str:
    """A stable digest of a state's data."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class States:
    """The successive states of one workflow in one run (deterministic per seed and run)."""

    def __init__(self, seed: int, run: int, workflow: Workflow) -> None:
        self.rng = random.Random(f"{seed}/{run}/{workflow.name}")
        self.big = workflow.big
        self.regions = [self.rng.randbytes(REGION_BYTES).hex() for _ in range(REGIONS)]

    def next(self, step: int) -> dict[str, Any]:
        """The state saved at ``step``."""
        rng = self.rng
        if self.big:
            for index in rng.sample(range(REGIONS), CHANGED):
                self.regions[index] = rng.randbytes(REGION_BYTES).hex()
            return {"step": step, "regions": list(self.regions)}
        return {
            "step": step,
            "text": "ü" * rng.randrange(1, 400) + rng.randbytes(rng.randrange(1, 300)).hex(),
            "nums": [rng.random() for _ in range(rng.randrange(12))],
            "nested": {"run": step // STRIDE, "flag": rng.random() < 0.5},
        }


@dataclass
class Ledger:
    """What the writers of one store announced (intents) and acknowledged, run by run.

    A writer announces ``(workflow, step, digest)`` before it saves and acknowledges the step
    after ``create_checkpoint`` returned. After a cut, a visible record must be one that
    was announced, whole; an acknowledged one must be there unless retention allowed its
    removal.
    """

    keep: dict[str, int | None]
    intents: dict[str, dict[int, str]] = field(default_factory=dict)
    acks: dict[str, set[int]] = field(default_factory=dict)
    runs: int = 0

    def feed(self, lines: Iterable[bytes]) -> int:
        """Record the writer's lines; return how many acknowledgements they held."""
        acked = 0
        for line in lines:
            kind, *rest = line.decode().split("\t")
            if kind == "I":
                wf, step, dig = rest
                self.intents.setdefault(wf, {})[int(step)] = dig
            elif kind == "A":
                wf, step = rest
                assert int(step) in self.intents[wf], f"ack without intent: {line!r}"
                self.acks.setdefault(wf, set()).add(int(step))
                acked += 1
        return acked

    def required(self, since: int) -> dict[str, dict[int, str]]:
        """Acknowledged steps that must be present: those from ``since`` on, and all of a
        retention workflow that are among its ``keep`` newest announced steps.

        Retention keeps the newest ``keep`` steps present, and only announced steps can be
        present, so an acknowledged step among the newest ``keep`` announced ones is never
        pruned, whatever landed unacknowledged before the cuts.
        """
        out: dict[str, dict[int, str]] = {}
        for wf, acked in self.acks.items():
            keep = self.keep[wf]
            if keep is None:
                chosen = {s for s in acked if s >= since}
            else:
                newest = sorted(self.intents[wf])[-keep:]
                chosen = acked.intersection(newest)
            if chosen:
                out[wf] = {s: self.intents[wf][s] for s in chosen}
        return out

    def last_acks(self) -> dict[str, int]:
        """The highest acknowledged step of each workflow: latest may not be behind it."""
        return {wf: max(steps) for wf, steps in self.acks.items() if steps}

    def request(self, since: int) -> dict[str, Any]:
        """What the verifier checks after a cut (JSON-ready): see ``verify`` in child.py."""
        return {
            "since": since,
            "intents": {
                wf: {str(s): d for s, d in steps.items() if s >= since}
                for wf, steps in self.intents.items()
            },
            "required": {
                wf: {str(s): d for s, d in steps.items()}
                for wf, steps in self.required(since).items()
            },
            "last_acks": self.last_acks(),
        }
