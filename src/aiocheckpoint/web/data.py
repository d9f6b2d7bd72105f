"""What the inspector's pages show, read from a store through the manager's public calls.

Every read is bounded: a page of workflows, of steps or of workflows in doubt at a time, and
counts that stop at :data:`COUNT_CAP` (one page of records per status). A record the codec
cannot open is reported, never raised: a missing key
(:class:`~aiocheckpoint.EncryptionError`, :class:`~aiocheckpoint.UnknownKeyError` among them)
marks it locked; any :class:`~aiocheckpoint.CheckpointCorruptedError` (a
:class:`~aiocheckpoint.DecryptionError` too: it failed authentication under a key the
inspector holds) corrupted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from .._validation import check_workflow_id
from ..codec import EffectRecord
from ..errors import (
    CheckpointCorruptedError,
    CheckpointError,
    EncryptionError,
    InvalidArgumentError,
    UnknownKeyError,
)
from ..leases import WorkflowRecord, WorkflowStatus
from ..manager import CheckpointManager
from ..models import Checkpoint
from ..storage.base import InDoubtPagingStorage, StoredCheckpoint
from ..storage.queries import encode_cursor
from ..urls import redacted
from . import tree

__all__ = [
    "COUNT_CAP",
    "EXPAND",
    "PAGE",
    "StepRow",
    "WorkflowRow",
    "WorkflowView",
    "count_statuses",
    "in_doubt_ids",
    "list_workflows",
    "load_step",
    "resolve_command",
    "workflow_view",
]

#: Rows per page of the workflow list and of a workflow's steps.
PAGE: Final = 50
#: Counts per status stop here (shown as "1000+"): a count reads one page of records.
COUNT_CAP: Final = 1000
#: Bytes a step page reads at most to open the values stored apart inside the value shown
#: (past it they are links to their own page).
EXPAND: Final = 4 << 20
#: What a record the keys cannot open is called on the pages.
LOCKED: Final = "locked: encrypted, and the inspector has no key for it (serve --keys FILE)"


@dataclass(frozen=True)
class WorkflowRow:
    """One row of the workflow list."""

    workflow_id: str
    status: str | None = None
    latest_step: int | None = None
    latest_agent_id: str | None = None
    latest_agent_status: str | None = None
    updated_at: datetime | None = None
    #: who writes it: "workflow" (runners), "langgraph" (a LangGraph thread)...
    kind: str | None = None


@dataclass(frozen=True)
class StepRow:
    """One checkpoint of a workflow: its agent, status and time, or why it cannot be read."""

    step: int
    agent_id: str | None = None
    status: str | None = None
    timestamp: datetime | None = None
    size: int | None = None
    problem: str | None = None


@dataclass
class WorkflowView:
    """Everything the workflow page shows."""

    workflow_id: str
    record: WorkflowRecord | None
    steps: list[StepRow]
    next_before: int | None
    effects: list[EffectRecord]
    effects_problem: str | None = None
    commands: dict[tuple[int, str], str] = field(default_factory=dict)
    #: whether the store keeps workflow records (the file store keeps none)
    records_kept: bool = True


def problem_of(exc: CheckpointError) -> str:
    """How a record that cannot be opened is shown: locked, or corrupted and why."""
    if isinstance(exc, UnknownKeyError):
        return f"locked: key {exc.key_id!r} is not in the inspector's keys (serve --keys FILE)"
    if isinstance(exc, EncryptionError):
        return LOCKED
    if isinstance(exc, CheckpointCorruptedError):
        return f"corrupted: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


async def list_workflows(
    manager: CheckpointManager, *, status: str | None, prefix: str, after: str | None
) -> tuple[list[WorkflowRow], str | None]:
    """One page of workflows (ids above ``after`` starting with ``prefix``) and the next.

    Every kind is listed: LangGraph threads' records too, not only runners' workflows.
    """
    if manager.supports_workflow_records():
        return await _record_page(manager, status, prefix, after)
    if status:
        raise InvalidArgumentError(
            f"{type(manager.storage).__name__} keeps no workflow records: no status filter"
        )
    return await _listed_page(manager, prefix, after)


async def _record_page(
    manager: CheckpointManager, status: str | None, prefix: str, after: str | None
) -> tuple[list[WorkflowRow], str | None]:
    """A page of workflow records; a prefix starts the walk at the prefix itself."""
    rows: list[WorkflowRecord] = []
    start = after
    if start is None and prefix:
        first = await manager.get_workflow(check_workflow_id(prefix))
        if first is not None and (not status or first.status.value == status):
            rows.append(first)
        start = prefix
    cursor = None if start is None else encode_cursor(start)
    page = await manager.list_workflow_records(
        status or None, limit=PAGE + 1, cursor=cursor, kind=None
    )
    rows += [r for r in page if r.workflow_id.startswith(prefix)]
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    return [_row(r) for r in rows], rows[-1].workflow_id if more else None


def _row(record: WorkflowRecord) -> WorkflowRow:
    return WorkflowRow(
        record.workflow_id,
        record.status.value,
        record.latest_step,
        record.latest_agent_id,
        record.latest_agent_status,
        record.updated_at,
        record.kind,
    )


async def _listed_page(
    manager: CheckpointManager, prefix: str, after: str | None
) -> tuple[list[WorkflowRow], str | None]:
    """A page of a store without records (the file store): its listed ids, sorted."""
    ids = sorted(
        i
        for i in await manager.list_workflows()
        if isinstance(i, str) and i.startswith(prefix) and (after is None or i > after)
    )
    rows = []
    for workflow_id in ids[:PAGE]:
        latest = await manager.storage.scan(workflow_id, limit=1, descending=True)
        rows.append(WorkflowRow(workflow_id, latest_step=latest[0].step if latest else None))
    return rows, ids[PAGE - 1] if len(ids) > PAGE else None


async def count_statuses(manager: CheckpointManager) -> dict[str, str]:
    """How many workflows each status has, of every kind (``COUNT_CAP``+ past the cap)."""
    if not manager.supports_workflow_records():
        return {}
    counts = {}
    for status in WorkflowStatus:
        page = await manager.list_workflow_records(status, limit=COUNT_CAP, kind=None)
        more = len(page) >= COUNT_CAP and page.next_cursor is not None
        counts[status.value] = f"{COUNT_CAP}+" if more else str(len(page))
    return counts


async def in_doubt_ids(
    manager: CheckpointManager, after: str | None = None
) -> tuple[list[str], str | None]:
    """A page of workflows with an effect in doubt after ``after``; the next page's ``after``.

    The next page's is None after the last. A store that pages them (SQLite,
    PostgreSQL) reads only the page; the others list them all (none without a journal).
    """
    if not manager.supports_effects():
        return [], None
    storage = manager.storage
    if isinstance(storage, InDoubtPagingStorage):
        ids = await storage.in_doubt_page(after, PAGE + 1)
    else:
        ids = [i for i in await manager.list_in_doubt_workflows() if after is None or i > after]
    return ids[:PAGE], ids[PAGE - 1] if len(ids) > PAGE else None


async def workflow_view(
    manager: CheckpointManager, url: str, workflow_id: str, before: int | None
) -> WorkflowView:
    """A workflow's record, one page of its steps (newest first) and its effects."""
    workflow_id = check_workflow_id(workflow_id)
    record = None
    if manager.supports_workflow_records():
        record = await manager.get_workflow(workflow_id)
    records = await manager.storage.scan(
        workflow_id, before=before, limit=PAGE + 1, descending=True
    )
    more = len(records) > PAGE
    steps = [await _step_row(manager, workflow_id, r) for r in records[:PAGE]]
    view = WorkflowView(workflow_id, record, steps, steps[-1].step if more else None, [])
    view.records_kept = manager.supports_workflow_records()
    if manager.supports_effects():
        await _effects(manager, url, view)
    return view


async def _step_row(
    manager: CheckpointManager, workflow_id: str, stored: StoredCheckpoint
) -> StepRow:
    try:
        checkpoint = await manager.decode_record(workflow_id, stored, view="stored")
    except CheckpointError as exc:
        return StepRow(stored.step, size=len(stored.data), problem=problem_of(exc))
    return StepRow(
        stored.step,
        checkpoint.agent_id,
        checkpoint.status.value,
        checkpoint.timestamp,
        len(stored.data),
    )


async def _effects(manager: CheckpointManager, url: str, view: WorkflowView) -> None:
    """The workflow's effects in doubt, then the other effects of the steps on the page."""
    try:
        doubtful = await manager.list_in_doubt_effects(view.workflow_id)
        others = []
        for step in sorted({row.step for row in view.steps} | {e.step for e in doubtful}):
            others += await manager.get_effects(view.workflow_id, step)
    except CheckpointError as exc:
        view.effects_problem = problem_of(exc)
        return
    view.effects = doubtful + [e for e in others if not e.in_doubt]
    view.commands = {(e.step, e.key): resolve_command(url, e) for e in doubtful}


def resolve_command(url: str, effect: EffectRecord) -> str:
    """The ``aiocheckpoint effect resolve`` command that settles ``effect`` (URL redacted)."""
    words = ["aiocheckpoint", "effect", "resolve", redacted(url), effect.workflow_id]
    return shlex.join([*words, str(effect.step), effect.key]) + " (--result JSON | --rerun)"


async def load_step(
    manager: CheckpointManager,
    workflow_id: str,
    step: int,
    path: list[str | int] | None = None,
    offset: int = 0,
) -> tuple[Checkpoint | None, str | None, list[EffectRecord] | str, Any]:
    """A step's checkpoint (or why not), its effects (or why not), and a value of its state.

    The checkpoint is in its stored view; the value is the one at ``path``. A large state
    of an incremental store is looked into, not read whole
    (:meth:`~aiocheckpoint.CheckpointManager.peek_record`, encrypted ones with the
    inspector's keys): the nodes on the way to ``path`` and the chunks of one page of its
    entries (a :class:`~aiocheckpoint.codec.Cut` when the value
    is a large container). The checkpoint returned then has an empty state. Other records
    are decoded whole.
    """
    workflow_id = check_workflow_id(workflow_id)
    path = path or []
    checkpoint: Checkpoint | None = None
    problem: str | None = None
    value: Any = None
    peeked = None
    try:
        stored = await manager.storage.load(workflow_id, step)
        if stored is None:
            problem = "no checkpoint at this step"
        else:
            peeked = await _peek(manager, workflow_id, stored, path, offset)
            if peeked is not None:
                checkpoint, value = peeked
            else:
                checkpoint = await manager.decode_record(workflow_id, stored, view="stored")
    except InvalidArgumentError:
        raise  # a path the state does not hold: the request's fault
    except CheckpointError as exc:
        problem = problem_of(exc)
    if checkpoint is not None and peeked is None:
        value = tree.subtree(checkpoint.state_snapshot.data, path)
    effects: list[EffectRecord] | str = []
    if manager.supports_effects():
        try:
            effects = await manager.get_effects(workflow_id, step)
        except CheckpointError as exc:
            effects = problem_of(exc)
    return checkpoint, problem, effects, value


async def _peek(
    manager: CheckpointManager,
    workflow_id: str,
    stored: StoredCheckpoint,
    path: list[str | int],
    offset: int,
) -> tuple[Checkpoint, Any] | None:
    """The look into a tree record (None: decode it whole); encrypted, with the keys."""
    return await manager.peek_record(
        workflow_id, stored, path, offset, tree.CHILDREN, expand=EXPAND
    )
