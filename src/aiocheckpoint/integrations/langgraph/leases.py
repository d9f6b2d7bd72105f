"""The single-writer option: one lease, with fencing, per thread namespace.

A saver created with ``single_writer=True`` takes the lease of each namespace it writes
(renewing it when half its time has passed) and fences every write with it, in the same
transaction as the write. A second saver writing the same thread meanwhile gets
:class:`~aiocheckpoint.LeaseHeldError` on its first write, or
:class:`~aiocheckpoint.LeaseLostError` if it had the lease and lost it; the thread's
history is never interleaved.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import anyio

from ...errors import LeaseHeldError, UnsupportedOperationError
from ...leases import Lease, check_ttl
from ...manager import CheckpointManager

__all__ = ["ThreadLeases", "default_owner"]


def default_owner() -> str:
    """An owner name unique to this saver: host, process and a random part."""
    return f"langgraph@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ThreadLeases:
    """The leases one saver holds, by workflow id."""

    def __init__(self, manager: CheckpointManager, owner: str, ttl: float) -> None:
        if not manager.supports_workflow_records():
            raise UnsupportedOperationError(
                f"single_writer needs a storage with leases; "
                f"{type(manager.storage).__name__} has none"
            )
        self._manager = manager
        self._owner = owner
        self._ttl = check_ttl(ttl)
        self._held: dict[str, tuple[Lease, float]] = {}
        # Taking or renewing a lease again bumps its token: a checkpoint and a task's
        # writes arriving together must not both do it.
        self._lock = anyio.Lock()

    async def fence(self, workflow_id: str, thread_id: str) -> Lease:
        """The current lease of ``workflow_id``: taken, or renewed when half spent."""
        held = self._held.get(workflow_id)
        if held is not None and time.monotonic() < held[1]:
            return held[0]
        async with self._lock:
            return await self._refresh(workflow_id, thread_id)

    async def _refresh(self, workflow_id: str, thread_id: str) -> Lease:
        held = self._held.get(workflow_id)
        now = time.monotonic()
        if held is not None and now < held[1]:
            return held[0]
        if held is not None:
            lease = await self._manager.renew_lease(held[0], self._ttl)
        else:
            lease = await self._acquire(workflow_id, thread_id)
        self._held[workflow_id] = (lease, now + self._ttl / 2)
        return lease

    async def _acquire(self, workflow_id: str, thread_id: str) -> Lease:
        try:
            return await self._manager.acquire_lease(workflow_id, self._owner, self._ttl)
        except LeaseHeldError as exc:
            raise LeaseHeldError(
                f"LangGraph thread {thread_id!r} is being written by another saver "
                f"(single_writer is on): {exc}"
            ) from exc

    def forget(self, workflow_id: str) -> None:
        """Drop a lease whose workflow was deleted."""
        self._held.pop(workflow_id, None)

    async def release_all(self) -> None:
        """Give every held lease up (on close)."""
        held, self._held = self._held, {}
        for lease, _ in held.values():
            await self._manager.release_lease(lease)
