"""``AioCheckpointStorage``: Agent Framework workflow checkpoints in aiocheckpoint's stores.

Each workflow name is one workflow (``prefix + workflow_name``); each saved
``WorkflowCheckpoint`` is one checkpoint of it, at the step after the latest, so the steps
follow the order of the saves and the framework's ``previous_checkpoint_id`` chain is kept
as the framework wrote it. The manager's ``max_checkpoints`` keeps the newest N of each
workflow name (the oldest kept then names a predecessor that is gone, which ``load``
reports as missing), and its encryption seals every one.

``load`` and ``delete`` get only a checkpoint id: where it lives is remembered for the ids
this object saved or listed (the newest 4096), and otherwise found by reading the
workflows under ``prefix``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

from agent_framework import WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from ..._validation import check_workflow_id
from ...errors import CheckpointCorruptedError, InvalidArgumentError
from ...manager import CheckpointManager
from ...models import AgentStatus, Checkpoint
from .._serial import WriterGate, unique_owner
from .encoding import decode, encode

__all__ = ["AioCheckpointStorage"]

_AGENT: Final = "agent-framework"
_REMEMBERED: Final = 4096


class AioCheckpointStorage:
    """An Agent Framework ``CheckpointStorage`` over a :class:`~aiocheckpoint.CheckpointManager`.

    Pass it as ``checkpoint_storage=`` to ``WorkflowBuilder`` or ``workflow.run``.
    ``allowed_checkpoint_types`` is the framework's list of ``"module:qualname"`` types
    (besides its own safe set) that a checkpoint may hold, as for its
    ``FileCheckpointStorage``. Saves of one workflow name are serialized like
    :class:`~aiocheckpoint.integrations.openai_agents.AioCheckpointSession`'s writes.
    """

    def __init__(
        self,
        manager: CheckpointManager,
        *,
        allowed_checkpoint_types: Sequence[str] = (),
        prefix: str = "agent-framework/",
        lease_ttl: float = 30.0,
        lock_wait: float = 60.0,
    ) -> None:
        if not isinstance(manager, CheckpointManager):
            raise InvalidArgumentError(f"manager must be a CheckpointManager, not {manager!r}")
        if isinstance(allowed_checkpoint_types, str):
            raise InvalidArgumentError("allowed_checkpoint_types must be a list of str, not a str")
        self._manager = manager
        self._allowed = frozenset(allowed_checkpoint_types)
        self._prefix = prefix
        self._gate = WriterGate(manager, unique_owner(_AGENT), ttl=lease_ttl, wait=lock_wait)
        self._where: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def workflow_id(self, workflow_name: str) -> str:
        """The aiocheckpoint workflow that keeps ``workflow_name``'s checkpoints."""
        if not isinstance(workflow_name, str) or not workflow_name:
            raise InvalidArgumentError(f"workflow_name must be a non-empty str: {workflow_name!r}")
        return check_workflow_id(self._prefix + workflow_name)

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store a copy of ``checkpoint`` durably; return its id."""
        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise InvalidArgumentError(f"not a WorkflowCheckpoint: {type(checkpoint).__name__}")
        workflow_id = self.workflow_id(checkpoint.workflow_name)
        encoded = encode(checkpoint, self._allowed)
        async with self._gate.writing(workflow_id) as lease:
            step = self._known_step(workflow_id, checkpoint.checkpoint_id)
            if step is None:
                step = await self._gate.next_step(workflow_id, lease)
            await self._manager.create_checkpoint(
                workflow_id,
                step,
                _AGENT,
                AgentStatus.COMPLETED,
                {"checkpoint": encoded},
                metadata={"checkpoint_id": checkpoint.checkpoint_id},
                lease=lease,
            )
        self._remember(checkpoint.checkpoint_id, workflow_id, step)
        return checkpoint.checkpoint_id

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """The checkpoint ``checkpoint_id``; ``WorkflowCheckpointException`` if absent.

        A record that fails verification raises
        :class:`~aiocheckpoint.CheckpointCorruptedError` and is never decoded.
        """
        found = await self._find(checkpoint_id)
        if found is None:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        return found

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """Every checkpoint of ``workflow_name``, in the order they were saved."""
        workflow_id = self.workflow_id(workflow_name)
        return [
            self._checkpoint(record) async for record in self._manager.iter_checkpoints(workflow_id)
        ]

    async def delete(self, checkpoint_id: str) -> bool:
        """Delete ``checkpoint_id``; whether it existed."""
        where = await self._locate(checkpoint_id)
        if where is None:
            return False
        self._where.pop(checkpoint_id, None)
        return await self._manager.delete_checkpoints(*where)

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """The checkpoint of ``workflow_name`` saved last, or None."""
        workflow_id = self.workflow_id(workflow_name)
        record = await self._manager.get_latest_checkpoint(workflow_id)
        return None if record is None else self._checkpoint(record)

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """The ids of ``workflow_name``'s checkpoints, in the order they were saved."""
        return [c.checkpoint_id for c in await self.list_checkpoints(workflow_name=workflow_name)]

    def _checkpoint(self, record: Checkpoint) -> WorkflowCheckpoint:
        encoded: Any = record.state_snapshot.data.get("checkpoint")
        if not isinstance(encoded, dict):
            raise CheckpointCorruptedError(
                "the record holds no workflow checkpoint",
                workflow_id=record.workflow_id,
                step=record.step,
            )
        checkpoint = decode(encoded, self._allowed)
        self._remember(checkpoint.checkpoint_id, record.workflow_id, record.step)
        return checkpoint

    def _remember(self, checkpoint_id: str, workflow_id: str, step: int) -> None:
        self._where[checkpoint_id] = (workflow_id, step)
        self._where.move_to_end(checkpoint_id)
        if len(self._where) > _REMEMBERED:
            self._where.popitem(last=False)

    def _known_step(self, workflow_id: str, checkpoint_id: str) -> int | None:
        where = self._where.get(checkpoint_id)
        return where[1] if where is not None and where[0] == workflow_id else None

    async def _locate(self, checkpoint_id: str) -> tuple[str, int] | None:
        found = await self._find(checkpoint_id)
        return None if found is None else self._where.get(checkpoint_id)

    async def _find(self, checkpoint_id: str) -> WorkflowCheckpoint | None:
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise InvalidArgumentError(f"checkpoint_id must be a non-empty str: {checkpoint_id!r}")
        where = self._where.get(checkpoint_id)
        if where is not None:
            found = await self._at(checkpoint_id, *where)
            if found is not None:
                return found
            self._where.pop(checkpoint_id, None)
        return await self._search(checkpoint_id)

    async def _at(
        self, checkpoint_id: str, workflow_id: str, step: int
    ) -> WorkflowCheckpoint | None:
        if not await self._manager.has_checkpoint(workflow_id, step):
            return None
        checkpoint = self._checkpoint(await self._manager.get_checkpoint(workflow_id, step))
        return checkpoint if checkpoint.checkpoint_id == checkpoint_id else None

    async def _search(self, checkpoint_id: str) -> WorkflowCheckpoint | None:
        """Read the workflows under the prefix, newest records first, for ``checkpoint_id``."""
        for workflow_id in await self._manager.list_workflows():
            if not workflow_id.startswith(self._prefix):
                continue
            async for record in self._manager.iter_checkpoints(workflow_id, descending=True):
                if record.metadata.get("checkpoint_id") == checkpoint_id:
                    return self._checkpoint(record)
        return None
