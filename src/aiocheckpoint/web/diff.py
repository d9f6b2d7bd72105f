"""A step's diff: what changed in the state from another step (the previous one by default).

Both states are read in their stored view; typed values (``{"$dt": ...}``, registered models)
are compared whole and shown by their type. The changes are walked lazily and a page shows
at most :data:`CHANGES` of them, each value cut to a one-line preview
(:func:`~aiocheckpoint.web.tree.describe`), so the page stays bounded whatever the states
hold; "More changes" continues from the next one.

Two tree records (an incremental store's; encrypted ones with the inspector's keys) are
diffed by walking both trees at once (:meth:`~aiocheckpoint.CheckpointManager.diff_records`,
which ``aiocheckpoint diff`` calls too): subtrees and chunks both hold are skipped unread,
so an edit deep in a large state reads the nodes on the way to it and the chunks that
differ, and the walk stops after the page's changes. Other records (version 1, a state
kept inline, sealed trees without their keys) are read whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Final

from .._validation import check_workflow_id
from ..errors import CheckpointError
from ..format.statediff import Change, iter_changes
from ..manager import CheckpointManager
from . import tree
from .data import EXPAND, problem_of

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
    page = await _tree_page(manager, workflow_id, step, against, offset)
    if page is None:
        page = await _whole_page(manager, view)
    if view.problem is not None:
        return view
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


async def _whole_page(manager: CheckpointManager, view: DiffView) -> list[Change]:
    """The page's changes (and one more) from both states read whole."""
    workflow_id, step, against, offset = view.workflow_id, view.step, view.against, view.offset
    new, problem = await _state(manager, workflow_id, step)
    old: object = {}
    if problem is None and against is not None:
        old, problem = await _state(manager, workflow_id, against)
        problem = None if problem is None else f"step {against}: {problem}"
    elif problem is not None:
        problem = f"step {step}: {problem}"
    if problem is not None:
        view.problem = problem
        return []
    changes = iter_changes(old, new, atomic=tree.is_typed)
    return list(islice(changes, offset, offset + CHANGES + 1))


async def _tree_page(
    manager: CheckpointManager, workflow_id: str, step: int, against: int | None, offset: int
) -> list[Change] | None:
    """The page's changes (and one more) from a walk of both trees; None: read them whole.

    Any error is left to the whole read to name, step by step.
    """
    try:
        new = await manager.storage.load(workflow_id, step)
        old = None if against is None else await manager.storage.load(workflow_id, against)
        if new is None or (against is not None and old is None):
            return None
        changes = await manager.diff_records(
            workflow_id,
            old,
            new,
            atomic=tree.is_typed,
            expand=EXPAND,
            count=tree.PREVIEW,  # entries enough to fill a preview
            offset=offset,
        )
        if changes is None:
            return None
        return await _page(changes)
    except CheckpointError:
        return None


async def _page(changes: AsyncIterator[Change]) -> list[Change]:
    page: list[Change] = []
    try:
        async for change in changes:
            page.append(change)
            if len(page) > CHANGES:
                break
    finally:
        await changes.aclose()  # type: ignore[attr-defined]
    return page


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
