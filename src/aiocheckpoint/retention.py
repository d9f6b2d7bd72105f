"""Retention and TTL: which checkpoints and workflows a store keeps (``docs/retention.md``).

A :class:`RetentionPolicy` says what to keep of each workflow's history (the newest N, then
every K-th step or one per time interval, always the terminal checkpoints) and when whole
workflows go (a time after they finished or failed, or after they were last updated).
:func:`run_sweep` applies it to a store a page of workflows at a time: on a store with
batched sweeps (:class:`~aiocheckpoint.storage.base.SweepStorage`) one read and at most one
short write per page, pages sized by the time they take; on the others, a short write per
delete. Writers are never held up for long. It is the one place a sweep starts and ends;
its :class:`SweepReport` says what it deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._sweep_batches import BatchSizer, Turns
from ._sweep_judging import (
    PARSE_ON_LOOP,
    CutRow,
    CutRows,
    Judged,
    Keeper,
    NoKey,
    cut_row,
    fields_or_none,
    judge_rows,
    on_loop,
)
from ._sweep_judging import (
    Tally as Tally,  # re-exported: the conformance suite's races judge pages themselves
)
from ._telemetry import annotate, record_sweep_deletions
from .codec import is_sealed_record, record_fields, sealed_key_id
from .errors import (
    CheckpointCorruptedError,
    EncryptionError,
    InvalidArgumentError,
    StorageBackendError,
    UnsupportedOperationError,
)
from .leases import WORKFLOW_KIND, WorkflowRecord, WorkflowStatus
from .models import utcnow
from .storage.base import (
    BlobCheckpointStorage,
    CheckpointStorage,
    EffectStorage,
    History,
    SpaceReclaimingStorage,
    StoredCheckpoint,
    SweepStorage,
)
from .storage.base import WorkflowStorage as _WorkflowStorage
from .storage.queries import WorkflowQuery

__all__ = ["RetentionPolicy", "SweepReport", "policy_from", "run_sweep", "run_thinning"]

#: A stored record's plain bytes, from its workflow id and the record (unsealed).
Opener = Callable[[str, StoredCheckpoint], Awaitable[bytes]]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The loop time a sweep's judging takes in one loop iteration before it lets the rest run:
#: a save's few steps each wait at most this long behind it.
_TURN_SECONDS: Final = 0.00025
#: The most records, and bytes of records, one batched read of histories holds.
_MAX_RECORDS: Final = 20_000
_MAX_BYTES: Final = 64 * 1024 * 1024


class RetentionPolicy(BaseModel):
    """What a store keeps: each workflow's history, and whole workflows.

    History (applied by :meth:`~aiocheckpoint.CheckpointManager.sweep`):

    * ``keep_last``: the newest N checkpoints of every workflow are kept. Beyond them,
      ``keep_every=K`` keeps the steps that are multiples of K, and ``keep_interval`` keeps
      one checkpoint (the newest) per interval of checkpoint time. Everything else beyond
      the newest N is deleted. Without ``keep_last``, every checkpoint is kept.
    * ``keep_terminal`` (default True) always keeps the newest COMPLETED checkpoint and every
      FAILED one; ``keep_paused`` (default True) keeps PAUSED workflows whole.

    Workflows (on stores with workflow records): ``finished_ttl``, ``failed_ttl`` and
    ``idle_ttl`` delete a FINISHED, FAILED or UNFINISHED workflow (its record, checkpoints,
    effects, and the blobs it alone holds) when its record was last changed that long ago
    (for a finished or failed workflow: when it finished or failed, its ``finished_at``).
    A CANCELLED workflow is terminal too: ``failed_ttl`` applies to it, from its cancel.
    A leased workflow is never deleted.

    ``keep_last`` alone with ``keep_terminal=False`` is ``max_checkpoints``: it prunes at
    every write, in the save's transaction. Any other history rule is applied by sweeps,
    because a write that prunes the oldest step could otherwise delete a step it keeps.
    ``batch_size`` is how many records a sweep reads or deletes per round trip (on stores
    with batched sweeps, the first page's workflows: later pages are sized by time).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    keep_last: int | None = Field(default=None, ge=1, strict=True)
    keep_every: int | None = Field(default=None, ge=1, strict=True)
    keep_interval: timedelta | None = Field(default=None, strict=True)
    keep_terminal: bool = Field(default=True, strict=True)
    keep_paused: bool = Field(default=True, strict=True)
    finished_ttl: timedelta | None = Field(default=None, strict=True)
    failed_ttl: timedelta | None = Field(default=None, strict=True)
    idle_ttl: timedelta | None = Field(default=None, strict=True)
    batch_size: int = Field(default=100, ge=1, le=10_000, strict=True)

    def __init__(self, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            raise InvalidArgumentError(f"invalid RetentionPolicy: {exc}") from None

    @model_validator(mode="after")
    def _consistent(self) -> RetentionPolicy:
        for name in ("keep_interval", "finished_ttl", "failed_ttl", "idle_ttl"):
            span = getattr(self, name)
            if span is not None and span <= timedelta(0):
                raise ValueError(f"{name} must be a positive timedelta, got {span!r}")
        if self.keep_last is None and (self.keep_every or self.keep_interval):
            raise ValueError("keep_every and keep_interval thin what is beyond keep_last: set it")
        return self

    @classmethod
    def latest(cls, count: int) -> RetentionPolicy:
        """The policy ``max_checkpoints=count`` stands for: the newest ``count``, at write."""
        return cls(keep_last=count, keep_terminal=False)

    @property
    def write_keep_last(self) -> int | None:
        """The ``keep_last`` a save may apply itself (None: pruning is left to sweeps)."""
        plain = self.keep_every is None and self.keep_interval is None and not self.keep_terminal
        return self.keep_last if plain else None

    def ttls(self) -> list[tuple[WorkflowStatus, timedelta]]:
        """The workflow TTLs that are set, by the status they apply to."""
        pairs = [
            (WorkflowStatus.FINISHED, self.finished_ttl),
            (WorkflowStatus.FAILED, self.failed_ttl),
            (WorkflowStatus.CANCELLED, self.failed_ttl),
            (WorkflowStatus.UNFINISHED, self.idle_ttl),
        ]
        return [(status, ttl) for status, ttl in pairs if ttl is not None]


def policy_from(max_checkpoints: object, retention: object) -> RetentionPolicy | None:
    """The manager's policy from its ``max_checkpoints`` and ``retention`` arguments."""
    if max_checkpoints is not None and (type(max_checkpoints) is not int or max_checkpoints < 1):
        raise InvalidArgumentError(
            f"max_checkpoints must be an int >= 1 or None, got {max_checkpoints!r}"
        )
    if retention is not None and not isinstance(retention, RetentionPolicy):
        raise InvalidArgumentError(
            f"retention must be a RetentionPolicy, not {type(retention).__qualname__}"
        )
    if retention is not None and max_checkpoints is not None:
        raise InvalidArgumentError(
            "give max_checkpoints or retention, not both (max_checkpoints=N is "
            "RetentionPolicy(keep_last=N, keep_terminal=False))"
        )
    if max_checkpoints is not None:
        return RetentionPolicy.latest(max_checkpoints)
    return retention


@dataclass
class SweepReport:
    """What one sweep deleted (or, with ``dry_run``, would delete).

    ``workflows_deleted`` counts whole workflows by reason (``finished``, ``failed``, ``cancelled``,
    ``idle``) and ``workflow_bytes`` their checkpoint records' bytes (not counted by dry
    runs); ``checkpoints_deleted`` and ``checkpoint_bytes`` count the checkpoints the
    history rules thinned out, and their record bytes (blobs not included);
    ``effects_deleted`` the effect records of steps without a checkpoint below the oldest
    checkpoint thinning kept (not counted by dry runs; those of the thinned steps go with
    them, uncounted);
    ``blobs_freed`` is what the garbage collection that ends a sweep freed (0 on stores
    that free blobs with their records); ``blobs_held`` is True when that collection found
    a record whose blob references it could not read, which might name any blob, and so
    deleted none (the records are logged: repair or delete them); ``bytes_reclaimed`` what
    the store then gave back to the filesystem of the space the deletes freed (SQLite; 0
    elsewhere).
    ``skipped_leased`` counts workflows past their TTL
    left alone because they are leased, ``skipped_changed`` those whose record changed
    between the sweep's read and its delete; ``skipped_corrupted`` records kept because
    their fields could not be read (damaged, or over the store's size limit);
    ``skipped_no_key`` records kept because this process cannot read them, whose bytes may
    be sound: sealed under a key the keyring lacks, or encrypted and read without keys.
    ``missing_keys`` names the key ids of those records, sorted.
    """

    dry_run: bool
    started_at: datetime
    finished_at: datetime | None = None
    workflows_deleted: dict[str, int] = field(default_factory=dict)
    workflow_bytes: int = 0
    workflows_thinned: int = 0
    checkpoints_deleted: int = 0
    checkpoint_bytes: int = 0
    effects_deleted: int = 0
    blobs_freed: int = 0
    blobs_held: bool = False
    bytes_reclaimed: int = 0
    skipped_leased: int = 0
    skipped_changed: int = 0
    skipped_corrupted: int = 0
    skipped_no_key: int = 0
    missing_keys: list[str] = field(default_factory=list)

    @property
    def deleted(self) -> int:
        """Workflows plus checkpoints deleted: what a "sweep deletions" metric counts."""
        return sum(self.workflows_deleted.values()) + self.checkpoints_deleted

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (times as ISO text)."""
        data = asdict(self)
        for name in ("started_at", "finished_at"):
            moment = data[name]
            data[name] = None if moment is None else moment.isoformat()
        return data

    def _no_key(self, key_id: str | None) -> None:
        self.skipped_no_key += 1
        if key_id is not None and key_id not in self.missing_keys:
            self.missing_keys = sorted([*self.missing_keys, key_id])

    def _count(self, reason: str) -> None:
        self.workflows_deleted[reason] = self.workflows_deleted.get(reason, 0) + 1


_REASONS: Final = {
    WorkflowStatus.FINISHED: "finished",
    WorkflowStatus.FAILED: "failed",
    WorkflowStatus.CANCELLED: "cancelled",
    WorkflowStatus.UNFINISHED: "idle",
}


async def run_sweep(
    storage: CheckpointStorage,
    policy: RetentionPolicy,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    collect_garbage: bool = True,
    forget: Callable[[str], None] | None = None,
    opened: Opener | None = None,
) -> SweepReport:
    """Apply ``policy`` to ``storage`` once, in batches; return what was deleted.

    ``now`` (an aware datetime, default the current time) is what the TTLs count back
    from. ``forget(workflow_id)`` is called for each workflow deleted whole (the manager
    drops what it remembers of it). ``opened`` gives a stored record's plain bytes (an
    encrypted manager's unsealing, ``docs/encryption.md``). This is the one function every
    sweep runs through.
    """
    if not isinstance(policy, RetentionPolicy):
        raise InvalidArgumentError(f"policy must be a RetentionPolicy, not {policy!r}")
    if now is None:
        now = utcnow()
    elif not isinstance(now, datetime) or now.tzinfo is None:
        raise InvalidArgumentError(f"now must be an aware datetime, got {now!r}")
    report = SweepReport(dry_run=dry_run, started_at=utcnow())
    sweep = _Sweep(storage, policy, report, dry_run, forget or (lambda _id: None), opened)
    await sweep.expire(now)
    if policy.keep_last is not None:
        await sweep.thin_all()
    if collect_garbage and not dry_run and isinstance(storage, BlobCheckpointStorage):
        await _collect(storage, report)
    if not dry_run and report.deleted and isinstance(storage, SpaceReclaimingStorage):
        report.bytes_reclaimed = await _reclaimed(storage)
    return _ended(report, "sweep")


async def run_thinning(
    storage: CheckpointStorage,
    policy: RetentionPolicy,
    workflow_id: str,
    *,
    dry_run: bool = False,
    opened: Opener | None = None,
) -> SweepReport:
    """Apply ``policy``'s history rules to one workflow now (its TTLs do not apply)."""
    report = SweepReport(dry_run=dry_run, started_at=utcnow())
    sweep = _Sweep(storage, policy, report, dry_run, lambda _id: None, opened)
    thinnable = policy.keep_last is not None and not await sweep.paused(workflow_id)
    if thinnable and await sweep.thin(workflow_id):
        report.workflows_thinned = 1
    return _ended(report, f"thinning of {workflow_id!r}")


async def _collect(storage: BlobCheckpointStorage, report: SweepReport) -> None:
    """The sweep's garbage collection; one held back by unreadable records is reported."""
    try:
        report.blobs_freed = await storage.collect_garbage()
    except CheckpointCorruptedError as exc:
        report.blobs_held = True
        logger.warning("sweep: %s", exc)


async def _reclaimed(storage: SpaceReclaimingStorage) -> int:
    """What the store gave back; 0 if it could not (a full disk): the deletes stand."""
    try:
        return await storage.reclaim_space()
    except StorageBackendError as exc:
        logger.warning("sweep: giving the freed space back failed (it is reused): %s", exc)
        return 0


def _ended(report: SweepReport, what: str) -> SweepReport:
    """Where every sweep and thinning ends: the report is complete here."""
    report.finished_at = utcnow()
    logger.info("%s%s: %s", what, " (dry run)" if report.dry_run else "", report.as_dict())
    if report.skipped_no_key:
        logger.warning(
            "%s kept %d checkpoints it could not read: sealed under keys it lacks (%s)",
            what,
            report.skipped_no_key,
            ", ".join(map(repr, report.missing_keys)) or "unnamed",
        )
    _measured(report)
    return report


def _measured(report: SweepReport) -> None:
    """The report on the sweep's span and, unless a dry run, in the deletions metric."""
    annotate("aiocheckpoint.sweep.deleted", report.deleted)
    annotate("aiocheckpoint.sweep.dry_run", report.dry_run)
    if report.dry_run:
        return
    for reason, count in report.workflows_deleted.items():
        record_sweep_deletions("workflow", count, reason)
    record_sweep_deletions("checkpoint", report.checkpoints_deleted)
    record_sweep_deletions("blob", report.blobs_freed)


class _Sweep:
    """One sweep's state: the store, the policy, the report it fills."""

    def __init__(
        self,
        storage: CheckpointStorage,
        policy: RetentionPolicy,
        report: SweepReport,
        dry_run: bool,
        forget: Callable[[str], None],
        opened: Opener | None = None,
    ) -> None:
        self.storage = storage
        self.opened = opened
        self.policy = policy
        self.report = report
        self.dry_run = dry_run
        self.forget = forget
        rests = getattr(storage, "saving_lately", None)
        self.pacer = BatchSizer(policy.batch_size, rests)
        threads = getattr(storage, "writes_in_threads", False)
        #: Shares the loop's turns between the sweep's judging and everything else.
        self.turns = Turns(
            _TURN_SECONDS,
            rests if threads else None,
            getattr(storage, "saves_written", None) if threads else None,
        )

    def records(self) -> _WorkflowStorage:
        if not isinstance(self.storage, _WorkflowStorage):
            raise UnsupportedOperationError(
                f"{type(self.storage).__name__} keeps no workflow records: "
                "workflow TTLs need a backend that does (in-memory, SQLite or PostgreSQL)"
            )
        return self.storage

    # --- workflow TTLs -------------------------------------------------------------------

    async def expire(self, now: datetime) -> None:
        for status, ttl in self.policy.ttls():
            query = _expired(status, now - ttl, self.pacer.size)
            async for page in self.pages(query):
                await self.expire_page(page, _REASONS[status])

    async def pages(self, query: WorkflowQuery) -> AsyncIterator[list[WorkflowRecord]]:
        """Every record ``query`` matches, one page (one short read) at a time.

        A page holds as many records as the pacer's batch, which it sizes by time.
        """
        storage = self.records()
        while True:
            query = replace(query, limit=self.pacer.size)
            page = await storage.query_workflow_records(query)
            if page:
                yield page
            if query.limit is None or len(page) < query.limit:
                return
            query = replace(query, after=page[-1].workflow_id)

    async def expire_page(self, page: list[WorkflowRecord], reason: str) -> None:
        """Delete a page of expired workflows: in one write where the store batches."""
        if self.dry_run or not isinstance(self.storage, SweepStorage):
            for record in page:
                await self.expire_one(record, reason)
            return
        live = [record for record in page if not _leased(record)]
        self.report.skipped_leased += len(page) - len(live)
        if not live:
            return
        pairs = [(record.workflow_id, record.updated_at) for record in live]
        sizes = await self.pacer.timed(self.storage.delete_workflows(pairs))
        for record, size in zip(live, sizes, strict=True):
            self.deleted_whole(record.workflow_id, size, reason)

    def deleted_whole(self, workflow_id: str, size: int | None, reason: str) -> None:
        """Count one conditional delete's outcome (None: the record changed, or is gone)."""
        if size is None:
            self.report.skipped_changed += 1
            return
        self.forget(workflow_id)
        self.report._count(reason)
        self.report.workflow_bytes += size

    async def expire_one(self, record: WorkflowRecord, reason: str) -> None:
        if _leased(record):
            self.report.skipped_leased += 1
            return
        if self.dry_run:
            self.report._count(reason)
            return
        # Deleted only if nothing touched the record since this page read it: a write, a
        # lease, a status or metadata change moves ``updated_at``.
        size = await self.records().delete_workflow(
            record.workflow_id, updated_at=record.updated_at
        )
        self.deleted_whole(record.workflow_id, size, reason)

    # --- history -----------------------------------------------------------------------

    async def thin_all(self) -> None:
        if isinstance(self.storage, SweepStorage) and self.policy.keep_last is not None:
            await self.thin_pages(self.storage)
            return
        if not isinstance(self.storage, _WorkflowStorage):
            # A store without records lists its workflows in one call (the protocol's only way).
            for workflow_id in await self.storage.list_workflows():
                await self.thin_counted(workflow_id)
            return
        # Records of another kind (LangGraph threads and their pages) keep their own
        # rules: thinning a thread's pages would lose pages its checkpoints reference.
        query = WorkflowQuery(limit=self.policy.batch_size, kind=WORKFLOW_KIND)
        async for page in self.pages(query):
            for record in page:
                if record.status is not WorkflowStatus.PAUSED or not self.policy.keep_paused:
                    await self.thin_counted(record.workflow_id)

    async def thin_counted(self, workflow_id: str) -> None:
        if await self.thin(workflow_id):
            self.report.workflows_thinned += 1

    async def paused(self, workflow_id: str) -> bool:
        """Whether the policy keeps this workflow whole because it is paused."""
        if not self.policy.keep_paused or not isinstance(self.storage, _WorkflowStorage):
            return False
        record = await self.storage.get_workflow(workflow_id)
        return record is not None and record.status is WorkflowStatus.PAUSED

    async def thin_pages(self, storage: SweepStorage) -> None:
        """Thin every page of workflows, one read and at most one write per page.

        The next page is read (and its records judged) while this one's write runs: pages
        hold disjoint workflows, so each workflow is still read before it is written.
        """
        reading = asyncio.ensure_future(self.read_page(storage, None))
        try:
            while page := await reading:
                reading = asyncio.ensure_future(self.read_page(storage, page[0]))
                await self.thin_page(storage, page[1], page[2])
        finally:
            if not reading.done():
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)

    async def read_page(self, storage: SweepStorage, after: str | None) -> _Page | None:
        """The next page after ``after``: its last workflow, judged histories, their tally.

        A history read whole is judged here, on the loop, and only its cut is kept: its
        records go as soon as it is judged, which keeps a page's objects from piling up in
        the garbage collector's oldest generation (each full collection walks the whole
        heap, holding up the loop and every thread). A short one is judged in one call
        (:func:`._sweep_judging.judge_rows`), one turn of the loop; a long one a record
        per turn. Those read a page at a time, or whose records an encrypted manager must
        open, are judged at the write.
        """
        assert self.policy.keep_last is not None  # thin_all checked
        histories = await storage.histories(
            after=after,
            limit=self.pacer.size,
            more_than=self.policy.keep_last,
            max_records=_MAX_RECORDS,
            max_bytes=_MAX_BYTES,
        )
        if not histories:
            return None
        histories = self.within_read(histories)
        last = histories[-1].workflow_id
        tally = Tally()
        judged: list[CutRow | History] = []
        histories.reverse()  # popped as judged: each history and its records go at once
        while histories:
            history = histories.pop()
            await self.turns.turn()
            if not self.thinnable(history):
                continue
            if history.records is None or self.opened is not None:
                item: CutRow | History | None = history
            elif on_loop(history):
                item = judge_rows(self.policy, self.report, history, tally)
            else:
                item = await self.cut(history, tally, await self.read_facts(history))
            if item is not None:
                judged.append(item)
        return last, judged, tally

    def within_read(self, histories: list[History]) -> list[History]:
        """The page up to the first history to read that the read's budget left unread.

        That one starts the next page, sized to this one (the first of a page is thinned
        by itself): a page grown over histories with nothing to read stops there.
        """
        keep_last = self.policy.keep_last or 0  # set: thin_all checked
        for n, history in enumerate(histories):
            unread = history.records is None and history.count > keep_last
            if n and unread and self.thinnable(history):
                self.pacer.size = n
                return histories[:n]
        return histories

    async def read_facts(self, history: History) -> list[Judged]:
        """A read history's records' fields (None where unreadable), on the loop.

        A short loop turn at a time: a thread parsing them would hold the GIL the writers'
        saves need at each of their steps, up to the switch interval (5 ms) each.
        """
        judged: list[Judged] = []
        for _step, data in history.records or ():
            await self.turns.turn()
            if len(data) > PARSE_ON_LOOP:
                judged.append(await anyio.to_thread.run_sync(fields_or_none, data))
            else:
                judged.append(fields_or_none(data))
        return judged

    async def thin_page(
        self, storage: SweepStorage, judged: list[CutRow | History], tally: Tally
    ) -> None:
        """Thin one page read by :meth:`read_page`: at most one write.

        A workflow with nothing to delete costs no write; one whose history is longer than
        one read's share, or holds a record the store refuses to read, is thinned by itself.
        """
        keep_last = self.policy.keep_last
        assert keep_last is not None  # thin_all checked
        cuts: list[CutRow] = []
        for item in judged:
            if isinstance(item, History):
                if item.records is None and item.count > keep_last:
                    await self.thin_counted(item.workflow_id)
                    continue
                await self.turns.turn()
                cut = await self.cut(item, tally)
                if cut is not None:
                    cuts.append(cut)
            else:
                cuts.append(item)
        if not await self.apply(storage, cuts, tally):
            self.pacer.grow()

    def thinnable(self, history: History) -> bool:
        """Whether thinning applies to this history.

        Not to a paused workflow the policy keeps whole, nor to a record of another kind
        (a LangGraph thread, whose pages its checkpoints reference), nor, on a store with
        records, to checkpoints without one.
        """
        if history.paused and self.policy.keep_paused:
            return False
        return history.kind == WORKFLOW_KIND or not isinstance(self.storage, _WorkflowStorage)

    async def cut(
        self, history: History, tally: Tally, facts: list[Judged] | None = None
    ) -> CutRow | None:
        """What the policy deletes of one history (None: nothing); its steps into ``tally``.

        ``facts`` are its records' fields, if read already (None where unreadable).
        """
        records = history.records
        if records is None:  # no more than the newest keep_last: all kept
            return (history.workflow_id, (), history.oldest) if history.orphans else None
        if facts is None:
            facts = [await self.judged(history.workflow_id, *record) for record in records]
        judged = ((step, len(data), f) for (step, data), f in zip(records, facts, strict=True))
        return cut_row(self.policy, self.report, history, tally, judged)

    async def apply(self, storage: SweepStorage, cuts: list[CutRow], tally: Tally) -> bool:
        """Delete the cuts in one write (a dry run counts them); whether anything was written.

        Fills in the report. ``tally`` holds the cuts' steps (:meth:`cut`).
        """
        report = self.report
        if self.dry_run:
            counted = tally.steps, tally.bytes, tally.workflows
        elif cuts:
            deleted, dropped = await self.pacer.timed(storage.thin_many(CutRows(cuts)))
            report.effects_deleted += dropped
            counted = tally.counted(deleted)
        else:
            return False
        report.checkpoints_deleted += counted[0]
        report.checkpoint_bytes += counted[1]
        report.workflows_thinned += counted[2]
        return not self.dry_run

    async def thin(self, workflow_id: str) -> int:
        """Delete what the policy does not keep of one workflow; return how many.

        Newest first, a page at a time. A record the storage refuses to read (over its
        size limit, say) is kept: the page then ends above it and the next starts below.
        Then the effect records of steps below the oldest kept checkpoint that have no
        checkpoint go too (the steps that may still be running are above it).
        """
        keeper = Keeper(self.policy)
        before: int | None = None
        low: int | None = None
        deleted = 0
        while True:
            try:
                page = await self.storage.scan(
                    workflow_id,
                    after=low,
                    before=before,
                    limit=self.policy.batch_size,
                    descending=True,
                )
            except CheckpointCorruptedError as bad:
                low = _refused_step(bad, low, before)
                continue
            for record in page:
                if await self.kept(keeper, workflow_id, record):
                    keeper.oldest = record.step
                else:
                    deleted += await self.drop(workflow_id, record)
            if len(page) == self.policy.batch_size:
                before = page[-1].step
            elif low is not None:
                self.report.skipped_corrupted += 1
                keeper.oldest = low
                before, low = low, None
            else:
                await self.drop_orphan_effects(workflow_id, keeper.oldest)
                return deleted

    async def drop_orphan_effects(self, workflow_id: str, oldest_kept: int | None) -> None:
        if self.dry_run or oldest_kept is None or not isinstance(self.storage, EffectStorage):
            return
        self.report.effects_deleted += await self.storage.drop_orphan_effects(
            workflow_id, oldest_kept
        )

    async def kept(self, keeper: Keeper, workflow_id: str, record: StoredCheckpoint) -> bool:
        fields = await self.judged(workflow_id, record.step, record.data)
        return keeper.judges(fields, self.report)

    async def judged(self, workflow_id: str, step: int, data: bytes) -> Judged:
        """A record's fields (unsealed first, if encrypted).

        None if unreadable, a :class:`~._sweep_judging.NoKey` if this process lacks the key
        to read it.
        """
        try:
            if self.opened is not None:
                plain = await self.opened(workflow_id, StoredCheckpoint(step, data))
            elif is_sealed_record(data):
                raise EncryptionError("an encrypted record read without keys")
            else:
                plain = data
            if len(plain) > PARSE_ON_LOOP:
                return await anyio.to_thread.run_sync(record_fields, plain)
            return record_fields(plain)
        except EncryptionError:  # not damage: a process with the key may read it
            return NoKey(sealed_key_id(data))
        except CheckpointCorruptedError:
            return None

    async def drop(self, workflow_id: str, record: StoredCheckpoint) -> int:
        if not self.dry_run and not await self.storage.delete(workflow_id, record.step):
            return 0
        self.report.checkpoints_deleted += 1
        self.report.checkpoint_bytes += len(record.data)
        return 1


#: A page read: its last workflow, each history's cut or the history itself where it is
#: judged at the write, and the tally of the cuts' steps.
_Page = tuple[str, list[CutRow | History], Tally]


def _refused_step(bad: CheckpointCorruptedError, low: int | None, before: int | None) -> int:
    """The step of a record the storage refused inside ``(low, before)``; else re-raise."""
    step = bad.step
    if step is None or (before is not None and step >= before) or (low is not None and step <= low):
        raise bad
    return step


def _expired(status: WorkflowStatus, cutoff: datetime, limit: int) -> WorkflowQuery:
    """The query of ``status``'s workflows past a TTL that ends at ``cutoff``.

    A finished or failed workflow counts from when it ended (``finished_at``; a record
    without one from its last change), so touching its metadata or lease later does not
    keep it; an unfinished one counts from its last change.
    """
    if status is WorkflowStatus.UNFINISHED:
        return WorkflowQuery(status=status, updated_before=cutoff, limit=limit, kind=WORKFLOW_KIND)
    return WorkflowQuery(status=status, finished_before=cutoff, limit=limit, kind=WORKFLOW_KIND)


def _leased(record: WorkflowRecord) -> bool:
    # The wall clock, not the sweep's ``now``: the storage judges leases by its own clock.
    expires = record.lease_expires_at
    return record.lease_owner is not None and expires is not None and expires > utcnow()
