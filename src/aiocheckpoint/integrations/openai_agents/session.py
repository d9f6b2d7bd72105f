"""``AioCheckpointSession``: an OpenAI Agents SDK ``Session`` kept in aiocheckpoint's stores.

A session is one workflow (``prefix + session_id``). Each ``add_items`` call is one
checkpoint holding that call's items, at the step after the latest: a batch is stored
whole or not at all, and the order of the steps is the order of the items. ``pop_item``
rewrites the latest batch without its last item (or deletes it when that was its only
item). Writers go through a :class:`~aiocheckpoint.integrations._serial.WriterGate`, so
concurrent writers in one or in several processes neither lose nor reorder items.
"""

from __future__ import annotations

from typing import Any, Final, cast

from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from ..._validation import check_workflow_id
from ...errors import CheckpointCorruptedError, InvalidArgumentError
from ...leases import Lease
from ...manager import CheckpointManager
from ...models import AgentStatus, Checkpoint
from .._serial import WriterGate, unique_owner

__all__ = ["AioCheckpointSession"]

_AGENT: Final = "openai-agents"
_PAGE: Final = 64


class AioCheckpointSession:
    """A ``agents.memory.Session`` over a :class:`~aiocheckpoint.CheckpointManager`.

    ``session_id`` names the conversation; its items are the checkpoints of workflow
    ``prefix + session_id``. Whatever the manager does to checkpoints applies: encryption
    seals every batch, ``max_checkpoints`` keeps the newest N batches (``add_items`` calls),
    a retention policy's ``finished_ttl`` drops a session idle that long.
    ``lease_ttl`` and ``lock_wait`` tune the writers' lease (see ``docs/openai-agents.md``).
    """

    def __init__(
        self,
        session_id: str,
        manager: CheckpointManager,
        *,
        session_settings: SessionSettings | None = None,
        prefix: str = "openai-agents/session/",
        lease_ttl: float = 30.0,
        lock_wait: float = 60.0,
    ) -> None:
        if not isinstance(manager, CheckpointManager):
            raise InvalidArgumentError(f"manager must be a CheckpointManager, not {manager!r}")
        if not isinstance(session_id, str) or not session_id:
            raise InvalidArgumentError(f"session_id must be a non-empty str, not {session_id!r}")
        self.session_id = session_id
        self.session_settings = session_settings
        self.workflow_id = check_workflow_id(prefix + session_id)
        self._manager = manager
        self._gate = WriterGate(manager, unique_owner(_AGENT), ttl=lease_ttl, wait=lock_wait)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with ``limit``, the latest ``limit`` of them.

        ``limit`` None falls back to ``session_settings.limit`` (None: every item).
        """
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is None:
            return await self._all_items()
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
            raise InvalidArgumentError(f"limit must be an int >= 0 or None, not {wanted!r}")
        return await self._latest_items(wanted) if wanted else []

    async def _all_items(self) -> list[TResponseInputItem]:
        items: list[TResponseInputItem] = []
        async for checkpoint in self._manager.iter_checkpoints(self.workflow_id):
            items.extend(_items(checkpoint))
        return items

    async def _latest_items(self, limit: int) -> list[TResponseInputItem]:
        batches: list[list[TResponseInputItem]] = []
        count = 0
        # A page of ``limit`` batches holds ``limit`` items or more: one page, usually.
        size = min(limit, _PAGE)
        pages = self._manager.iter_checkpoints(self.workflow_id, descending=True, page_size=size)
        async for checkpoint in pages:
            batch = _items(checkpoint)
            batches.append(batch)
            count += len(batch)
            if count >= limit:
                break
        items = [item for batch in reversed(batches) for item in batch]
        return items[-limit:]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` after every item stored, as one durable batch."""
        if not isinstance(items, list):
            raise InvalidArgumentError(f"items must be a list, not {type(items).__name__}")
        if not items:
            return
        async with self._gate.writing(self.workflow_id) as lease:
            step = await self._gate.next_step(self.workflow_id, lease)
            await self._write(step, list(items), lease)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the latest item; None when the session is empty."""
        if not await self._manager.has_checkpoint(self.workflow_id):
            return None  # and no lease taken: it would make a record for an empty session
        async with self._gate.writing(self.workflow_id) as lease:
            while True:
                latest = await self._manager.get_latest_checkpoint(self.workflow_id)
                if latest is None:
                    return None
                batch = _items(latest)
                if len(batch) > 1:
                    await self._write(latest.step, batch[:-1], lease)
                    return batch[-1]
                await self._manager.delete_checkpoints(self.workflow_id, latest.step)
                if batch:
                    return batch[0]

    async def clear_session(self) -> None:
        """Delete every item of the session."""
        async with self._gate.writing(self.workflow_id):
            await self._manager.delete_checkpoints(self.workflow_id)

    async def _write(self, step: int, items: list[TResponseInputItem], lease: Lease | None) -> None:
        await self._manager.create_checkpoint(
            self.workflow_id,
            step,
            _AGENT,
            AgentStatus.COMPLETED,
            {"items": items},
            lease=lease,
        )


def _items(checkpoint: Checkpoint) -> list[TResponseInputItem]:
    """The items of one stored batch; a record of another shape is refused."""
    items: Any = checkpoint.state_snapshot.data.get("items")
    if not isinstance(items, list):
        raise CheckpointCorruptedError(
            "the record holds no session items",
            workflow_id=checkpoint.workflow_id,
            step=checkpoint.step,
        )
    return cast(list[TResponseInputItem], items)
