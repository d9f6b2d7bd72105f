"""``AioCheckpointStorage``: Agent Framework workflow checkpoints in aiocheckpoint's stores.

Each workflow name is one workflow (``prefix + workflow_name``); each saved
``WorkflowCheckpoint`` is one checkpoint of it, at the step after the latest, so the steps
follow the order of the saves and the framework's ``previous_checkpoint_id`` chain is kept
as the framework wrote it. The manager's ``max_checkpoints`` keeps the newest N of each
workflow name (the oldest kept then names a predecessor that is gone, which ``load``
reports as missing), a retention policy's ``finished_ttl`` drops a workflow name idle that
long, and the manager's encryption seals every checkpoint.

The checkpoint is written by :mod:`.encoding` (no pickle): a value it cannot store is
refused with :class:`~aiocheckpoint.CheckpointSerializationError` before anything is
written.

``load`` and ``delete`` get only a checkpoint id: where it lives is remembered for the ids
this object saved or read (the newest 4096), and otherwise found by reading the workflows
under ``prefix``, newest checkpoints first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Final

from agent_framework import WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from ..._validation import check_workflow_id
from ...codec import View, to_storable
from ...errors import InvalidArgumentError
from ...manager import CheckpointManager
from ...models import AgentStatus, Checkpoint
from ...storage.base import StoredCheckpoint
from .._serial import WriterGate, unique_owner
from .encoding import RESERVED_PREFIX, Encoding, Where

__all__ = ["AioCheckpointStorage"]

_AGENT: Final = "agent-framework"
_REMEMBERED: Final = 4096
_PAGE: Final = 64
_ID_KEY: Final = "checkpoint_id"


class AioCheckpointStorage:
    """An Agent Framework ``CheckpointStorage`` over a :class:`~aiocheckpoint.CheckpointManager`.

    Pass it as ``checkpoint_storage=`` to ``WorkflowBuilder`` or ``workflow.run``. Values in
    a checkpoint are stored as the manager stores state (``docs/serialization.md``): the
    standard types and the classes of the manager's ``types=`` registry; the framework's
    messages and request events are written by this storage. Saves of one workflow name
    are serialized like :class:`~aiocheckpoint.integrations.openai_agents.AioCheckpointSession`'s
    writes (``lease_ttl``, ``lock_wait``).
    """

    def __init__(
        self,
        manager: CheckpointManager,
        *,
        prefix: str = "agent-framework/",
        lease_ttl: float = 30.0,
        lock_wait: float = 60.0,
    ) -> None:
        if not isinstance(manager, CheckpointManager):
            raise InvalidArgumentError(f"manager must be a CheckpointManager, not {manager!r}")
        if not isinstance(prefix, str):
            raise InvalidArgumentError(f"prefix must be a str, not {prefix!r}")
        types = manager.types
        if types is not None and any(name.startswith(RESERVED_PREFIX) for name in types.names):
            raise InvalidArgumentError(
                f"the manager's TypeRegistry uses a name starting {RESERVED_PREFIX!r}, "
                "which this storage reserves for the framework's objects"
            )
        self._manager = manager
        self._encoding = Encoding(types)
        self._prefix = prefix
        self._gate = WriterGate(manager, unique_owner(_AGENT), ttl=lease_ttl, wait=lock_wait)
        self._where: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def workflow_id(self, workflow_name: str) -> str:
        """The aiocheckpoint workflow that keeps ``workflow_name``'s checkpoints."""
        if not isinstance(workflow_name, str) or not workflow_name:
            raise InvalidArgumentError(f"workflow_name must be a non-empty str: {workflow_name!r}")
        return check_workflow_id(self._prefix + workflow_name)

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store a copy of ``checkpoint`` durably; return its id.

        Saving an id this object saved or read before replaces that checkpoint in place.
        """
        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise InvalidArgumentError(f"not a WorkflowCheckpoint: {type(checkpoint).__name__}")
        workflow_id = self.workflow_id(checkpoint.workflow_name)
        checkpoint_id = checkpoint.checkpoint_id
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise InvalidArgumentError(f"checkpoint_id must be a non-empty str: {checkpoint_id!r}")
        state = self._encoding.encode(checkpoint)
        # Refused here, before the lease (which makes the workflow's record) is taken.
        to_storable(state, "checkpoint", self._encoding.types)
        async with self._gate.writing(workflow_id) as lease:
            step = self._known_step(workflow_id, checkpoint_id)
            if step is None:
                step = await self._gate.next_step(workflow_id, lease)
            await self._manager.create_checkpoint(
                workflow_id,
                step,
                _AGENT,
                AgentStatus.COMPLETED,
                state,
                metadata={_ID_KEY: checkpoint_id},
                lease=lease,
            )
        self._remember(checkpoint_id, workflow_id, step)
        return checkpoint_id

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """The checkpoint ``checkpoint_id``; ``WorkflowCheckpointException`` if absent.

        A record that fails verification raises
        :class:`~aiocheckpoint.CheckpointCorruptedError` (a
        :class:`~aiocheckpoint.DecryptionError` when sealed) and is never decoded.
        """
        found = await self._find(checkpoint_id)
        if found is None:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        return found[0]

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """Every checkpoint of ``workflow_name``, in the order they were saved."""
        workflow_id = self.workflow_id(workflow_name)
        return [self._decoded(record) for record in await self._records(workflow_id)]

    async def delete(self, checkpoint_id: str) -> bool:
        """Delete ``checkpoint_id``; whether it existed."""
        found = await self._find(checkpoint_id)
        if found is None:
            return False
        self._where.pop(checkpoint_id, None)
        _, workflow_id, step = found
        return await self._manager.delete_checkpoints(workflow_id, step)

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """The checkpoint of ``workflow_name`` saved last, or None."""
        workflow_id = self.workflow_id(workflow_name)
        stored = await self._manager.storage.load(workflow_id)
        return None if stored is None else self._decoded(await self._read(workflow_id, stored))

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """The ids of ``workflow_name``'s checkpoints, in the order they were saved."""
        workflow_id = self.workflow_id(workflow_name)
        return [_stored_id(record) for record in await self._records(workflow_id)]

    async def _records(self, workflow_id: str) -> list[Checkpoint]:
        return [record async for record in self._iter(workflow_id)]

    async def _iter(
        self, workflow_id: str, *, descending: bool = False, view: View = "raw"
    ) -> AsyncIterator[Checkpoint]:
        """The workflow's records (verified, decoded in ``view``), a page at a time."""
        cursor: int | None = None
        while True:
            bound = {"before": cursor} if descending else {"after": cursor}
            page = await self._manager.storage.scan(
                workflow_id, limit=_PAGE, descending=descending, **bound
            )
            for stored in page:
                yield await self._read(workflow_id, stored, view)
            if len(page) < _PAGE:
                return
            cursor = page[-1].step

    async def _read(
        self, workflow_id: str, stored: StoredCheckpoint, view: View = "raw"
    ) -> Checkpoint:
        record = await self._manager.decode_record(workflow_id, stored, view=view)
        self._remember(_stored_id(record), workflow_id, record.step)
        return record

    def _decoded(self, record: Checkpoint) -> WorkflowCheckpoint:
        where = Where(record.workflow_id, record.step)
        checkpoint = self._encoding.decode(record.state_snapshot.data, where)
        if checkpoint.checkpoint_id != _stored_id(record):
            raise where.corrupted("the checkpoint's id is not the one its record names")
        return checkpoint

    def _remember(self, checkpoint_id: str, workflow_id: str, step: int) -> None:
        self._where[checkpoint_id] = (workflow_id, step)
        self._where.move_to_end(checkpoint_id)
        if len(self._where) > _REMEMBERED:
            self._where.popitem(last=False)

    def _known_step(self, workflow_id: str, checkpoint_id: str) -> int | None:
        where = self._where.get(checkpoint_id)
        return where[1] if where is not None and where[0] == workflow_id else None

    async def _find(self, checkpoint_id: str) -> tuple[WorkflowCheckpoint, str, int] | None:
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise InvalidArgumentError(f"checkpoint_id must be a non-empty str: {checkpoint_id!r}")
        where = self._where.get(checkpoint_id)
        if where is not None:
            found = await self._at(checkpoint_id, *where)
            if found is not None:
                return found
            self._where.pop(checkpoint_id, None)
        return await self._search(checkpoint_id)

    async def _search(self, checkpoint_id: str) -> tuple[WorkflowCheckpoint, str, int] | None:
        """Read the workflows under the prefix, newest records first, for ``checkpoint_id``."""
        for workflow_id in await self._manager.storage.list_workflows():
            if not workflow_id.startswith(self._prefix):
                continue
            # The ids are in the records' metadata: values are left in their stored form
            # (cheaper) until the one asked for is found, and read again then.
            async for record in self._iter(workflow_id, descending=True, view="stored"):
                if _stored_id(record) == checkpoint_id:
                    found = await self._at(checkpoint_id, workflow_id, record.step)
                    if found is not None:
                        return found
        return None

    async def _at(
        self, checkpoint_id: str, workflow_id: str, step: int
    ) -> tuple[WorkflowCheckpoint, str, int] | None:
        """The checkpoint at ``step`` if it is still ``checkpoint_id``."""
        stored = await self._manager.storage.load(workflow_id, step)
        if stored is not None:
            record = await self._read(workflow_id, stored)
            if _stored_id(record) == checkpoint_id:
                return self._decoded(record), workflow_id, step
        return None


def _stored_id(record: Checkpoint) -> str:
    """The checkpoint id a record was saved under (its metadata)."""
    stored = record.metadata.get(_ID_KEY)
    if not isinstance(stored, str):
        where = Where(record.workflow_id, record.step)
        raise where.corrupted("the record names no Agent Framework checkpoint id")
    return stored
