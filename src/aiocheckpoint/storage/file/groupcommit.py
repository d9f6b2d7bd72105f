"""The file store's group commit: writes queued behind a busy writer are written together.

A write is a save (:class:`SaveOp`) or an effect record (:class:`EffectOp`): concurrent
checkpoints and effect records share one group's barriers.

The event-loop half queues each save and hands every save queued when the writer is free
to one worker-thread hop (at most ``_MAX_GROUP`` saves or ``_MAX_GROUP_BYTES``); the
worker half writes the group (:mod:`.batch`: every temp file, the hints, a barrier, the
renames, a barrier; docs/file-storage.md, "The write path"). A group of one takes the
single path of :mod:`.records`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import anyio

from ...errors import StorageClosedError
from ..diskfull import storage_error
from .batch import Batch, EffectOp, Op, SaveOp
from .dirs import WorkflowDirs

__all__ = ["EffectOp", "GroupCommit", "Op", "SaveOp"]

#: A group commit takes at most this many saves, and stops growing at this many bytes.
_MAX_GROUP: Final = 256
_MAX_GROUP_BYTES: Final = 64 * 1024 * 1024
#: A finished group wakes its callers this many per event-loop iteration.
_WAKE_SLICE: Final = 8
#: Fewer queued saves than this take the single path (per-file fsyncs), not a group.
_GROUP_MIN: Final = 2


@dataclass(eq=False)
class _Pending:
    """A queued save and the future its caller waits on."""

    op: Op
    future: asyncio.Future[None] = field(repr=False)
    taken: bool = False  # in a group commit now: it lands whole or not at all


class GroupCommit:
    """The write queue of one store and the writer that empties it, a group per hop.

    ``save_one`` writes one save by the single path (a group of one, and the saves of a
    group whose directory was replaced under it); ``prepare`` runs before a group (the
    store's first-write setup); ``after_prune`` runs after a group whose retention deleted
    steps.
    """

    def __init__(
        self,
        base: str,
        dirs: WorkflowDirs,
        save_one: Callable[[Op], None],
        prepare: Callable[[list[Op]], None],
        after_prune: Callable[[], None],
        *,
        use_syncfs: bool,
    ) -> None:
        self._base = base
        self._dirs = dirs
        self._save_one = save_one
        self._prepare = prepare
        self._after_prune = after_prune
        self._use_syncfs = use_syncfs
        self._queue: deque[_Pending] = deque()
        self._kick_due = False
        self._busy: asyncio.AbstractEventLoop | None = None  # the loop of the running group
        self._idle: list[asyncio.Future[None]] = []

    # --- the event-loop half ----------------------------------------------------------

    async def commit(self, op: Op) -> None:
        """Queue ``op`` for the next group commit and wait until it is durable."""
        item = _Pending(op, asyncio.get_running_loop().create_future())
        self._queue.append(item)
        self._schedule_kick()
        try:
            await asyncio.shield(item.future)
        except asyncio.CancelledError:
            if not item.taken:
                item.future.cancel()  # still queued: the next group skips it
                raise
            await _outlast(item.future)  # being written: it lands whole or not at all
            raise

    async def drain(self) -> None:
        """Wait until every queued save is written and the writer is idle."""
        while self._busy is not None or self._queue:
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            self._schedule_kick()
            await waiter

    def _schedule_kick(self) -> None:
        # One loop iteration later, so that every caller woken together joins one group.
        if not self._kick_due:
            self._kick_due = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_due = False
        if self._busy is not None and not self._busy.is_closed():
            return
        self._busy = None
        group: list[_Pending] = []
        size = 0
        while self._queue and len(group) < _MAX_GROUP:
            item = self._queue[0]
            if item.future.done():  # cancelled while queued
                self._queue.popleft()
                continue
            if group and size + len(item.op.data) > _MAX_GROUP_BYTES:
                break
            self._queue.popleft()
            item.taken = True
            group.append(item)
            size += len(item.op.data)
        if not group:
            idle, self._idle = self._idle, []
            for waiter in idle:
                if not waiter.done():
                    waiter.set_result(None)
            return
        loop = asyncio.get_running_loop()
        self._busy = loop
        # The loop's default executor: a store that is never closed holds no thread.
        done = loop.run_in_executor(None, self.write_group, [i.op for i in group])
        done.add_done_callback(functools.partial(self._group_done, group))

    def _group_done(
        self, group: list[_Pending], done: asyncio.Future[list[BaseException | None]]
    ) -> None:
        outcomes: list[BaseException | None]
        if done.cancelled():
            outcomes = [StorageClosedError("the write was abandoned")] * len(group)
        elif (failure := done.exception()) is not None:
            outcomes = [failure] * len(group)
        else:
            outcomes = done.result()
        self._wake(done.get_loop(), list(zip(group, outcomes, strict=True)))

    def _wake(
        self,
        loop: asyncio.AbstractEventLoop,
        results: list[tuple[_Pending, BaseException | None]],
    ) -> None:
        # A few callers per loop iteration: each goes on to encode its next checkpoint on
        # the loop, and a hundred of them at once would hold it for milliseconds.
        for item, outcome in results[:_WAKE_SLICE]:
            if item.future.done():
                continue
            if outcome is None:
                item.future.set_result(None)
            elif isinstance(outcome, OSError):
                item.future.set_exception(
                    storage_error(f"{_describe(item.op)} in {self._base}", outcome, outcome)
                )
            else:
                item.future.set_exception(outcome)
        if len(results) > _WAKE_SLICE:
            loop.call_soon(self._wake, loop, results[_WAKE_SLICE:])
        else:
            loop.call_soon(self._writer_free)

    def _writer_free(self) -> None:
        self._busy = None
        self._kick()

    # --- the worker-thread half -------------------------------------------------------

    def write_group(self, ops: list[Op]) -> list[BaseException | None]:
        """Write a group of writes; return each one's exception or None (durable)."""
        if len(ops) < _GROUP_MIN:
            try:
                self._save_one(ops[0])
            except Exception as exc:
                return [exc]
            return [None]
        try:
            self._prepare(ops)
            syncfs = self._use_syncfs and self._dirs.ops.has_syncfs
            outcomes, retry = Batch(self._dirs, ops, syncfs=syncfs).run()
        except Exception as exc:
            return [exc] * len(ops)
        for i in retry:  # the workflow's directory was replaced under us: one by one
            try:
                self._save_one(ops[i])
            except Exception as exc:
                outcomes[i] = exc
        if self._dirs.pruned:
            self._dirs.pruned = False
            self._after_prune()
        return outcomes


def _describe(op: Op) -> str:
    """What failed, for an error message: "cannot save step N of workflow 'wf'"."""
    if isinstance(op, EffectOp):
        return f"cannot record an effect of step {op.step} of workflow {op.workflow_id!r}"
    return f"cannot save step {op.step} of workflow {op.workflow_id!r}"


async def _outlast(future: asyncio.Future[None]) -> None:
    """Wait for ``future`` however often the caller is cancelled; ignore its outcome."""
    # Shielded: an anyio cancel scope delivers its cancellation again at every await, so
    # without the shield this loop would spin on the event loop until the group is written,
    # and the spinning loop would starve the group's thread of the GIL (measured: a storm
    # of 100 cancelled workflows took 228 s instead of 0.2 s).
    with anyio.CancelScope(shield=True):
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((future,))
    if not future.cancelled():
        future.exception()  # retrieved: the caller is being cancelled anyway
