"""ResumableWorkflow: resume on entry, checkpoint each step on exit."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

from typing_extensions import Self

from ._validation import check_step, check_workflow_id
from .manager import CheckpointManager
from .models import AgentStatus, Checkpoint, ExecutionMetrics, utcnow
from .state import SharedState

__all__ = ["ResumableWorkflow"]

logger = logging.getLogger("aiocheckpoint")


class ResumableWorkflow:
    """A workflow run that picks up where the last run stopped.

    ``async with ResumableWorkflow(workflow_id, manager) as wf:`` resumes on entry (see
    :meth:`try_resume`). Inside, ``async with wf.step(n, agent_id="..."):`` checkpoints the
    step when its block exits: COMPLETED on a normal exit, FAILED (with the error's type and
    message in the metadata) when it raises, after which the exception propagates unchanged.

    A *cancelled* step records nothing: the last checkpoint written stays the resume point,
    so the step runs again on resume. (Cancellation is not a failure of the step; recording
    it as FAILED would be a lie, and recording it as COMPLETED would skip unfinished work.)

    Skip finished steps with :meth:`is_completed`::

        for n, agent in enumerate(agents):
            if wf.is_completed(n):
                continue
            async with wf.step(n, agent_id=agent.name):
                await agent.run(wf.state)
    """

    def __init__(
        self,
        workflow_id: str,
        checkpoint_manager: CheckpointManager,
        initial_state: Mapping[str, Any] | None = None,
    ) -> None:
        self.workflow_id = check_workflow_id(workflow_id)
        self.checkpoint_manager = checkpoint_manager
        self.state = SharedState(initial_state)
        self.metrics = ExecutionMetrics(start_time=utcnow())
        self.is_resumed = False
        self.resume_step = 0
        self.current_step = 0

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
        started = time.monotonic()
        try:
            yield self
        except Exception as exc:
            self.metrics.elapsed_seconds += time.monotonic() - started
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
        # BaseException (cancellation, KeyboardInterrupt) passes through: nothing is recorded.
        self.metrics.elapsed_seconds += time.monotonic() - started
        self.metrics.total_steps += 1
        await self.checkpoint(step, agent_id, AgentStatus.COMPLETED, metadata)

    async def clear_checkpoints(self) -> bool:
        """Delete every checkpoint of this workflow; the next run starts fresh."""
        deleted = await self.checkpoint_manager.delete_checkpoints(self.workflow_id)
        self.is_resumed = False
        self.resume_step = 0
        return deleted

    async def __aenter__(self) -> Self:
        await self.try_resume()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None
