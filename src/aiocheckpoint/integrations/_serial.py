"""One writer at a time per workflow, in this process and across processes.

The integrations append to a workflow (a session's items, a framework's checkpoints) by
reading its latest step and writing the next one. Two writers doing that at once would
both write the same step, and the second would replace the first. :class:`WriterGate`
makes the read-then-write a critical section:

- in this process, an ``anyio.Lock`` per storage object and workflow id, shared by
  every gate on that storage object;
- across processes, the workflow's lease where the store keeps leases (memory, SQLite,
  PostgreSQL), taken with a short backoff while another owner holds it, and fencing the
  write, so a writer whose lease expired meanwhile is refused with
  :class:`~aiocheckpoint.LeaseLostError` rather than overwriting.

The file store keeps no leases: there the gate takes the store's writer lock
(:meth:`FileCheckpointStorage.writer_lock
<aiocheckpoint.storage.file.FileCheckpointStorage.writer_lock>`, a ``flock`` on a file in
the store's directory), held across the read-then-write and released by the kernel if the
process dies. Another backend without leases gets the in-process lock alone.

The lease creates the workflow's record; the writer of a workflow's first step marks it
FINISHED, so that runner pools (``claim_workflow``) never take it for a workflow to run,
and retention's rules for finished workflows (``finished_ttl``) apply to it.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, cast

import anyio

from ..errors import InvalidArgumentError, LeaseHeldError
from ..leases import Lease, WorkflowStatus, check_ttl
from ..manager import CheckpointManager

if TYPE_CHECKING:
    from ..storage.file import FileCheckpointStorage

__all__ = ["WriterGate", "unique_owner"]

_LOCKS: weakref.WeakKeyDictionary[object, dict[str, anyio.Lock]] = weakref.WeakKeyDictionary()
_FIRST_PAUSE = 0.002
_LONGEST_PAUSE = 0.05


def unique_owner(kind: str) -> str:
    """A lease owner name unique to one gate: host, process and a random part."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _local_lock(storage: object, workflow_id: str) -> anyio.Lock:
    locks = _LOCKS.get(storage)
    if locks is None:
        locks = _LOCKS[storage] = {}
    lock = locks.get(workflow_id)
    if lock is None:
        lock = locks[workflow_id] = anyio.Lock()
    return lock


def _file_store(storage: object) -> FileCheckpointStorage | None:
    """``storage`` if it is a file store (never importing one: it needs ``fcntl``)."""
    module = sys.modules.get("aiocheckpoint.storage.file")
    if module is not None and isinstance(storage, module.FileCheckpointStorage):
        return cast("FileCheckpointStorage", storage)
    return None


class WriterGate:
    """Serializes the writers of workflows of one manager (see the module docstring).

    ``ttl`` is the lease's time to live in seconds: a writer that dies holding it delays
    the others by at most that long. ``wait`` is how long a writer waits for another
    owner's lease before :class:`~aiocheckpoint.LeaseHeldError` is raised.
    """

    def __init__(
        self, manager: CheckpointManager, owner: str, *, ttl: float = 30.0, wait: float = 60.0
    ) -> None:
        if not isinstance(wait, (int, float)) or not wait > 0:
            raise InvalidArgumentError(f"wait must be a positive number, not {wait!r}")
        self._manager = manager
        self._owner = owner
        self._ttl = check_ttl(ttl)
        self._wait = float(wait)
        self._leases = manager.supports_workflow_records()
        self._files = _file_store(manager.storage)

    @asynccontextmanager
    async def writing(self, workflow_id: str) -> AsyncIterator[Lease | None]:
        """Hold ``workflow_id`` for writing; yield the lease that fences the writes (or None)."""
        async with _local_lock(self._manager.storage, workflow_id):
            if self._files is not None:
                async with self._files.writer_lock(workflow_id, wait=self._wait):
                    yield None
                return
            if not self._leases:
                yield None
                return
            lease = await self._acquire(workflow_id)
            try:
                yield lease
            finally:
                with anyio.CancelScope(shield=True):
                    await self._manager.release_lease(lease)

    async def next_step(self, workflow_id: str, lease: Lease | None) -> int:
        """The step after ``workflow_id``'s latest (0 for none), read without decoding it.

        Before a workflow's first step its record is new (first use, or deleted whole since
        by a clear or a sweep, which leaves no step): it is marked FINISHED then, while
        ``lease`` keeps runners from claiming it.
        """
        latest = await self._manager.storage.load(workflow_id)
        if latest is not None:
            return latest.step + 1
        if lease is not None:
            await self._finish(lease)
        return 0

    async def _acquire(self, workflow_id: str) -> Lease:
        deadline = time.monotonic() + self._wait
        pause = _FIRST_PAUSE
        while True:
            try:
                return await self._manager.acquire_lease(workflow_id, self._owner, self._ttl)
            except LeaseHeldError:
                if time.monotonic() >= deadline:
                    raise
            await anyio.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, _LONGEST_PAUSE)

    async def _finish(self, lease: Lease) -> None:
        record = await self._manager.get_workflow(lease.workflow_id)
        if record is None or record.status is not WorkflowStatus.FINISHED:
            status = WorkflowStatus.FINISHED
            await self._manager.mark_workflow(lease.workflow_id, status, lease=lease)
