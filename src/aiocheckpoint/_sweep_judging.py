"""What a sweep keeps of each workflow's history, record by record, and what it deleted.

Used by :mod:`aiocheckpoint.retention` only. A :class:`Keeper` applies a policy's history
rules to one workflow's records, newest first; a history a batched sweep read whole is
judged in one call on its ``(step, bytes)`` rows (:func:`judge_rows`), which makes no
object per record that outlives it, and its cut is kept as a plain tuple (:data:`CutRow`)
until the page's write: each object a page keeps alive across the garbage collector's
young collections moves into its oldest generation, and enough of those set off a full
collection (it walks the whole heap, holding up the loop and every thread), while a tuple
of ints, strings and bytes leaves the collector's tracking at its first collection. A
:class:`Tally` counts what a page's write deleted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import starmap
from typing import Final, Protocol, overload

from .codec import is_sealed_record, plain_record_fields, record_fields, sealed_key_id
from .errors import CheckpointCorruptedError
from .models import AgentStatus
from .storage.base import Cut, History

__all__ = [
    "PARSE_ON_LOOP",
    "CutRow",
    "CutRows",
    "Judged",
    "Keeper",
    "NoKey",
    "Tally",
    "cut_row",
    "fields_or_none",
    "judge_rows",
    "on_loop",
]


class RetentionPolicy(Protocol):
    """The history rules of :class:`aiocheckpoint.RetentionPolicy` a :class:`Keeper` applies."""

    @property
    def keep_last(self) -> int | None: ...
    @property
    def keep_every(self) -> int | None: ...
    @property
    def keep_interval(self) -> timedelta | None: ...
    @property
    def keep_terminal(self) -> bool: ...


class SweepReport(Protocol):
    """What judging counts in :class:`aiocheckpoint.retention.SweepReport`."""

    skipped_corrupted: int

    def _no_key(self, key_id: str | None) -> None: ...


#: A version-1 record longer than this has its fields parsed in a worker thread.
PARSE_ON_LOOP: Final = 64 * 1024
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=timezone.utc)
_COMPLETED: Final = AgentStatus.COMPLETED
_FAILED: Final = AgentStatus.FAILED


@dataclass(frozen=True, slots=True)
class NoKey:
    """A record this process cannot read for lack of its key (its bytes may be sound)."""

    key_id: str | None


#: What a sweep makes of a record: its step, status and time, None if unreadable, or
#: :class:`NoKey`.
Judged = tuple[int, AgentStatus, datetime] | NoKey | None
#: A :class:`~.storage.base.Cut`'s fields, as a sweep keeps them until its write.
CutRow = tuple[str, tuple[int, ...], int | None]


class CutRows(Sequence[Cut]):
    """A page's cuts for ``thin_many``: each :class:`Cut` made from its row when used.

    So no Cut lives through the write, which spans the next page's read (and the garbage
    collector's young collections that read sets off).
    """

    __slots__ = ("_rows",)

    def __init__(self, rows: list[CutRow]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Cut]:
        return starmap(Cut, self._rows)

    @overload
    def __getitem__(self, index: int) -> Cut: ...

    @overload
    def __getitem__(self, index: slice) -> CutRows: ...

    def __getitem__(self, index: int | slice) -> Cut | CutRows:
        if isinstance(index, slice):
            return CutRows(self._rows[index])
        return Cut(*self._rows[index])


def fields_or_none(data: bytes) -> Judged:
    """A record's fields read without keys (a sealed record is one this process cannot read)."""
    fields = plain_record_fields(data)  # most records: read in one step
    if fields is not None:
        return fields
    if is_sealed_record(data):
        return NoKey(sealed_key_id(data))
    try:
        return record_fields(data)
    except CheckpointCorruptedError:
        return None


class Keeper:
    """Decides, newest first, which checkpoints of one workflow the policy keeps."""

    __slots__ = ("completed_seen", "last_bucket", "oldest", "policy", "seen")

    def __init__(self, policy: RetentionPolicy) -> None:
        self.policy = policy
        self.seen = 0
        self.completed_seen = False
        self.last_bucket: int | None = None
        #: The lowest step kept so far (records are judged newest first).
        self.oldest: int | None = None

    def keeps(self, step: int, status: AgentStatus, moment: datetime) -> bool:
        """Whether the policy keeps the record of these fields (its own step, not its row's)."""
        self.seen += 1
        newest_completed = status is _COMPLETED and not self.completed_seen
        if status is _COMPLETED:
            self.completed_seen = True
        policy = self.policy
        if policy.keep_last is None or self.seen <= policy.keep_last:
            return True
        if policy.keep_terminal and (newest_completed or status is _FAILED):
            return True
        if policy.keep_every is not None and step % policy.keep_every == 0:
            return True
        return self.first_of_interval(moment)

    def first_of_interval(self, moment: datetime) -> bool:
        if self.policy.keep_interval is None:
            return False
        span = self.policy.keep_interval / timedelta(microseconds=1)
        bucket = math.floor(((moment - _EPOCH) / timedelta(microseconds=1)) / span)
        if bucket == self.last_bucket:
            return False
        self.last_bucket = bucket
        return True

    def judges(self, fields: Judged, report: SweepReport) -> bool:
        """Whether the policy keeps a record; one it cannot read is kept, and counted."""
        if type(fields) is tuple:  # the common case first
            return self.keeps(*fields)
        if fields is None:
            report.skipped_corrupted += 1
            return True
        if isinstance(fields, NoKey):
            report._no_key(fields.key_id)
            return True
        return self.keeps(*fields)


def judge_rows(
    policy: RetentionPolicy, report: SweepReport, history: History, tally: Tally
) -> CutRow | None:
    """What the policy deletes of a history read whole (None: nothing), in one call.

    Its records' fields are read here, on the loop: a caller sends only histories of at
    most :data:`PARSE_ON_LOOP` bytes in all. The unreadable are kept and counted in
    ``report``; the cut steps' sizes go into ``tally``.
    """
    judged = ((step, len(data), fields_or_none(data)) for step, data in history.records or ())
    return cut_row(policy, report, history, tally, judged)


def cut_row(
    policy: RetentionPolicy,
    report: SweepReport,
    history: History,
    tally: Tally,
    judged: Iterable[tuple[int, int, Judged]],
) -> CutRow | None:
    """The cut of ``history`` from its records' ``(step, size, fields)``, newest first.

    None when it deletes nothing and drops no orphaned effects; the cut steps' sizes go
    into ``tally``, the unreadable records are kept and counted in ``report``.
    """
    keeper = Keeper(policy)
    oldest: int | None = None
    steps: list[int] = []
    sizes: list[int] = []
    for step, size, fields in judged:
        if keeper.judges(fields, report):
            oldest = step
        else:
            steps.append(step)
            sizes.append(size)
    if steps:
        tally.add(history.workflow_id, steps, sizes)
    elif not history.orphans:
        return None
    return history.workflow_id, tuple(steps), oldest


def on_loop(history: History) -> bool:
    """Whether a history read whole is judged in one call (:func:`judge_rows`)."""
    records = history.records
    return records is not None and sum(len(data) for _step, data in records) <= PARSE_ON_LOOP


@dataclass(slots=True)
class Tally:
    """What a page's cuts would delete: steps, their bytes, workflows; each step's size.

    The store deletes what it still finds of the cuts (another sweep may have taken some
    first): :meth:`counted` gives the figures of what it says it deleted.
    """

    steps: int = 0
    bytes: int = 0
    workflows: int = 0
    sizes: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, workflow_id: str, steps: Sequence[int], sizes: Sequence[int]) -> None:
        """Count one workflow's cut steps (newly: a workflow is added once)."""
        self.steps += len(steps)
        self.bytes += sum(sizes)
        self.workflows += 1
        self.sizes[workflow_id] = dict(zip(steps, sizes, strict=True))

    def counted(self, deleted: Sequence[tuple[str, int]]) -> tuple[int, int, int]:
        """``(checkpoints, bytes, workflows)`` of ``deleted``, pairs of the cuts added."""
        if len(deleted) == self.steps:  # a subset of as many pairs: all of them
            return self.steps, self.bytes, self.workflows
        sizes = self.sizes
        total = sum(sizes[workflow_id][step] for workflow_id, step in deleted)
        return len(deleted), total, len({workflow_id for workflow_id, _step in deleted})
