"""A workflow's timeline (the spans its page draws) and the store's throughput.

The timeline is built from what the workflow page already read (one page of steps, the
effects of those steps, the record), so drawing it costs no extra read. Each step is a span
from the checkpoint before it (or the record's creation, for the first) to its own, in the
lane of its agent; effects are spans from intent to outcome (an instant while in doubt); a
paused or failed workflow ends in a span of its own. A source of more spans (an event
history) adds them to the list :func:`workflow_spans` returns.

The throughput reads the latest :data:`SAMPLE` workflow records updated in the window, newest
first (on SQLite and PostgreSQL a range of the index of the minute of the records'
``updated_at``, newest minute first: the read costs the sample's minutes, not the store),
and at most :data:`SAMPLE` ids of workflows in doubt
(the effect journal's partial index); it counts the records per bucket of time by their
last update. A store keeps no index of checkpoints by time (one would cost every save), so
each workflow counts once, at its latest checkpoint or status change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Final
from urllib.parse import urlencode

from ..codec import EffectRecord, locked_view
from ..leases import WorkflowRecord, WorkflowStatus
from ..manager import CheckpointManager
from ..storage.base import InDoubtPagingStorage, WorkflowStorage
from ..storage.queries import WorkflowQuery
from .charts import Chart, Span, stacked_bars
from .data import StepRow, WorkflowView

__all__ = ["BUCKETS", "SAMPLE", "Throughput", "throughput", "workflow_spans"]

#: Workflow records the throughput page reads at most, per query.
SAMPLE: Final = 2000
#: Columns of the throughput chart.
BUCKETS: Final = 60
#: The longest window (a week).
MAX_MINUTES: Final = 7 * 24 * 60
#: The series of the throughput chart, stacked in this order.
SERIES: Final = ("updated", "failed", "in doubt")


def workflow_spans(view: WorkflowView) -> list[Span]:
    """The spans of the page's steps and effects, and of the workflow's end."""
    steps = sorted((s for s in view.steps if s.timestamp is not None), key=lambda s: s.step)
    spans: list[Span] = []
    record = view.record
    previous = record.created_at if record is not None and view.next_before is None else None
    for row in steps:
        assert row.timestamp is not None
        start = previous if previous is not None and previous <= row.timestamp else row.timestamp
        spans.append(_step_span(view.workflow_id, row, start, row.timestamp))
        previous = row.timestamp
    spans += [_effect_span(e) for e in view.effects]
    if record is not None and previous is not None:
        spans += _ending(record, previous)
    return spans


def _step_span(workflow_id: str, row: StepRow, start: datetime, end: datetime) -> Span:
    assert row.timestamp is not None
    took = (end - start).total_seconds()
    title = f"step {row.step}: {row.agent_id} {row.status}, {took:.3f}s, ended {end.isoformat()}"
    href = "/step?" + urlencode({"id": workflow_id, "step": row.step})
    return Span(f"agent {row.agent_id}", start, end, f"agent-{row.status}", title, href)


def _effect_span(effect: EffectRecord) -> Span:
    end = effect.finished_at or effect.intent_at
    state = effect.state.value
    title = f"effect {effect.key} (step {effect.step}, attempt {effect.attempt}): {state}"
    href = "/step?" + urlencode({"id": effect.workflow_id, "step": effect.step})
    return Span("effects", effect.intent_at, end, f"state-{state}", title, href)


def _ending(record: WorkflowRecord, last: datetime) -> list[Span]:
    """A paused, failed or cancelled workflow: a span from its last checkpoint to now-ish."""
    if record.status not in (
        WorkflowStatus.PAUSED,
        WorkflowStatus.FAILED,
        WorkflowStatus.CANCELLED,
    ):
        return []
    end = max(record.updated_at, last)
    error = locked_view(record.last_error or {})  # a sealed message: its key id
    why = f": {error.get('type', '')} {error.get('message', '')}" if error else ""
    title = f"{record.status.value} since {end.isoformat()}{why}"
    return [Span("workflow", last, end, f"status-{record.status.value}", title)]


@dataclass
class Throughput:
    """What the throughput page shows."""

    minutes: int
    start: datetime
    bucket: timedelta
    chart: Chart
    totals: dict[str, int] = field(default_factory=dict)
    #: whether a read reached :data:`SAMPLE` (the counts are a lower bound)
    capped: bool = False
    #: when the SAMPLE updates read go back to: the buckets before it are not counted
    counted_from: datetime | None = None
    #: the store keeps no workflow records (the file store): nothing to count
    unsupported: bool = False


async def throughput(
    manager: CheckpointManager, minutes: int, now: datetime | None = None
) -> Throughput:
    """Workflows updated, failed and in doubt per bucket of the last ``minutes``."""
    minutes = min(max(minutes, 1), MAX_MINUTES)
    end = now or datetime.now(timezone.utc)
    bucket = timedelta(minutes=minutes) / BUCKETS
    start = end - timedelta(minutes=minutes)
    counts: list[dict[str, int]] = [{} for _ in range(BUCKETS)]
    view = Throughput(minutes, start, bucket, stacked_bars(start, bucket, counts, SERIES))
    storage = manager.storage
    if not manager.supports_workflow_records() or not isinstance(storage, WorkflowStorage):
        view.unsupported = True
        return view
    # The latest SAMPLE updates of the window: a range of the minute index, newest first.
    query = WorkflowQuery(updated_after=start, limit=SAMPLE, newest_first=True)
    recent = await storage.query_workflow_records(query)
    doubts, doubts_capped = await _in_doubt(manager)
    view.capped = len(recent) >= SAMPLE or doubts_capped
    if len(recent) >= SAMPLE:
        view.counted_from = recent[-1].updated_at
    for record in recent:
        if record.workflow_id in doubts:
            name = "in doubt"
        else:
            name = "failed" if record.status is WorkflowStatus.FAILED else "updated"
        n = max(min(int((record.updated_at - start) / bucket), BUCKETS - 1), 0)
        counts[n][name] = counts[n].get(name, 0) + 1
        view.totals[name] = view.totals.get(name, 0) + 1
    view.chart = stacked_bars(start, bucket, counts, SERIES)
    return view


async def _in_doubt(manager: CheckpointManager) -> tuple[set[str], bool]:
    """The workflows in doubt (the first SAMPLE by id) and whether there were more."""
    if not manager.supports_effects():
        return set(), False
    storage = manager.storage
    if isinstance(storage, InDoubtPagingStorage):
        ids = await storage.in_doubt_page(None, SAMPLE + 1)
    else:
        ids = await manager.list_in_doubt_workflows()
    return set(ids[:SAMPLE]), len(ids) > SAMPLE
