"""The event loop's half of the group commit: the write queue and when a batch is taken.

Writes are queued with a future each; one loop iteration after the first of them, the whole
queue goes to the writer thread as one batch (:meth:`Writer.run_batch
<aiocheckpoint.storage.sqlite.writer.Writer.run_batch>`: one transaction, one fsync), and
the next batch is taken one loop iteration after the previous one's callers were woken, so
they join it. The same place schedules the background WAL checkpoints, which only ever run
while no batch is in the writer thread. The reasons, with measurements, are in
docs/sqlite-storage.md "Group commit" and "WAL checkpoints".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, NamedTuple, TypeVar

from ..._telemetry import record_commit
from ...errors import StorageClosedError
from ..turns import SaveClock
from .rejoin import Rejoin
from .walcheckpoint import (
    BACKGROUND_CHECKPOINT_PAGES,
    BACKGROUND_WAL_LIMIT_PAGES,
    CHECKPOINT_PAGES,
    WAL_LIMIT_PAGES,
    Checkpointer,
    CheckpointResult,
)
from .writer import Op, Outcome, RecordOp, Writer, is_background, slice_of

T = TypeVar("T")
Item = TypeVar("Item")
R = TypeVar("R")

#: A batch stops growing at this many queued bytes (it always takes at least one write).
_MAX_BATCH_BYTES: Final = 64 * 1024 * 1024
#: Seconds without a batch after which the writer counts as idle and the WAL is checkpointed.
_IDLE_SECONDS: Final = 0.1
#: Seconds after a background write's last slice during which the WAL's looser bound still
#: holds: a sweep reads its next page meanwhile, then writes again.
_BACKGROUND_GRACE: Final = 1.0


class _Pending(NamedTuple):
    op: Op
    size: int
    future: asyncio.Future[Any]


#: ``_Pending(op, size, future)`` without ``NamedTuple.__new__``'s Python frame (every save).
_pending: Callable[[tuple[Op, int, asyncio.Future[Any]]], _Pending] = functools.partial(
    tuple.__new__, _Pending
)


class GroupCommit:
    """The write queue of one writer thread, driven from the event loop.

    A base class of :class:`~aiocheckpoint.storage.sqlite.SQLiteCheckpointStorage`: its
    state lives on the store (the tests and the bench look at it there). Only the event
    loop's thread touches it.
    """

    _closing: asyncio.Task[None] | None

    def __init__(self, writer: Writer, checkpointer: Checkpointer, max_batch: int) -> None:
        self._writer = writer
        self._max_batch = max_batch
        self._write_thread = ThreadPoolExecutor(1, thread_name_prefix="aiocheckpoint-sqlite-w")
        self._checkpointer = checkpointer
        self._checkpoint_thread = ThreadPoolExecutor(1, thread_name_prefix="aiocheckpoint-sqlite-c")
        self._checkpointing: asyncio.Future[CheckpointResult | None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_batch = 0.0  # loop.time() when the writer last took a batch
        self._pending: deque[_Pending] = deque()
        self._busy = False  # a batch (or the open) is in the writer thread
        self._kick_due = False  # a _kick is scheduled for the next loop iteration
        self._rejoin = Rejoin()  # when a free writer waits for the callers it woke
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._opening: asyncio.Future[None] | None = None
        self._opened = False
        self._closing = None
        #: Background writes under way (:meth:`_background`): the WAL's bound is looser.
        self._background_writes = 0
        self._background_ended = float("-inf")  # loop.time() when the last one ended
        self._save_clock = SaveClock()
        #: Saves (writes other than a background slice) queued, and whether the batch the
        #: writer runs now holds saves: a sweep's work waits for them (:meth:`saves_written`).
        self._saves_queued = 0
        self._saves_writing = False
        self._quiet_waiters: list[asyncio.Future[None]] = []

    def _submit(self, op: Op, size: int) -> asyncio.Future[Any]:
        """Queue ``op``; the future its caller awaits (not a coroutine: one frame less to keep).

        Cancelling the caller cancels the future: a queued write is then skipped when the
        next batch is taken; a write already taken is committed regardless.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append(_pending((op, size, future)))
        if not is_background(op):
            self._save_clock.saved()
            self._saves_queued += 1
        if not self._busy and not self._kick_due:
            # Hand the writer what is queued one loop iteration later, not now: the other
            # tasks running in this iteration (typically every caller woken by the last
            # commit) then join this batch instead of waiting a whole commit behind a
            # batch of one.
            self._kick_due = True
            loop.call_soon(self._due_kick)
        return future

    def _due_kick(self) -> None:
        self._kick_due = False
        self._safe_kick()

    def _safe_kick(self) -> None:
        """:meth:`_kick` from a loop callback: if it fails, fail the callers, never hang."""
        try:
            self._kick()
        except Exception as exc:  # e.g. the executor was shut down
            self._fail_pending(exc)

    def _fail_pending(self, failure: BaseException) -> None:
        for item in self._pending:
            _settle(item.future, failure)
        self._pending.clear()
        self._saves_queued = 0
        self._wake_idle_waiters()
        self._wake_quiet_waiters()

    def _kick(self) -> None:
        """Hand the queued writes to the writer thread, unless it is busy (then they wait)."""
        if self._busy:
            return
        if not self._opened:
            opening = self._start_open()
            self._busy = True  # the writer thread is opening the database
            opening.add_done_callback(self._open_then_kick)
            return
        batch = self._take_batch()
        if not batch:
            self._wake_idle_waiters()
            self._wake_quiet_waiters()
            self._maybe_checkpoint(idle=True)
            return
        self._last_batch = asyncio.get_running_loop().time()
        record_commit("sqlite", len(batch))
        try:
            done = asyncio.get_running_loop().run_in_executor(
                self._write_thread, self._writer.run_batch, [item.op for item in batch]
            )
        except RuntimeError as exc:  # the executor was shut down
            self._pending.extendleft(reversed(batch))
            self._saves_queued += sum(not is_background(item.op) for item in batch)
            raise StorageClosedError("SQLiteCheckpointStorage is closed") from exc
        self._busy = True
        # A background slice always goes alone (_take_batch): the first op says it all.
        self._saves_writing = not is_background(batch[0].op)
        done.add_done_callback(functools.partial(self._batch_done, batch))

    def _batch_done(self, batch: list[_Pending], done: asyncio.Future[list[Outcome]]) -> None:
        if done.cancelled():
            outcomes: list[Any] = [StorageClosedError("the write was abandoned") for _ in batch]
        elif (failure := done.exception()) is not None:
            outcomes = [failure] * len(batch)  # a bug in run_batch: every caller should see it
        else:
            outcomes = done.result()
        for item, outcome in zip(batch, outcomes, strict=True):
            _settle(item.future, outcome)
        self._saves_writing = False
        self._wake_quiet_waiters()
        self._rejoin.woke(len(batch), len(self._pending))
        self._maybe_checkpoint(idle=False)
        # Take the next batch one loop iteration later, after the callers just woken have run
        # and queued their next writes (the writer still counts as busy, so they queue rather
        # than each starting a batch of one): one fsync then serves all of them. Callers that
        # first await something else start a new batch through _submit's deferred kick.
        # Pipelining half-batches against the event loop loses (docs/sqlite-storage.md).
        asyncio.get_running_loop().call_soon(self._writer_free)

    def _maybe_checkpoint(self, *, idle: bool) -> None:
        """Start a background checkpoint when enough was committed; when idle, arm a timer.

        Called only while the writer thread is not running a batch, so reading and
        resetting its page count needs no lock.
        """
        writer = self._writer
        if self._checkpointing is not None or self._closing is not None:
            return
        due = BACKGROUND_CHECKPOINT_PAGES if self._in_background() else CHECKPOINT_PAGES
        if writer.wal_pages >= due and not writer.catch_up:
            self._start_checkpoint()
        elif idle and writer.wal_pages > 0 and self._idle_timer is None:
            # Not at once: between two writes of one caller the writer is idle for a moment,
            # and a checkpoint (two fsyncs) after every commit would halve C=1's rate.
            self._idle_timer = asyncio.get_running_loop().call_later(
                _IDLE_SECONDS, self._idle_checkpoint
            )

    def _idle_checkpoint(self) -> None:
        self._idle_timer = None
        if self._busy or self._pending or self._checkpointing is not None:
            return  # the writer's next idle moment arms the timer again
        if self._closing is not None or self._writer.wal_pages == 0:
            return
        quiet = asyncio.get_running_loop().time() - self._last_batch
        if quiet < _IDLE_SECONDS:
            self._idle_timer = asyncio.get_running_loop().call_later(
                _IDLE_SECONDS - quiet, self._idle_checkpoint
            )
            return
        self._start_checkpoint()

    def _start_checkpoint(self) -> None:
        writer = self._writer
        try:
            running = asyncio.get_running_loop().run_in_executor(
                self._checkpoint_thread, self._checkpointer.run
            )
        except RuntimeError:  # shut down by close(), which checkpoints itself
            return
        writer.wal_pages = 0
        self._checkpointing = running
        running.add_done_callback(self._checkpoint_done)

    def _checkpoint_done(self, running: asyncio.Future[CheckpointResult | None]) -> None:
        self._checkpointing = None
        result = None if running.cancelled() or running.exception() else running.result()
        limit = BACKGROUND_WAL_LIMIT_PAGES if self._in_background() else WAL_LIMIT_PAGES
        if result is not None and result.log >= limit:
            # Under a steady write load the checkpoint never catches up with the WAL's end
            # and SQLite only starts the WAL over once it has: the writer copies the few
            # frames committed during this checkpoint before its next batch.
            self._writer.catch_up = True
        elif not self._busy:
            self._maybe_checkpoint(idle=not self._pending)

    def _writer_free(self) -> None:
        if self._rejoin.wait(len(self._pending), self._max_batch):
            # A few writes queued while the batch ran (a caller out of step): wait for the
            # callers just woken to join them rather than commit them alone (rejoin.py).
            asyncio.get_running_loop().call_soon(self._writer_free)
            return
        self._busy = False
        self._safe_kick()

    def _open_then_kick(self, opening: asyncio.Future[None]) -> None:
        self._busy = False
        failure = _failure(opening)
        if failure is None:
            self._safe_kick()
            return
        self._fail_pending(failure)

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._pending and len(batch) < self._max_batch:
            item = self._pending[0]
            if item.future.done():  # its caller was cancelled while it was queued
                self._pending.popleft()
                self._saves_queued -= not is_background(item.op)
                continue
            # A background write's slice goes alone: saves queued behind it stay queued,
            # so the slice sees them waiting and ends after the workflow it is on.
            if batch and (
                size + item.size > _MAX_BATCH_BYTES
                or is_background(item.op)
                or is_background(batch[0].op)
            ):
                break
            self._pending.popleft()
            self._saves_queued -= not is_background(item.op)
            batch.append(item)
            size += item.size
        return batch

    def _wake_idle_waiters(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            _settle(waiter, None)

    def _wake_quiet_waiters(self) -> None:
        if self._quiet_waiters and not self.saves_in_flight():
            waiters, self._quiet_waiters = self._quiet_waiters, []
            for waiter in waiters:
                _settle(waiter, None)

    async def _flush(self) -> None:
        """Wait until every queued write has been committed (or has failed)."""
        while self._busy or self._pending:
            if not self._busy:
                self._kick()
                continue
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    async def _in_slices(
        self,
        what: str,
        items: Sequence[Item],
        fn: Callable[[sqlite3.Connection, float, Item], R],
    ) -> list[R]:
        """``fn`` applied to every item in the writer: one outcome per item, in order.

        As many items per transaction as a slice's time allows (:func:`~.writer.slice_of`;
        each item whole in one), each slice a background write: the writes queued while
        one slice ran are committed before the next. The slices committed stay if a later
        one fails.
        """
        done: list[R] = []
        with self._background():
            while len(done) < len(items):
                op = RecordOp(what, slice_of(items, len(done), fn, self._waiting), background=True)
                done += await self._submit(op, 0)
        return done

    @contextlib.contextmanager
    def _background(self) -> Iterator[None]:
        """A background write's slices under way: the WAL's looser bound meanwhile.

        The bound is checked when a background checkpoint ends: the first one more than
        :data:`_BACKGROUND_GRACE` after the slices end catches up as usual.
        """
        self._background_writes += 1
        try:
            yield
        finally:
            self._background_writes -= 1
            self._background_ended = asyncio.get_running_loop().time()

    def saving_lately(self) -> bool:
        """Whether a save (not a background write's slice) was queued lately.

        Within the last :data:`..turns.SAVING_LATELY` seconds: a sweep then rests now and
        then as it judges and reads, to leave the writer thread the GIL (``retention``,
        :func:`..turns.gil_breaks`), and after each of its writes. Read from any thread.
        """
        return self._save_clock.lately()

    def saves_in_flight(self) -> bool:
        """Whether a save is queued or being written. Read from any thread (an int, a bool)."""
        return bool(self._saves_queued or self._saves_writing)

    async def saves_written(self, at_most: float) -> None:
        """Return once no save is queued or being written, or after ``at_most`` seconds.

        A sweep's work on the loop waits here (``retention``): the saves' batch then has the
        writer thread, the loop and the GIL to itself. A save needs the GIL at each of its
        statements; a thread running Python beside it gives the GIL back only after the
        switch interval, or at its next rest, and a save queued behind a sweep's slice made
        that slice run as long too (``bench/sweep_writers.py --trace``).
        """
        if not self.saves_in_flight():
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._quiet_waiters.append(waiter)
        timer = loop.call_later(at_most, _settle, waiter, None)
        try:
            await waiter
        finally:
            timer.cancel()

    def _in_background(self) -> bool:
        """Whether a background write runs, or ended less than :data:`_BACKGROUND_GRACE` ago."""
        if self._background_writes:
            return True
        return asyncio.get_running_loop().time() - self._background_ended < _BACKGROUND_GRACE

    def _waiting(self) -> bool:
        """Whether a write is queued: asked from the writer thread.

        A deque's length is read whole under the GIL; a stale answer only moves a slice's end.
        """
        return bool(self._pending)

    async def _in_thread(self, executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except RuntimeError as exc:  # the executor was shut down by a concurrent close()
            raise StorageClosedError("SQLiteCheckpointStorage is closed") from exc
        return await future

    async def _ensure_open(self) -> None:
        if not self._opened:
            # Shielded: a cancelled caller must not abandon an open other callers share.
            await asyncio.shield(self._start_open())

    def _start_open(self) -> asyncio.Future[None]:
        if self._opening is None:
            try:
                opening = asyncio.get_running_loop().run_in_executor(
                    self._write_thread, self._writer.open
                )
            except RuntimeError as exc:  # the executor was shut down by close()
                raise StorageClosedError("SQLiteCheckpointStorage is closed") from exc
            opening.add_done_callback(self._open_done)
            self._opening = opening
        return self._opening

    def _open_done(self, opening: asyncio.Future[None]) -> None:
        if _failure(opening) is None:
            self._opened = True
        else:
            self._opening = None  # the next use tries again

    async def _drain(self) -> None:
        """Commit every queued write; wait for the open and a running checkpoint to end."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        await self._flush()
        if self._opening is not None:
            with contextlib.suppress(Exception):  # a failed open left nothing to close
                await asyncio.shield(self._opening)
        if self._checkpointing is not None:
            with contextlib.suppress(Exception):  # it logs its own failures
                await asyncio.shield(self._checkpointing)


def _failure(future: asyncio.Future[Any]) -> BaseException | None:
    if future.cancelled():
        return StorageClosedError("opening the database was abandoned")
    return future.exception()


def _settle(future: asyncio.Future[Any], outcome: object) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
