"""The PostgreSQL store's group commit: concurrent saves share statements and commits.

Each ``save`` (or ``save_tree``) queues its row and waits; up to ``write_concurrency``
writer tasks take the queued rows and write each batch with one ``INSERT ... SELECT FROM
unnest(...)`` (plus one retention ``DELETE`` in the same transaction when ``keep_last`` is
used). A caller returns only after the transaction holding its row has committed. A fenced
row's token is checked in the same statement (:mod:`.leases`); a batch of trees adds its
blobs' references first and releases those of the records it replaced or pruned last, in
the same transaction (:mod:`.blobs`). Effect records (``put_effect``, a :class:`Write`
with a ``key``) join the batches of plain rows: a batch's effect records and checkpoints
commit in one transaction. See docs/postgres-storage.md, "Batching".
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ..._telemetry import record_commit
from ...errors import CheckpointError, LeaseLostError, StorageTimeoutError
from ...format import SplitResult
from ..queries import StepInfo
from ..refcounts import held_root_refs
from ..turns import SaveClock
from .blobs import BlobLockBusy, Blobs
from .connection import (
    Connection,
    Raced,
    conflict,
    driver_errors,
    failure,
    import_asyncpg,
    is_transient,
    timeout_cause,
)
from .sql import Sql
from .stats import WriteStats

logger = logging.getLogger(__name__)

__all__ = ["GroupCommit", "Write"]

#: Attempts of a batch that lost a deadlock or serialization conflict to another writer (e.g.
#: two processes writing the same workflow, one waiting for the blob lock the other holds).
_CONFLICT_ATTEMPTS = 30


@dataclass(eq=False)
class Write:
    """One queued save: its row, its retention and fence, and the future its caller awaits."""

    workflow_id: str
    step: int
    data: bytes
    keep_last: int | None
    token: int | None
    future: asyncio.Future[None] = field(repr=False)
    split: SplitResult | None = field(default=None, repr=False)
    step_info: StepInfo | None = None
    #: An effect record's key (``data`` is the record); None for a checkpoint.
    key: str | None = None
    in_doubt: bool = False

    @property
    def name(self) -> tuple[str, int] | tuple[str, int, str]:
        """What the row replaces: a checkpoint's step, or an effect's step and key."""
        if self.key is None:
            return (self.workflow_id, self.step)
        return (self.workflow_id, self.step, self.key)


@dataclass(frozen=True)
class BatchLimits:
    """How many writers run at once, and how large one batch may grow."""

    write_concurrency: int
    max_batch_rows: int
    max_batch_bytes: int


class GroupCommit:
    """The queue of a store's saves and the writer tasks that commit them in batches."""

    def __init__(
        self,
        connection: Connection,
        sql: Sql,
        blobs: Blobs,
        stats: WriteStats,
        limits: BatchLimits,
    ) -> None:
        self._connection = connection
        self._sql = sql
        self._blobs = blobs
        self._stats = stats
        self._limits = limits
        self._queue: deque[Write] = deque()
        self._writers: set[asyncio.Task[None]] = set()
        self._active_writers = 0
        self._in_flight: set[str] = set()
        self._trees_in_flight = False
        self._save_clock = SaveClock()

    def saving_lately(self) -> bool:
        """Whether a save was queued lately: a sweep then rests after each of its writes."""
        return self._save_clock.lately()

    async def write(self, item: Write) -> None:
        """Queue ``item`` and return once it is committed (or raise its own error)."""
        self._queue.append(item)
        self._save_clock.saved()
        if self._active_writers < self._limits.write_concurrency:
            self._active_writers += 1
            task = asyncio.create_task(self._writer())
            self._writers.add(task)
            task.add_done_callback(self._writers.discard)
        # Cancelling this await cancels the future: a writer drops it while it is queued.
        await item.future

    async def drain(self) -> None:
        """Wait until every queued and in-flight write has committed or failed."""
        while self._writers:
            await asyncio.gather(*self._writers, return_exceptions=True)

    async def _writer(self) -> None:
        try:
            while batch := self._take_batch():
                try:
                    await self._write_batch(batch)
                finally:
                    self._in_flight.difference_update(w.workflow_id for w in batch)
                    if batch[0].split is not None:
                        self._trees_in_flight = False
        finally:
            # Counted down in the same step that found the queue empty: a save queued just
            # after sees the writer gone and starts one (the task's done callbacks run later).
            self._active_writers -= 1

    def _take_batch(self) -> list[Write]:
        """Take queued rows for one transaction, oldest first.

        A workflow being written by another batch, or whose rows in this batch would repeat
        a step (an effect key) or mix ``keep_last`` values, is left queued (with its later
        rows, keeping their order): retention then stays exact, and one statement never
        touches a row twice.

        A batch holds either trees (``save_tree``) or plain rows, and one tree batch at most
        is in flight: tree batches of a store commit one at a time anyway (the blob lock),
        so plain rows go on through the other writers instead of waiting behind them.
        """
        batch: list[Write] = []
        keeps: dict[str, int | None] = {}
        names: set[tuple[str, int] | tuple[str, int, str]] = set()
        blocked: set[str] = set()
        left: deque[Write] = deque()
        size = 0
        while self._queue:
            item = self._queue.popleft()
            if item.future.done():  # cancelled while queued: never written
                continue
            wf = item.workflow_id
            weight = _weight(item)
            full = len(batch) >= self._limits.max_batch_rows or (
                batch and size + weight > self._limits.max_batch_bytes
            )
            clash = item.name in names or (
                item.key is None and wf in keeps and keeps[wf] != item.keep_last
            )
            tree = item.split is not None
            other_kind = (
                (batch[0].split is not None) != tree if batch else (tree and self._trees_in_flight)
            )
            if full or wf in blocked or wf in self._in_flight or clash or other_kind:
                blocked.add(wf)
                left.append(item)
                continue
            batch.append(item)
            if item.key is None:
                keeps[wf] = item.keep_last
            names.add(item.name)
            size += weight
        self._queue = left
        self._in_flight.update(w.workflow_id for w in batch)
        if batch and batch[0].split is not None:
            self._trees_in_flight = True
        return batch

    async def _write_batch(self, batch: list[Write]) -> None:
        """Commit the batch, then resolve each caller; on failure, find the guilty rows."""
        try:
            await self._run_write(batch)
        except Exception as exc:
            if (
                len(batch) > 1
                and not is_transient(exc)
                and not isinstance(exc, StorageTimeoutError)
            ):
                # One bad row fails the whole statement: write rows one by one so that only
                # its own caller sees the error.
                self._stats.split_batches += 1
                for item in batch:
                    await self._write_batch([item])
                return
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(_write_error(exc))
            return
        except BaseException:
            for item in batch:
                item.future.cancel()
            raise
        for item in batch:
            if not item.future.done():
                item.future.set_result(None)

    async def _run_write(self, batch: list[Write]) -> None:
        tx = _BatchTransaction(batch, self._sql, self._blobs)
        errors: tuple[type[BaseException], ...] = (*driver_errors(import_asyncpg()), Raced)
        conflicts = 0
        pool = await self._connection.pool()
        budget = self._connection.budget()
        what = f"save (a batch of {len(batch)})"
        while True:
            try:
                await self._connection.attempt(pool, what, tx.run, budget)
                break
            except errors as exc:
                if budget.expired() and is_transient(exc):  # a real error is reported as it is
                    raise budget.timed_out(what, timeout_cause(exc)) from exc
                # The transaction is all or nothing, so after a lost deadlock running it again
                # is safe. If the commit's fate is unknown because the connection died and it
                # did commit, the run again adds the trees' refs a second time, but its upsert
                # then replaces the batch's own records and releases their refs: the counts
                # come out exact either way, and the upsert and the prune are idempotent.
                if isinstance(exc, BlobLockBusy):
                    tx.lock_first = True
                if conflict(exc) and conflicts < _CONFLICT_ATTEMPTS:
                    # Expected under contention: logged without a warning or a traceback.
                    logger.debug("batch of %d writes lost a conflict; retrying", len(batch))
                    conflicts += 1
                    self._stats.retries += 1
                    await asyncio.sleep(random.uniform(0, 0.002 * conflicts))
                    continue
                if budget.attempts - conflicts <= self._connection.retries and is_transient(exc):
                    logger.debug("batch of %d writes: %s; retrying", len(batch), exc)
                    self._stats.retries += 1
                    continue
                raise
        self._stats.rows += len(tx.written)
        self._stats.batches += 1
        record_commit("postgresql", len(batch))
        self._stats.largest_batch = max(self._stats.largest_batch, len(batch))
        for item in batch:
            if item.name not in tx.written and not item.future.done():
                what = "checkpoint" if item.key is None else "effect record"
                item.future.set_exception(
                    LeaseLostError(
                        f"lease {item.token} on workflow {item.workflow_id!r} is no longer "
                        f"current; the {what} was not written"
                    )
                )


class _BatchTransaction:
    """The statements of one batch, run (and, after a conflict, run again) on a connection.

    In the transaction: the blob lock, when the batch holds trees or a run found it needed
    the lock only after its row locks (``lock_first``); the trees' adds; the upsert; the
    effect records; the prune; the releases of what the upsert replaced and the prune
    removed (:mod:`.blobs`).
    """

    def __init__(self, batch: list[Write], sql: Sql, blobs: Blobs) -> None:
        # A stable order makes concurrent writers (other processes too) lock rows in the same
        # order, so two batches cannot deadlock on their records.
        effects = sorted((w for w in batch if w.key is not None), key=lambda w: w.name)
        self._effects = [
            [w.workflow_id for w in effects],
            [w.step for w in effects],
            [w.key for w in effects],
            [w.in_doubt for w in effects],
            [w.data for w in effects],
            [w.token for w in effects],
        ]
        batch = sorted((w for w in batch if w.key is None), key=lambda w: (w.workflow_id, w.step))
        self._args = (
            [w.workflow_id for w in batch],
            [w.step for w in batch],
            [w.data for w in batch],
            [w.token for w in batch],
        )
        # $7, $8 and $9 of the upsert: the agent, agent status and record kind of each row
        # (None: not told).
        self._infos = (
            [None if w.step_info is None else w.step_info.agent_id for w in batch],
            [None if w.step_info is None else w.step_info.agent_status for w in batch],
            [None if w.step_info is None else w.step_info.kind for w in batch],
        )
        #: The events the saves carry (a fork's ``forked``), appended in their transaction.
        self._notes = [
            (w.name, w.step_info.note)
            for w in batch
            if w.step_info is not None and w.step_info.note is not None
        ]
        self._keeps = {w.workflow_id: w.keep_last for w in batch if w.keep_last is not None}
        self._splits = {(w.workflow_id, w.step): w.split for w in batch if w.split is not None}
        self._sql = sql
        self._blobs = blobs
        #: The rows the last run wrote (``Write.name``): those of a stale lease are missing.
        self.written: set[tuple[str, int] | tuple[str, int, str]] = set()
        #: Take the blob lock before any row lock (set after a run found it taken too late).
        self.lock_first = False

    async def run(self, con: Any) -> None:
        """Write the batch: in one statement if it can, else in a transaction."""
        self.written.clear()
        if not self._args[0]:  # effect records only: one statement, its own commit
            await self._put_effects(con)
            return
        simple = not (self._keeps or self._splits or self._notes or self._effects[0])
        if simple and not self.lock_first:
            # One statement, its implicit transaction committing before it returns, unless
            # it would replace a version-2 record (refs to release): then it writes nothing
            # and the batch runs in a transaction below.
            rows = await con.fetch(self._sql.upsert, *self._args, True, [], *self._infos)
            if rows:
                self._record(rows, committed=True)
                return
        async with con.transaction():
            await self._transaction(con)

    async def _transaction(self, con: Any) -> None:
        # Adds before releases: a blob shared by a replaced record and its replacement never
        # drops to 0 in between.
        locked = bool(self._splits) or self.lock_first
        upsert = (*self._args, False, sorted(self._keeps), *self._infos)
        if self._splits:
            # The blob lock, the trees' adds and the upsert: one statement, then the deeper
            # levels of the trees (Blobs.add).
            rows = await self._blobs.add(con, self._splits.values(), upsert)
        else:
            if locked:
                await self._blobs.lock(con)
            rows = await con.fetch(self._sql.upsert, *upsert)
        released = self._record(rows, committed=False)
        notes = [(name[0], *note) for name, note in self._notes if name in self.written]
        if notes:
            await con.execute(self._sql.note_events, *map(list, zip(*notes, strict=True)))
        if self._effects[0]:
            await self._put_effects(con)
        for key, split in self._splits.items():
            if key not in self.written:
                released.update(split.root_refs)  # stale lease: undo its adds
        released.update(await self._prune(con))
        if released and not locked:
            await self._blobs.lock_late(con)
        await self._blobs.release(con, released.elements())

    async def _put_effects(self, con: Any) -> None:
        rows = await con.fetch(self._sql.effect_put, *self._effects)
        self.written.update((row[0], row[1], row[2]) for row in rows)

    async def _prune(self, con: Any) -> Counter[bytes]:
        """Apply ``keep_last``; return the refs the pruned version-2 records held."""
        # Only workflows that got a row: a stale writer prunes nothing.
        prune = {
            wf: n
            for wf, n in self._keeps.items()
            if any(len(k) == 2 and k[0] == wf for k in self.written)
        }
        released: Counter[bytes] = Counter()
        if prune:
            rows = await con.fetch(self._sql.prune, list(prune), list(prune.values()))
            for row in rows:
                released.update(held_root_refs(row[0]))
        return released

    def _record(self, rows: list[Any], committed: bool) -> Counter[bytes]:
        """Note the rows written; return the refs of the version-2 records they replaced."""
        released: Counter[bytes] = Counter()
        for row in rows:
            self.written.add((row[0], row[1]))
            if row[2] and not row[3] and not committed:
                # Replaced a row this statement's snapshot did not see, so its refs (if it
                # was version 2) were not handed back: run the batch again.
                raise Raced("a record was written concurrently; the batch runs again")
            if row[4] is not None:
                released.update(held_root_refs(row[4]))
        return released


def _weight(item: Write) -> int:
    """What a queued write adds to its batch's size: its record and its blobs."""
    if item.split is None:
        return len(item.data)
    return len(item.data) + item.split.stored_bytes()


def _write_error(exc: Exception) -> Exception:
    if isinstance(exc, CheckpointError):
        return exc
    return failure("save", exc)
