"""ResumableWorkflow: resume on entry, checkpoint each step on exit."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import anyio
from typing_extensions import Self

from . import history, sleeping
from ._telemetry import annotate, traced
from ._validation import check_step, check_workflow_id
from .control import cancelled_error
from .effects import Reconcile, StepEffects
from .errors import (
    InvalidArgumentError,
    LeaseError,
    LeaseLostError,
    UnknownKeyError,
    WorkflowCancelledError,
)
from .leases import Lease, RetryPolicy, WorkflowRecord, WorkflowStatus, check_ttl
from .manager import CheckpointManager
from .models import AgentStatus, Checkpoint, ExecutionMetrics, utcnow
from .state import SharedState
from .storage.events import EventNote
from .storage.lifecycle import cancel_reason
from .workflow_records import check_owner

__all__ = ["ResumableWorkflow"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_RELEASE_TIMEOUT = 5.0
_DEFAULT_TTL = 30.0
#: How long a runner that lacks a key keeps the workflow's lease (at most its TTL) instead
#: of releasing it: its next claims pass the workflow over, and a runner with the key
#: claims it once the lease expired (``docs/encryption.md``).
UNKNOWN_KEY_HOLD = 5.0


class _Paused(BaseException):
    """Raised by :meth:`ResumableWorkflow.pause` to leave the block; suppressed on exit.

    A ``BaseException``, like ``GeneratorExit``: an ``except Exception`` in the block does
    not swallow it.
    """

    def __init__(self, metadata: dict[str, Any], agent_id: str | None) -> None:
        super().__init__("workflow paused")
        self.metadata = metadata
        self.agent_id = agent_id


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
    ``async with`` block normally marks the workflow FINISHED, unless the last checkpoint
    the block wrote is BLOCKED (then it is PAUSED, as after :meth:`pause`), or RUNNING,
    PENDING or FAILED (then it stays UNFINISHED), or ``steps`` was given and step
    ``steps - 1`` has not completed (an early return: PAUSED, logged). Leaving it with an
    exception records a failed run (:meth:`CheckpointManager.record_failure`: retried by
    ``retry``, or by the pool's policy that came with the lease, else FAILED). A
    cancellation (a deadline, a TaskGroup sibling's failure) leaves it UNFINISHED, and so
    does an :class:`~aiocheckpoint.UnknownKeyError` (a record sealed under a key this
    process lacks: on entry or from a step's effect journal), which writes nothing and
    keeps the lease a few seconds instead of releasing it (``docs/encryption.md``).
    Without a lease, a workflow cancelled while the block runs is found when the block
    ends: its status write is refused and the block raises
    :class:`~aiocheckpoint.WorkflowCancelledError` (``docs/resuming.md``).

    ``metadata`` (a JSON object: tenant, user, kind...) is stored on the workflow's record
    on entry, for :meth:`CheckpointManager.list_workflow_records` to filter on.
    :attr:`resume_input` is what :meth:`CheckpointManager.resume_workflow` delivered to
    this run (None if nothing).

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
        metadata: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        steps: int | None = None,
    ) -> None:
        self.workflow_id = check_workflow_id(workflow_id)
        _check_arguments(checkpoint_manager, initial_state, lease_owner, lease, lease_ttl)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgumentError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidArgumentError("metadata must be a mapping or None")
        self._metadata = None if metadata is None else dict(metadata)
        # Per workflow first, else the pool's (claim_workflow(retry=...)).
        self._retry = retry if retry is not None else (lease.retry if lease else None)
        self._steps = None if steps is None else check_step(steps, "steps")
        self._last_status: AgentStatus | None = None
        self._in_step = False
        #: The input :meth:`CheckpointManager.resume_workflow` delivered to this run.
        self.resume_input: Any = None
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
        #: The application version that wrote the checkpoint resumed from (None if none).
        self.resumed_app_version: str | None = None
        self._effects: StepEffects | None = None
        self._woke = False

    @traced("resume", instance=True)
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
        self.resumed_app_version = point.app_version
        self.is_resumed = True
        self.resume_step = self.current_step = step
        annotate("aiocheckpoint.resume.step", step)
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
        """Checkpoint the current state and metrics as ``step``.

        Raises :class:`~aiocheckpoint.WorkflowCancelledError` when the workflow was
        cancelled (its lease was revoked: the write was refused).
        """
        try:
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
        except LeaseError as exc:
            raise await self._refusal(exc) from exc
        self.current_step = step
        self._last_status = checkpoint.status
        return checkpoint

    async def sleep(self, delay: float | timedelta, *, durable: bool | None = None) -> None:
        """Wait ``delay`` (seconds or a ``timedelta``) between steps, durably if it is long.

        A sleep of more than :data:`~aiocheckpoint.sleeping.SHORT_SLEEP` seconds (or any,
        with ``durable=True``) ends the run like :meth:`pause`: the workflow stays
        UNFINISHED, and runners claim it only once the storage's clock passes the wake-up
        time; the run that does resumes at the next step, where this call returns at once.
        A shorter one (or ``durable=False``) waits here. See :mod:`aiocheckpoint.sleeping`.
        """
        seconds = sleeping.check_delay(delay)
        sleeping.check_outside(self._in_step)
        completed = self._last_status is AgentStatus.COMPLETED
        step = self.current_step + 1 if completed else self.current_step
        manager = self.checkpoint_manager
        if self.is_resumed and step == self.resume_step and not self._woke:
            self._woke = True  # only the sleep this run resumed at was taken already
            if await sleeping.already_slept(manager, self.workflow_id, step):
                return
        if not (seconds > sleeping.SHORT_SLEEP if durable is None else durable):
            await asyncio.sleep(seconds)
            return
        sleeping.sleep_storage(manager)
        await self.checkpoint(step, sleeping.AGENT, AgentStatus.PENDING, sleeping.marker(seconds))
        raise sleeping.Sleeping(seconds)

    async def pause(
        self, reason: str, data: Any = None, *, agent_id: str | None = None
    ) -> NoReturn:
        """Stop here, without finishing the workflow, until it is resumed.

        Writes a BLOCKED checkpoint whose metadata is ``{"pause": {"reason": reason,
        "data": data}}`` (inside a :meth:`step` block: that step, with the state rolled
        back to its start; outside: the step that comes next), then leaves the
        ``async with`` block, which marks the workflow PAUSED. Runners never claim it
        until :meth:`CheckpointManager.resume_workflow`; the next run resumes at the
        paused step, with :attr:`resume_input` set. Call it from the block's own task.
        """
        if not isinstance(reason, str):
            raise InvalidArgumentError(f"reason must be str, not {type(reason).__qualname__}")
        pause = {"pause": {"reason": reason, "data": data}}
        if not self._in_step:
            step = (
                self.current_step + 1
                if self._last_status is AgentStatus.COMPLETED
                else (self.current_step)
            )
            await self.checkpoint(step, agent_id or "workflow", AgentStatus.BLOCKED, pause)
        raise _Paused(pause, agent_id)

    @asynccontextmanager
    async def step(
        self, step: int, agent_id: str, metadata: Mapping[str, Any] | None = None
    ) -> AsyncIterator[Self]:
        """Run one step; checkpoint it when the block exits (see the class docstring).

        Metrics are updated first: ``elapsed_seconds`` grows by the block's duration and
        ``total_steps`` by one for a completed step.
        """
        step, meta = self._step_arguments(step, agent_id, metadata)
        self.current_step = step
        self._effects = StepEffects(self.checkpoint_manager, self.workflow_id, step, self._fence)
        state = self.state
        before = state._mark()
        started = time.monotonic()
        self._in_step = True
        try:
            try:
                yield self
            finally:
                self._effects = None  # effects belong inside the block
        except _Paused as paused:
            self._in_step = False
            self._roll_back(state, before)
            info = {**meta, **paused.metadata}
            await self.checkpoint(step, paused.agent_id or agent_id, AgentStatus.BLOCKED, info)
            raise
        except Exception as exc:
            self.metrics.elapsed_seconds += time.monotonic() - started
            self._roll_back(state, before)
            await self._record_failure(step, agent_id, meta, exc)
            raise
        except BaseException:
            # Cancellation, KeyboardInterrupt: nothing is recorded.
            self._roll_back(state, before)
            raise
        finally:
            self._in_step = False
        self.metrics.elapsed_seconds += time.monotonic() - started
        await self._complete(step, agent_id, meta, state, before)

    def _step_arguments(
        self, step: int, agent_id: str, metadata: Mapping[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        """The step, checked, and a private copy of ``metadata`` holding the caller's values.

        Every argument is checked (and the metadata copied) before the body runs: a bad one
        must fail before the body's side effects, not after them. The check's copy is in the
        stored (tagged) form, and each checkpoint of the step encodes its metadata again, so
        the copy is decoded back: encoded twice, a datetime would read back as its tag.
        """
        manager = self.checkpoint_manager
        _, step, _, meta, _ = manager._check_arguments(
            self.workflow_id, step, agent_id, AgentStatus.COMPLETED, metadata
        )
        # "raw": a TaggedValue (a value of a type this manager does not know) stays one.
        decoded: dict[str, Any] = manager._codec.decode_value(meta, "metadata", "raw")
        return step, decoded

    async def _complete(
        self,
        step: int,
        agent_id: str,
        meta: dict[str, Any],
        state: SharedState,
        before: tuple[Any, Any],
    ) -> None:
        self.metrics.total_steps += 1
        try:
            await self.checkpoint(step, agent_id, AgentStatus.COMPLETED, meta)
        except BaseException as exc:
            # Not stored, so not completed: all or nothing, as for a failing body (a state
            # value that cannot be stored must not stay in the state for the retry).
            self.metrics.total_steps -= 1
            self._roll_back(state, before)
            if isinstance(exc, Exception) and not isinstance(
                exc, (LeaseError, WorkflowCancelledError)
            ):
                await self._record_failure(step, agent_id, meta, exc)
            raise

    async def _record_failure(
        self, step: int, agent_id: str, meta: dict[str, Any], exc: Exception
    ) -> None:
        if isinstance(exc, (LeaseError, UnknownKeyError, WorkflowCancelledError)):
            # Another runner owns the workflow now, or nobody does (cancelled), or this one
            # lacks a key that one with it has: nothing of ours may be written.
            return
        error = {"type": type(exc).__qualname__, "message": str(exc)}
        try:
            await self.checkpoint(step, agent_id, AgentStatus.FAILED, {**meta, "error": error})
        except (LeaseError, WorkflowCancelledError):
            pass  # reported once, when the block exits (see _mark)
        except Exception:
            logger.exception(
                "workflow %r: could not record the failure of step %d", self.workflow_id, step
            )

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
        try:
            result: T = await effects.run(
                name, fn, args, kwargs, idempotent=idempotent, reconcile=reconcile
            )
        except LeaseError as exc:
            raise await self._refusal(exc) from exc
        return result

    async def _refusal(self, exc: LeaseError) -> Exception:
        """What a refused fenced write raises: WorkflowCancelledError if it was cancelled."""
        manager = self.checkpoint_manager
        fields = manager._records.fields
        cancelled = await cancelled_error(manager.storage, self.workflow_id, exc, fields)
        return exc if cancelled is None else cancelled

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
        # One driver per workflow and manager: a second block would run every step again.
        manager._drive(self.workflow_id)
        try:
            if self.lease is None and self._lease_owner is not None:
                self.lease = await manager.acquire_lease(
                    self.workflow_id, self._lease_owner, self._lease_ttl
                )
            await self.try_resume()
            if manager.supports_workflow_records():
                await self._read_record()
        except BaseException as exc:
            try:
                await self._let_go(exc)
            finally:
                manager._undrive(self.workflow_id)
            raise
        if self.lease is not None:
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_forever(asyncio.current_task())
            )
        return self

    async def _read_record(self) -> None:
        """Store the metadata (a write only when given); read the resume input."""
        manager = self.checkpoint_manager
        record: WorkflowRecord | None
        if self._metadata is not None:
            record = await manager.register_workflow(self.workflow_id, metadata=self._metadata)
        else:
            record = await manager.get_workflow(self.workflow_id)
        self.resume_input = None if record is None else record.resume_input
        if record is not None and record.status is WorkflowStatus.CANCELLED:
            raise WorkflowCancelledError(self.workflow_id, cancel_reason(record))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            return await self._leave(exc)
        finally:
            self.checkpoint_manager._undrive(self.workflow_id)

    async def _leave(self, exc: BaseException | None) -> bool:
        """Stop renewing, mark the workflow; True to swallow a pause (and nothing else)."""
        await self._stop_renewing()
        if self._lost is not None:
            current = asyncio.current_task()
            cancelled = isinstance(exc, asyncio.CancelledError)
            if cancelled and current is not None and hasattr(current, "uncancel"):
                current.uncancel()  # the cancellation was ours (Python 3.11+ counts them)
            await self._release()
            refusal = await self._refusal(self._lost)
            if isinstance(refusal, WorkflowCancelledError):
                raise refusal from (exc or self._lost)
            raise LeaseLostError(str(self._lost)) from (exc or self._lost)
        if isinstance(exc, WorkflowCancelledError):
            await self._release()  # revoked: ignored, as a stale lease is
            return False
        paused = isinstance(exc, (_Paused, sleeping.Sleeping))
        try:
            if isinstance(exc, sleeping.Sleeping):
                await self._mark(WorkflowStatus.UNFINISHED, sleep=exc.seconds)
            elif self.checkpoint_manager.supports_workflow_records():
                if exc is None or paused:
                    await self._mark(self._exit_status(), note=await self._pause_note(exc))
                elif isinstance(exc, UnknownKeyError):
                    pass  # not the workflow's failure: left UNFINISHED for a runner with the key
                elif isinstance(exc, Exception):
                    await self._mark(WorkflowStatus.FAILED, exc)
        finally:
            await self._let_go(exc)
        return paused

    def _exit_status(self) -> WorkflowStatus:
        """What a normal exit makes of the workflow (see the class docstring)."""
        last = self._last_status
        if last is AgentStatus.BLOCKED:
            return WorkflowStatus.PAUSED
        if last not in (None, AgentStatus.COMPLETED):
            return WorkflowStatus.UNFINISHED
        done = self.current_step + 1 if last is not None else self.resume_step
        if self._steps is not None and done < self._steps:
            logger.warning(
                "workflow %r: the block returned before step %d completed; marking it paused",
                self.workflow_id,
                self._steps - 1,
            )
            return WorkflowStatus.PAUSED
        return WorkflowStatus.FINISHED

    async def _pause_note(self, exc: BaseException | None) -> EventNote | None:
        """The ``paused`` event of a pause (its reason and data), where events are kept."""
        if not isinstance(exc, _Paused) or not history.keeps_events(
            self.checkpoint_manager.storage
        ):
            return None
        pause = exc.metadata["pause"]
        value, _ = self.checkpoint_manager._codec.encode_value(pause["data"], "pause data")
        fields = self.checkpoint_manager._records.fields
        data = json.dumps(value)
        return await history.pause_note(fields, self.workflow_id, pause["reason"], data)

    async def _mark(
        self,
        status: WorkflowStatus,
        error: Exception | None = None,
        *,
        note: EventNote | None = None,
        sleep: float | None = None,
    ) -> None:
        manager = self.checkpoint_manager
        try:
            if sleep is not None:
                storage = sleeping.sleep_storage(manager)
                await sleeping.sleep_workflow(storage, self.workflow_id, sleep, self.lease)
            elif note is not None and status is WorkflowStatus.PAUSED:
                storage = history.event_storage(manager.storage)
                await history.mark_with_note(storage, self.workflow_id, status, self.lease, note)
            elif error is None:
                await manager.mark_workflow(self.workflow_id, status, lease=self.lease)
            else:
                await manager.record_failure(
                    self.workflow_id, error, retry=self._retry, lease=self.lease
                )
        except WorkflowCancelledError as exc:
            # Without a lease nothing was revoked: the status write met the cancel itself.
            self._cancelled_at_exit(WorkflowCancelledError(self.workflow_id, exc.reason), error)
        except LeaseError as exc:
            refusal = await self._refusal(exc)
            if isinstance(refusal, WorkflowCancelledError):
                self._cancelled_at_exit(refusal, error)
                return
            # Expected when a runner stalls past its lease: one line, no traceback.
            logger.warning(
                "workflow %r: lease lost (%s); another runner drives it now", self.workflow_id, exc
            )
            if status is WorkflowStatus.FINISHED:
                raise
        except Exception:
            logger.exception("workflow %r: could not mark it %s", self.workflow_id, status)
            if status is WorkflowStatus.FINISHED:
                raise

    def _cancelled_at_exit(
        self, cancelled: WorkflowCancelledError, error: Exception | None
    ) -> None:
        """Raise ``cancelled``, unless the block raised ``error`` (that one propagates)."""
        if error is None:
            raise cancelled

    async def _let_go(self, exc: BaseException | None) -> None:
        """Release the lease; after an UnknownKeyError, keep it a few seconds instead.

        Released, the workflow would be the oldest claimable one again, and this runner's
        next claim would hand it straight back: a loop that never reaches the workflows it
        can run. Kept for :data:`UNKNOWN_KEY_HOLD` seconds (renewed to that, not released,
        no attempt counted), it is passed over until the lease expires; then any runner,
        one with the key, claims it.
        """
        lease = self.lease
        if not isinstance(exc, UnknownKeyError) or lease is None:
            await self._release()
            return
        self.lease = None
        hold = min(UNKNOWN_KEY_HOLD, self._lease_ttl)
        with anyio.move_on_after(_RELEASE_TIMEOUT, shield=True):
            try:
                await self.checkpoint_manager.renew_lease(lease, hold)
            except Exception:
                logger.warning("workflow %r: could not hold its lease", self.workflow_id)

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
                logger.warning("workflow %r: lease lost (%s); cancelling", self.workflow_id, exc)
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


def _check_arguments(
    manager: Any, initial_state: Any, lease_owner: Any, lease: Any, lease_ttl: Any
) -> None:
    """Refuse a bad constructor argument with InvalidArgumentError, before anything runs."""
    if not isinstance(manager, CheckpointManager):
        raise InvalidArgumentError(
            f"checkpoint_manager must be a CheckpointManager, not {type(manager).__qualname__}"
        )
    if initial_state is not None and not isinstance(initial_state, Mapping):
        raise InvalidArgumentError(
            f"initial_state must be a mapping or None, not {type(initial_state).__qualname__}"
        )
    if lease is not None and not isinstance(lease, Lease):
        raise InvalidArgumentError(f"lease must be a Lease or None, not {type(lease).__qualname__}")
    if lease_owner is not None:
        if lease is not None:
            raise InvalidArgumentError("pass lease_owner or lease, not both")
        check_owner(lease_owner)
    if lease_ttl is not None:
        check_ttl(lease_ttl)
