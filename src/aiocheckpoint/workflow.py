"""ResumableWorkflow: resume on entry, checkpoint each step on exit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

import anyio
from typing_extensions import Self

from ._validation import check_step, check_workflow_id
from .effects import Reconcile, StepEffects
from .errors import InvalidArgumentError, LeaseError, LeaseLostError
from .leases import Lease, WorkflowStatus
from .manager import CheckpointManager
from .models import AgentStatus, Checkpoint, ExecutionMetrics, utcnow
from .state import SharedState

__all__ = ["ResumableWorkflow"]

logger = logging.getLogger("aiocheckpoint")

T = TypeVar("T")

_RELEASE_TIMEOUT = 5.0
_DEFAULT_TTL = 30.0


class ResumableWorkflow:
    """A workflow run that picks up where the last run stopped.

    ``async with ResumableWorkflow(workflow_id, manager) as wf:`` resumes on entry (see
    :meth:`try_resume`). Inside, ``async with wf.step(n, agent_id="..."):`` checkpoints the
    step when its block exits: COMPLETED on a normal exit, FAILED (with the error's type and
    message in the metadata) when it raises, after which the exception propagates unchanged.

    A *cancelled* step records nothing: the last checkpoint written stays the resume point,
    so the step runs again on resume. (Cancellation is not a failure of the step; recording
    it as FAILED would be a lie, and recording it as COMPLETED would skip unfinished work.)

    A step is all or nothing for the state: when it fails or is cancelled, the changes it made
    to :attr:`state` are rolled back, so the FAILED checkpoint (and the retry) start from the
    state the step started with, exactly as after a crash.

    Skip finished steps with :meth:`is_completed`::

        for n, agent in enumerate(agents):
            if wf.is_completed(n):
                continue
            async with wf.step(n, agent_id=agent.name):
                await agent.run(wf.state)

    On backends with workflow records (in-memory, SQLite, PostgreSQL), leaving the
    ``async with`` block normally marks the workflow FINISHED, and leaving it with an
    exception marks it FAILED; a cancellation leaves it UNFINISHED.

    Leases: pass ``lease_owner`` to acquire the workflow's lease on entry (raising
    :class:`~aiocheckpoint.LeaseHeldError` if another live owner holds it), or ``lease`` to
    drive a workflow obtained from :meth:`CheckpointManager.claim_workflow`. While the block
    runs, the lease is renewed in the background every ``lease_ttl / 3`` seconds (``lease_ttl``
    defaults to the TTL the lease was granted for, or 30 seconds with ``lease_owner``); every
    checkpoint is fenced by it; it is released on exit. If the lease is lost (taken over
    after it expired), the block is cancelled and :class:`~aiocheckpoint.LeaseLostError`
    is raised from the ``async with``.
    """

    def __init__(
        self,
        workflow_id: str,
        checkpoint_manager: CheckpointManager,
        initial_state: Mapping[str, Any] | None = None,
        *,
        lease_owner: str | None = None,
        lease: Lease | None = None,
        lease_ttl: float | None = None,
    ) -> None:
        self.workflow_id = check_workflow_id(workflow_id)
        if lease is not None and lease.workflow_id != self.workflow_id:
            raise LeaseLostError(f"the lease is for workflow {lease.workflow_id!r}")
        self.checkpoint_manager = checkpoint_manager
        self.lease = lease
        self._lease_owner = lease_owner
        # Renew for as long as the lease was granted for, unless told otherwise.
        self._lease_ttl = lease_ttl or (lease.ttl if lease is not None else _DEFAULT_TTL)
        self._renewer: asyncio.Task[None] | None = None
        self._lost: LeaseError | None = None
        self.state = SharedState(initial_state)
        self.metrics = ExecutionMetrics(start_time=utcnow())
        self.is_resumed = False
        self.resume_step = 0
        self.current_step = 0
        self._effects: StepEffects | None = None

    async def try_resume(self) -> int:
        """Restore state and metrics from the last checkpoint; return the step to run next.

        Returns 0 and leaves the initial state in place when there is nothing to resume.
        """
        point = await self.checkpoint_manager.get_resume_point(self.workflow_id)
        if point is None:
            return 0
        step, snapshot, metrics = point
        self.state = SharedState.from_snapshot(snapshot)
        self.metrics = metrics
        self.is_resumed = True
        self.resume_step = self.current_step = step
        return step

    def is_completed(self, step: int) -> bool:
        """Whether ``step`` finished in an earlier run (it comes before the resume step)."""
        return check_step(step) < self.resume_step

    async def checkpoint(
        self,
        step: int,
        agent_id: str,
        status: AgentStatus | str,
        metadata: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """Checkpoint the current state and metrics as ``step``."""
        checkpoint = await self.checkpoint_manager.create_checkpoint(
            self.workflow_id,
            step,
            agent_id,
            status,
            self.state,
            metrics=self.metrics,
            metadata=metadata,
            lease=self.lease,
        )
        self.current_step = step
        return checkpoint

    @asynccontextmanager
    async def step(
        self, step: int, agent_id: str, metadata: Mapping[str, Any] | None = None
    ) -> AsyncIterator[Self]:
        """Run one step; checkpoint it when the block exits (see the class docstring).

        Metrics are updated first: ``elapsed_seconds`` grows by the block's duration and
        ``total_steps`` by one for a completed step.
        """
        check_step(step)
        self.current_step = step
        self._effects = StepEffects(self.checkpoint_manager, self.workflow_id, step, self._fence)
        state = self.state
        before = state._mark()
        started = time.monotonic()
        try:
            try:
                yield self
            finally:
                self._effects = None  # effects belong inside the block
        except Exception as exc:
            self.metrics.elapsed_seconds += time.monotonic() - started
            self._roll_back(state, before)
            error = {"type": type(exc).__qualname__, "message": str(exc)}
            try:
                await self.checkpoint(
                    step, agent_id, AgentStatus.FAILED, {**(metadata or {}), "error": error}
                )
            except Exception:
                logger.exception(
                    "workflow %r: could not record the failure of step %d", self.workflow_id, step
                )
            raise
        except BaseException:
            # Cancellation, KeyboardInterrupt: nothing is recorded.
            self._roll_back(state, before)
            raise
        self.metrics.elapsed_seconds += time.monotonic() - started
        self.metrics.total_steps += 1
        await self.checkpoint(step, agent_id, AgentStatus.COMPLETED, metadata)

    async def effect(
        self,
        key: str | None,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        idempotent: bool = False,
        reconcile: Reconcile | None = None,
        **kwargs: Any,
    ) -> T:
        """Call ``fn(*args, **kwargs)`` at most once per step, durably (``docs/effects.md``).

        Inside ``async with wf.step(...)``: records an *intent*, calls ``fn``, records its
        result, returns it. When the step runs again (a retry, or a resume after a crash),
        an effect whose result is recorded returns it without calling ``fn``; one whose call
        failed is called again; one whose intent has no outcome is *in doubt* and raises
        :class:`~aiocheckpoint.EffectInDoubtError`, unless ``reconcile`` (asked with the
        :class:`EffectRecord`, returns a :class:`Reconciled`) says what happened, or
        ``idempotent=True``: then ``fn`` is called again with ``idempotency_key=`` a key
        that is the same on every attempt.

        ``key`` names the effect within its step; ``None`` derives ``#0``, ``#1``, ... from
        the order in which the calls start, and a re-run that calls another function (by
        qualified name) in a recorded place raises :class:`~aiocheckpoint.EffectOrderError`.
        With a lease, the intent is fenced: a runner whose lease was taken over gets
        :class:`~aiocheckpoint.LeaseLostError` before ``fn`` is called.
        """
        effects = self._effects
        if effects is None:
            raise InvalidArgumentError("wf.effect is called inside `async with wf.step(...)`")
        name = effects.name(key)
        result: T = await effects.run(
            name, fn, args, kwargs, idempotent=idempotent, reconcile=reconcile
        )
        return result

    def _fence(self) -> Lease | None:
        return self.lease

    def _roll_back(self, state: SharedState, before: tuple[Any, Any]) -> None:
        # A step is all or nothing: a failed or cancelled step leaves the state as it found
        # it, exactly as a crash at that moment would (the retry starts from the same state).
        state._rewind(before)
        self.state = state

    async def clear_checkpoints(self) -> bool:
        """Delete every checkpoint of this workflow; the next run starts fresh."""
        deleted = await self.checkpoint_manager.delete_checkpoints(self.workflow_id)
        self.is_resumed = False
        self.resume_step = 0
        return deleted

    async def __aenter__(self) -> Self:
        manager = self.checkpoint_manager
        if self.lease is None and self._lease_owner is not None:
            self.lease = await manager.acquire_lease(
                self.workflow_id, self._lease_owner, self._lease_ttl
            )
        try:
            await self.try_resume()
        except BaseException:
            await self._release()
            raise
        if self.lease is not None:
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_forever(asyncio.current_task())
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop_renewing()
        if self._lost is not None:
            current = asyncio.current_task()
            cancelled = isinstance(exc, asyncio.CancelledError)
            if cancelled and current is not None and hasattr(current, "uncancel"):
                current.uncancel()  # the cancellation was ours (Python 3.11+ counts them)
            raise LeaseLostError(str(self._lost)) from (exc or self._lost)
        try:
            if self.checkpoint_manager.supports_workflow_records():
                if exc is None:
                    await self._mark(WorkflowStatus.FINISHED)
                elif isinstance(exc, Exception):
                    await self._mark(WorkflowStatus.FAILED)
        finally:
            await self._release()

    async def _mark(self, status: WorkflowStatus) -> None:
        try:
            await self.checkpoint_manager.mark_workflow(self.workflow_id, status, lease=self.lease)
        except Exception:
            logger.exception("workflow %r: could not mark it %s", self.workflow_id, status)
            if status is WorkflowStatus.FINISHED:
                raise

    async def _release(self) -> None:
        lease, self.lease = self.lease, None
        if lease is None:
            return
        # Shielded (we may be leaving because of a cancellation) but bounded: an expired
        # lease frees itself anyway.
        with anyio.move_on_after(_RELEASE_TIMEOUT, shield=True):
            try:
                await self.checkpoint_manager.release_lease(lease)
            except Exception:
                logger.warning("workflow %r: could not release its lease", self.workflow_id)

    async def _renew_forever(self, host: asyncio.Task[Any] | None) -> None:
        assert self.lease is not None
        while True:
            await asyncio.sleep(self._lease_ttl / 3)
            try:
                self.lease = await self.checkpoint_manager.renew_lease(self.lease, self._lease_ttl)
            except LeaseError as exc:
                logger.error("workflow %r: lease lost (%s); cancelling", self.workflow_id, exc)
                self._lost = exc
                if host is not None:
                    host.cancel()
                return
            except Exception:
                # A transient failure (a dropped connection, say): retry at the next tick;
                # fencing still protects the data if the lease expires meanwhile.
                logger.warning("workflow %r: lease renewal failed; retrying", self.workflow_id)

    async def _stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            await asyncio.wait([renewer])
