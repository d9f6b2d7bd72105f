"""The storage side of the saver: LangGraph checkpoints and writes as aiocheckpoint records.

Everything goes through :class:`~aiocheckpoint.CheckpointManager` (validation, encoding,
checksums, content-addressed blobs, fencing), so every store aiocheckpoint has keeps
LangGraph threads, and its tools (``verify``, ``copy``) work on them unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from ...errors import CheckpointCorruptedError
from ...leases import Lease
from ...manager import CheckpointManager
from ...models import Checkpoint
from ...storage.base import StoredCheckpoint
from . import keys
from . import pages as paging

__all__ = ["AGENT", "KIND", "Pair", "ThreadStore"]

#: The ``agent_id`` of every record the saver writes (``aiocheckpoint ls`` shows it).
AGENT: Final = "langgraph"
#: The kind of the workflow records of its threads (``WorkflowRecord.kind``).
KIND: Final = "langgraph"
_PAGE: Final = 64
_CACHED_PAGES: Final = 512
_KNOWN_PAGES: Final = 16384


def _page_items(workflow_id: str, digest: str, data: Mapping[str, Any]) -> list[Any]:
    items = data.get("items")
    if data.get("hash") != digest or not isinstance(items, list):
        raise CheckpointCorruptedError(
            f"page {digest} of a LangGraph list is missing or damaged", workflow_id=workflow_id
        )
    return items


def _checkpoint_id(record: Checkpoint) -> str | None:
    """The LangGraph checkpoint id a stored record belongs to (None: it names none)."""
    found = record.metadata.get("checkpoint_id")
    return found if isinstance(found, str) else None


@dataclass(frozen=True, slots=True)
class Pair:
    """A stored checkpoint and, when it has any, its stored writes (both decoded)."""

    checkpoint: Checkpoint
    writes: Checkpoint | None


class ThreadStore:
    """Reads and writes the records of LangGraph threads through a manager."""

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        # Pages are immutable (named by their content): those read or written are known to
        # be stored, and the items of those that are not boxes of large values are kept.
        self._pages: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()
        self._stored: OrderedDict[tuple[str, str], None] = OrderedDict()

    def _keep_page(self, workflow_id: str, digest: str, items: list[Any]) -> None:
        key = (workflow_id, digest)
        self._stored[key] = None
        self._stored.move_to_end(key)
        while len(self._stored) > _KNOWN_PAGES:
            self._stored.popitem(last=False)
        if paging.is_box_page(items):
            return  # a box: read again when needed rather than held
        self._pages[key] = items
        self._pages.move_to_end(key)
        while len(self._pages) > _CACHED_PAGES:
            self._pages.popitem(last=False)

    async def save_pages(self, thread_id: str, pages: Mapping[str, list[Any]]) -> None:
        """Store the pages of a thread that this process has not stored or read."""
        workflow_id = keys.pages_workflow(thread_id)
        for digest, items in pages.items():
            if (workflow_id, digest) in self._stored:
                continue
            state = {"hash": digest, "items": items}
            info = {"thread_id": thread_id, "page": digest}
            await self.save(workflow_id, keys.page_step(digest), state, info, None)
            self._keep_page(workflow_id, digest, items)

    async def load_pages(self, thread_id: str, hashes: Collection[str]) -> dict[str, list[Any]]:
        """The items of the given pages of a thread; a missing page is corruption."""
        workflow_id = keys.pages_workflow(thread_id)
        found: dict[str, list[Any]] = {}
        for digest in hashes:
            items = self._pages.get((workflow_id, digest))
            if items is None:
                items = await self._read_page(workflow_id, digest)
            self._keep_page(workflow_id, digest, items)
            found[digest] = items
        return found

    async def _read_page(self, workflow_id: str, digest: str) -> list[Any]:
        stored = await self.manager.storage.load(workflow_id, keys.page_step(digest))
        page = None if stored is None else await self.manager.decode_record(workflow_id, stored)
        return _page_items(workflow_id, digest, {} if page is None else page.state_snapshot.data)

    async def copy_pages(self, source_thread: str, target_thread: str) -> None:
        """Copy every page of one thread to another."""
        source = keys.pages_workflow(source_thread)
        after: int | None = None
        while True:
            page = await self.manager.storage.scan(source, after=after, limit=_PAGE)
            for stored in page:
                data = (await self.manager.decode_record(source, stored)).state_snapshot.data
                digest = str(data.get("hash"))
                items = _page_items(source, digest, data)
                await self.save_pages(target_thread, {digest: items})
            if len(page) < _PAGE:
                return
            after = page[-1].step

    def forget_pages(self, workflow_id: str) -> None:
        """Drop the cached pages of a pages workflow that was deleted."""
        for key in [key for key in self._pages if key[0] == workflow_id]:
            del self._pages[key]
        for key in [key for key in self._stored if key[0] == workflow_id]:
            del self._stored[key]

    def save(
        self,
        workflow_id: str,
        step: int,
        state: dict[str, Any],
        metadata: dict[str, Any],
        lease: Lease | None,
    ) -> Awaitable[object]:
        """Store one checkpoint (even step) or one checkpoint's writes (odd step).

        ``state`` and ``metadata`` were built for this save (strings, ints, lists and dicts,
        nothing kept by the caller that changes them): they are handed over, not copied,
        and encoded before this returns (``CheckpointManager.save_owned``). Await the result.
        """
        return self.manager.save_owned(workflow_id, step, AGENT, state, metadata, lease=lease)

    async def save_copy(
        self,
        workflow_id: str,
        step: int,
        state: dict[str, Any],
        metadata: dict[str, Any],
        lease: Lease | None,
    ) -> None:
        """:meth:`save` of a record read back from the store (copied as any state is)."""
        await self.manager.create_checkpoint(
            workflow_id, step, AGENT, "completed", state, metadata=metadata, lease=lease
        )

    async def load_pair(self, workflow_id: str, step: int | None) -> Pair | None:
        """The checkpoint at ``step`` (the latest when None) with its writes."""
        if step is None:
            async for pair in self.pairs(workflow_id, before=None):
                return pair
            return None
        after = step - 1 if step else None  # step 0: an id whose timestamp is 0
        records = await self.manager.storage.scan(workflow_id, after=after, before=step + 2)
        found = {record.step: record for record in records}
        if step not in found:
            return None
        return await self._decode(workflow_id, found[step], found.get(step + 1))

    async def load_writes(
        self, workflow_id: str, step: int
    ) -> tuple[str | None, Checkpoint | None]:
        """The stored writes record at the odd ``step`` and the checkpoint id it belongs to.

        The id is the one the writes record names, else the one of the checkpoint at
        ``step - 1``; None when neither is stored. Both are read in one range read.
        """
        found = {
            record.step: record
            for record in await self.manager.storage.scan(
                workflow_id, after=step - 2 if step >= 2 else None, before=step + 1
            )
        }
        if step in found:
            writes = await self.manager.decode_record(workflow_id, found[step])
            return _checkpoint_id(writes), writes
        if step - 1 in found:
            checkpoint = await self.manager.decode_record(workflow_id, found[step - 1])
            return _checkpoint_id(checkpoint), None
        return None, None

    async def pairs(self, workflow_id: str, *, before: int | None) -> AsyncIterator[Pair]:
        """Checkpoints newest first (steps below ``before``), a page of records at a time."""
        async for checkpoint, writes in self._raw_pairs(workflow_id, before):
            yield await self._decode(workflow_id, checkpoint, writes)

    async def checkpoint_steps(self, workflow_id: str) -> list[int]:
        """Every checkpoint step of a workflow, newest first (reads every record once)."""
        return [c.step async for c, _ in self._raw_pairs(workflow_id, None)]

    async def _raw_pairs(
        self, workflow_id: str, before: int | None
    ) -> AsyncIterator[tuple[StoredCheckpoint, StoredCheckpoint | None]]:
        pending: StoredCheckpoint | None = None
        while True:
            page = await self.manager.storage.scan(
                workflow_id, before=before, limit=_PAGE, descending=True
            )
            for record in page:
                if not keys.is_checkpoint_step(record.step):
                    pending = record
                    continue
                writes = pending if pending and pending.step == record.step + 1 else None
                pending = None
                yield record, writes
            if len(page) < _PAGE:
                return
            before = page[-1].step

    async def _decode(
        self, workflow_id: str, checkpoint: StoredCheckpoint, writes: StoredCheckpoint | None
    ) -> Pair:
        """The pair; writes stored for another checkpoint id (at the same step) are not its."""
        decode = self.manager.decode_record
        found = await decode(workflow_id, checkpoint)
        own = None if writes is None else await decode(workflow_id, writes)
        if own is not None and _checkpoint_id(own) not in (None, _checkpoint_id(found)):
            own = None
        return Pair(found, own)

    async def thread_workflows(self, thread_id: str) -> list[str]:
        """The workflow ids of every namespace of a thread."""
        prefix = keys.thread_prefix(thread_id)
        return [w for w in await self.manager.storage.list_workflows() if w.startswith(prefix)]

    async def all_workflows(self) -> list[str]:
        """The workflow ids of every LangGraph thread and namespace in the store."""
        return [w for w in await self.manager.storage.list_workflows() if w.startswith(keys.PREFIX)]

    async def last_activity(self, workflow_id: str) -> tuple[str, datetime] | None:
        """The thread id of a namespace and when its newest record was written."""
        stored = await self.manager.storage.load(workflow_id)
        if stored is None:
            return None
        latest = await self.manager.decode_record(workflow_id, stored)
        return str(latest.metadata.get("thread_id")), latest.timestamp

    async def delete(self, workflow_id: str, step: int | None = None) -> None:
        """Delete one record, or a whole namespace when ``step`` is None."""
        await self.manager.delete_checkpoints(workflow_id, step)
