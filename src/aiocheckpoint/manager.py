"""CheckpointManager: the async API over any :class:`CheckpointStorage`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

from typing_extensions import Self

from ._validation import (
    check_limit,
    check_optional_step,
    check_step,
    check_workflow_id,
)
from .errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    InvalidArgumentError,
    StorageClosedError,
)
from .models import AgentStatus, Checkpoint, ExecutionMetrics, StateSnapshot, utcnow
from .serde import decode_checkpoint, encode_checkpoint, to_storable
from .state import SharedState
from .storage.base import CheckpointStorage, StoredCheckpoint
from .storage.memory import InMemoryCheckpointStorage

__all__ = ["CheckpointManager", "ResumePoint"]

logger = logging.getLogger("aiocheckpoint")

#: ``(resume_step, state_snapshot, metrics)`` as returned by ``get_resume_point``.
ResumePoint = tuple[int, StateSnapshot, ExecutionMetrics]

_PAGE = 100


def _status(status: Any) -> AgentStatus:
    try:
        return AgentStatus(status)
    except ValueError:
        allowed = ", ".join(s.value for s in AgentStatus)
        raise InvalidArgumentError(f"status must be one of {allowed}; got {status!r}") from None


class CheckpointManager:
    """Creates, reads and prunes checkpoints in a storage backend.

    The manager owns everything a backend should not have to get right on its own: input
    validation, encoding with a checksum, decoding and verification, and the retention
    policy (``max_checkpoints`` keeps the newest N steps of each workflow; older ones are
    deleted when a checkpoint is written). ``storage`` defaults to
    :class:`~aiocheckpoint.InMemoryCheckpointStorage`.

    Use it as ``async with CheckpointManager(storage) as manager:`` or call :meth:`close`.
    """

    def __init__(
        self, storage: CheckpointStorage | None = None, *, max_checkpoints: int | None = None
    ) -> None:
        if max_checkpoints is not None and (
            type(max_checkpoints) is not int or max_checkpoints < 1
        ):
            raise InvalidArgumentError(
                f"max_checkpoints must be an int >= 1 or None, got {max_checkpoints!r}"
            )
        self._storage: CheckpointStorage = (
            storage if storage is not None else InMemoryCheckpointStorage()
        )
        self._max_checkpoints = max_checkpoints
        self._closed = False

    @property
    def storage(self) -> CheckpointStorage:
        """The storage backend."""
        return self._storage

    @property
    def max_checkpoints(self) -> int | None:
        """How many checkpoints per workflow are kept (None: all)."""
        return self._max_checkpoints

    async def create_checkpoint(
        self,
        workflow_id: str,
        step: int,
        agent_id: str,
        status: AgentStatus | str,
        state: SharedState | StateSnapshot | Mapping[str, Any],
        metrics: ExecutionMetrics | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """Store a checkpoint and return it once it is durable.

        ``state`` is copied: later changes by the caller never alter what was stored.
        Writing a step that already exists replaces it. Invalid input raises a
        :class:`~aiocheckpoint.CheckpointError` subclass before anything is written.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        if not isinstance(agent_id, str):
            raise InvalidArgumentError(f"agent_id must be str, not {type(agent_id).__qualname__}")
        checkpoint = Checkpoint.model_construct(
            workflow_id=workflow_id,
            step=step,
            agent_id=agent_id,
            status=_status(status),
            state_snapshot=_snapshot_of(state),
            metrics=_metrics_copy(metrics),
            timestamp=utcnow(),
            metadata=_metadata_of(metadata),
        )
        data = encode_checkpoint(checkpoint)
        await self._storage.save(workflow_id, step, data, keep_last=self._max_checkpoints)
        return checkpoint

    async def get_checkpoint(self, workflow_id: str, step: int) -> Checkpoint:
        """Return one step's checkpoint; raise :class:`CheckpointNotFoundError` if absent."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        stored = await self._storage.load(workflow_id, step)
        if stored is None:
            raise CheckpointNotFoundError(workflow_id, step)
        return self._decode(workflow_id, stored)

    async def get_latest_checkpoint(self, workflow_id: str) -> Checkpoint | None:
        """Return the checkpoint with the highest step, or None if the workflow has none.

        A corrupted latest checkpoint raises :class:`CheckpointCorruptedError`; use
        :meth:`get_resume_point` to fall back to the newest one that verifies.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        stored = await self._storage.load(workflow_id)
        return None if stored is None else self._decode(workflow_id, stored)

    async def has_checkpoint(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or, when ``step`` is None, any step) of the workflow is stored."""
        self._check_open()
        return await self._storage.exists(check_workflow_id(workflow_id), check_optional_step(step))

    async def list_checkpoints(
        self,
        workflow_id: str,
        *,
        limit: int | None = None,
        after: int | None = None,
        before: int | None = None,
        descending: bool = False,
    ) -> list[Checkpoint]:
        """Return checkpoints ordered by step, optionally one page of them.

        ``after``/``before`` bound the steps (exclusive); ``limit`` caps the count, taken
        from the low end (or the high end with ``descending=True``). For long histories
        prefer :meth:`iter_checkpoints`, which pages through the storage.
        """
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        records = await self._storage.scan(
            workflow_id,
            after=check_optional_step(after, "after"),
            before=check_optional_step(before, "before"),
            limit=check_limit(limit),
            descending=descending,
        )
        return [self._decode(workflow_id, record) for record in records]

    async def iter_checkpoints(
        self, workflow_id: str, *, page_size: int = _PAGE, descending: bool = False
    ) -> AsyncIterator[Checkpoint]:
        """Yield every checkpoint of a workflow in step order, ``page_size`` at a time."""
        page_size = check_limit(page_size) or _PAGE
        cursor: int | None = None
        while True:
            bound = {"before": cursor} if descending else {"after": cursor}
            page = await self.list_checkpoints(
                workflow_id, limit=page_size, descending=descending, **bound
            )
            for checkpoint in page:
                yield checkpoint
            if len(page) < page_size:
                return
            cursor = page[-1].step

    async def delete_checkpoints(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or every checkpoint of the workflow; return whether any existed."""
        self._check_open()
        return await self._storage.delete(check_workflow_id(workflow_id), check_optional_step(step))

    async def get_resume_point(self, workflow_id: str) -> ResumePoint | None:
        """Where to resume a workflow: ``(step, state_snapshot, metrics)``, or None.

        The step is the latest checkpoint's step + 1 when it is COMPLETED, and the same step
        otherwise (it has to run again). If the latest checkpoint is corrupted, the newest
        one that verifies is used instead and a warning is logged; if none verifies, the
        :class:`CheckpointCorruptedError` of the latest is raised.
        """
        checkpoint = await self._latest_valid(workflow_id)
        if checkpoint is None:
            return None
        step = (
            checkpoint.step + 1 if checkpoint.status is AgentStatus.COMPLETED else checkpoint.step
        )
        return step, checkpoint.state_snapshot, checkpoint.metrics

    async def list_workflows(self) -> list[str]:
        """Every workflow id that has at least one checkpoint, sorted."""
        self._check_open()
        return await self._storage.list_workflows()

    async def close(self) -> None:
        """Close the storage. Calling it again does nothing."""
        if not self._closed:
            self._closed = True
            await self._storage.close()

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _latest_valid(self, workflow_id: str) -> Checkpoint | None:
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        stored = await self._storage.load(workflow_id)
        if stored is None:
            return None
        try:
            return self._decode(workflow_id, stored)
        except CheckpointCorruptedError as first:
            cursor = stored.step
            while True:
                older = await self._storage.scan(
                    workflow_id, before=cursor, limit=_PAGE, descending=True
                )
                for record in older:
                    try:
                        checkpoint = self._decode(workflow_id, record)
                    except CheckpointCorruptedError:
                        continue
                    logger.warning(
                        "workflow %r: latest checkpoint (step %d) is corrupted (%s); "
                        "resuming from step %d, the newest that verifies",
                        workflow_id,
                        stored.step,
                        first.reason,
                        checkpoint.step,
                    )
                    return checkpoint
                if len(older) < _PAGE:
                    raise
                cursor = older[-1].step

    def _decode(self, workflow_id: str, stored: StoredCheckpoint) -> Checkpoint:
        return decode_checkpoint(stored.data, workflow_id=workflow_id, step=stored.step)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("CheckpointManager is closed")


def _snapshot_of(state: SharedState | StateSnapshot | Mapping[str, Any]) -> StateSnapshot:
    if isinstance(state, SharedState):
        data, version = state._peek()
        return StateSnapshot.model_construct(data=to_storable(data), version=version, metadata={})
    if isinstance(state, StateSnapshot):
        return StateSnapshot.model_construct(
            data=to_storable(state.data),
            version=state.version,
            metadata=to_storable(state.metadata, "state.metadata"),
        )
    if isinstance(state, Mapping):
        return StateSnapshot.model_construct(
            data=to_storable(dict(state)),
            version=StateSnapshot().version,
            metadata={},
        )
    raise InvalidArgumentError(
        f"state must be a SharedState, a StateSnapshot or a dict, not {type(state).__qualname__}"
    )


def _metadata_of(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentError(
            f"metadata must be a mapping or None, not {type(metadata).__qualname__}"
        )
    storable: dict[str, Any] = to_storable(dict(metadata), "metadata")
    return storable


def _metrics_copy(metrics: ExecutionMetrics | None) -> ExecutionMetrics:
    if metrics is None:
        return ExecutionMetrics()
    if not isinstance(metrics, ExecutionMetrics):
        raise InvalidArgumentError(
            f"metrics must be ExecutionMetrics or None, not {type(metrics).__qualname__}"
        )
    return metrics.model_copy(deep=True)
