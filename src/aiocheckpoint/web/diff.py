"""A step's diff: what changed in the state from another step (the previous one by default).

Both states are read in their stored view; typed values (``{"$dt": ...}``, registered models)
are compared whole and shown by their type. The changes are walked lazily and a page shows
at most :data:`CHANGES` of them, each value cut to a one-line preview
(:func:`~aiocheckpoint.web.tree.describe`), so the page stays bounded whatever the states
hold; "More changes" continues from the next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import Final

from .._validation import check_workflow_id
from ..errors import CheckpointError
from ..format.statediff import iter_changes
from ..manager import CheckpointManager
from . import tree
from .data import problem_of

__all__ = ["CHANGES", "DiffRow", "DiffView", "load_diff"]

#: Changes per page.
CHANGES: Final = 200


@dataclass(frozen=True)
class DiffRow:
    """One change: ``added``, ``removed`` or ``changed``, at ``path``, its values described."""

    op: str
    path: str
    old: tree.Node | None
    new: tree.Node | None


@dataclass
class DiffView:
    """Everything the diff page shows."""

    workflow_id: str
    step: int
    #: the step compared with (None: the step is the workflow's first, compared with nothing)
    against: int | None
    rows: list[DiffRow] = field(default_factory=list)
    offset: int = 0
    next_offset: int | None = None
    #: why a state could not be read (locked, corrupted, missing)
    problem: str | None = None


async def load_diff(
    manager: CheckpointManager, workflow_id: str, step: int, against: int | None, offset: int
) -> DiffView:
    """One page of the changes from step ``against`` (default: the previous step) to ``step``."""
    workflow_id = check_workflow_id(workflow_id)
    if against is None:
        before = await manager.storage.scan(workflow_id, before=step, limit=1, descending=True)
        against = before[0].step if before else None
    view = DiffView(workflow_id, step, against, offset=offset)
    new, problem = await _state(manager, workflow_id, step)
    old: object = {}
    if problem is None and against is not None:
        old, problem = await _state(manager, workflow_id, against)
        problem = None if problem is None else f"step {against}: {problem}"
    elif problem is not None:
        problem = f"step {step}: {problem}"
    if problem is not None:
        view.problem = problem
        return view
    changes = iter_changes(old, new, atomic=tree.is_typed)
    page = list(islice(changes, offset, offset + CHANGES + 1))
    view.rows = [
        DiffRow(
            c.op,
            c.path or "(the whole state)",
            None if c.op == "added" else tree.describe(c.old),
            None if c.op == "removed" else tree.describe(c.new),
        )
        for c in page[:CHANGES]
    ]
    view.next_offset = offset + CHANGES if len(page) > CHANGES else None
    return view


async def _state(
    manager: CheckpointManager, workflow_id: str, step: int
) -> tuple[object, str | None]:
    """The step's state in its stored view, or why it cannot be read."""
    try:
        stored = await manager.storage.load(workflow_id, step)
        if stored is None:
            return None, "no checkpoint at this step"
        checkpoint = await manager.decode_record(workflow_id, stored, view="stored")
    except CheckpointError as exc:
        return None, problem_of(exc)
    return checkpoint.state_snapshot.data, None
