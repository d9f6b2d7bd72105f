"""``AioCheckpointSaver``: a LangGraph checkpointer over any aiocheckpoint store."""

from __future__ import annotations

import asyncio
import os
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any, Final, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from typing_extensions import Self

from ...codec import KeyProvider
from ...errors import CheckpointIdCollisionError, InvalidArgumentError
from ...manager import CheckpointManager
from ...storage.base import CheckpointStorage
from ...urls import open_storage
from . import keys, records
from . import pages as paging
from .leases import ThreadLeases, default_owner
from .store import KIND, Pair, ThreadStore

__all__ = ["AioCheckpointSaver"]

_T = TypeVar("_T")
_LOCKS: Final = 64
_CACHED_THREADS: Final = 4096


def _target(config: RunnableConfig) -> tuple[str, str, str | None]:
    conf = config.get("configurable") or {}
    if conf.get("thread_id") is None:
        raise InvalidArgumentError("the config has no configurable.thread_id")
    checkpoint_id = conf.get("checkpoint_id")
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), checkpoint_id


def _seconds(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InvalidArgumentError(f"{name} must be seconds >= 0 or None, got {value!r}")
    return float(value)


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class AioCheckpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that stores threads in an aiocheckpoint store.

    ``storage`` is any aiocheckpoint storage (memory, file, SQLite, PostgreSQL); use
    :meth:`from_url` to open one by URL. Use it as ``async with AioCheckpointSaver(...)
    as saver:`` (or call :meth:`aclose`): closing releases the leases it holds and closes
    a storage it opened itself (``from_url``) or was given with ``close_storage=True``.

    Options (``docs/langgraph.md``): ``single_writer`` fences each thread's writes with a
    lease (``lease_ttl`` seconds, renewed as it writes), so a second saver writing the
    same thread gets :class:`~aiocheckpoint.LeaseHeldError`; ``max_checkpoints`` keeps
    only the newest N checkpoints of each thread namespace; ``thread_ttl`` is the idle
    time (seconds) after which :meth:`aprune_idle` deletes a thread; ``serde`` is
    LangGraph's serializer (its default when None); ``encryption`` (a
    :class:`~aiocheckpoint.Keyring` or :class:`~aiocheckpoint.KeyProvider`) seals every
    record the saver writes, checkpoints, writes and channel values alike
    (``docs/encryption.md``).

    The sync methods (``invoke`` and ``stream`` use them) work from any thread other than
    the one running the event loop the saver was opened on; from inside that loop use
    the async methods (``ainvoke``, ``astream``).
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        *,
        serde: SerializerProtocol | None = None,
        single_writer: bool = False,
        lease_ttl: float = 30.0,
        max_checkpoints: int | None = None,
        thread_ttl: float | None = None,
        close_storage: bool = False,
        encryption: KeyProvider | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if max_checkpoints is not None and (
            type(max_checkpoints) is not int or max_checkpoints < 1
        ):
            raise InvalidArgumentError(
                f"max_checkpoints must be an int >= 1 or None, got {max_checkpoints!r}"
            )
        # Its threads' records are of their own kind: runners sharing the store never
        # claim them, and the default listings leave them out.
        # Version-1 records only: the saver keeps its own incremental form (unchanged channels
        # reused by version, list pages and boxes by hash), so a record holds the step's new
        # values and hashes, and splitting it into a tree would only cost the loop time.
        self.manager = CheckpointManager(
            storage, encryption=encryption, workflow_kind=KIND, incremental=False
        )
        # Encrypted: pages are named by a key of this saver's, so a page's name (its step
        # in the store) confirms no guess of its content.
        self._page_name = (
            paging.page_hash if encryption is None else paging.keyed_page_hash(os.urandom(32))
        )
        self._store = ThreadStore(self.manager)
        self._leases = (
            ThreadLeases(self.manager, default_owner(), lease_ttl) if single_writer else None
        )
        self._max_checkpoints = max_checkpoints
        self._thread_ttl = _seconds(thread_ttl, "thread_ttl")
        self._close_storage = close_storage
        # asyncio's: LangGraph runs on asyncio, and its lock is taken without a trip
        # through the loop when free (anyio's yields once on every acquire).
        self._locks = [asyncio.Lock() for _ in range(_LOCKS)]
        self._channels: OrderedDict[str, tuple[str, records.ChannelCache]] = OrderedDict()
        self._recent: OrderedDict[str, list[int]] = OrderedDict()
        # The newest checkpoint step each namespace's aput started here: writes of a newer
        # checkpoint have nothing stored to merge with (_after_newest_put).
        self._started: OrderedDict[str, int] = OrderedDict()
        # The checkpoint id and writes this saver last stored per writes step (none for a
        # checkpoint it just created): a task's writes are merged without reading them back,
        # and an id sharing the step of another is refused.
        # Kept as one flat tuple of strings and ints each, the id first, then the writes'
        # fields in a row (records.flat_writes), which the garbage collector stops tracking
        # at its first look (a tuple holding tuples takes a look more, and is promoted).
        self._writes: OrderedDict[tuple[str, int], tuple[Any, ...]] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, *, storage_options: dict[str, Any] | None = None, **kwargs: Any
    ) -> Self:
        """A saver over the store ``url`` names (``aiocheckpoint.open_storage``'s forms).

        The saver owns that store and closes it on :meth:`aclose`.
        """
        storage = open_storage(url, **(storage_options or {}))
        return cls(storage, close_storage=True, **kwargs)

    async def __aenter__(self) -> Self:
        self._bind()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release the leases held and close the storage if this saver owns it (once)."""
        if self._closed:
            return
        self._closed = True
        if self._leases is not None:
            await self._leases.release_all()
        if self._close_storage:
            await self.manager.close()

    def _bind(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions as LangGraph's own savers make them: a counter and a random part."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- writing --------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; return the config that names it."""
        self._bind()
        thread_id, ns, parent_id = _target(config)
        workflow_id = keys.workflow_id(thread_id, ns)
        step = keys.checkpoint_step(checkpoint["id"])
        known = self._writes.get((workflow_id, step + 1))
        if known is not None and known[0] != checkpoint["id"]:
            raise CheckpointIdCollisionError(workflow_id, checkpoint["id"], known[0])
        previous = self._channels.get(workflow_id)
        parent_channels = previous[1] if previous and previous[0] == parent_id else {}
        new_pages: dict[str, list[Any]] = {}
        state, channels = records.checkpoint_state(
            self.serde,
            checkpoint,
            get_checkpoint_metadata(config, metadata),
            parent_channels,
            new_pages,
            self._page_name,
        )
        info = {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": parent_id,
        }
        if step > self._started.get(workflow_id, -1):
            self._remember(self._started, workflow_id, step)
        if known is None:
            # A new checkpoint has no writes (LangGraph stores each checkpoint id once); its
            # tasks' writes may arrive while it is being saved.
            self._remember(self._writes, (workflow_id, step + 1), (checkpoint["id"],))
        lease = None if self._leases is None else await self._leases.fence(workflow_id, thread_id)
        if new_pages:
            await self._store.save_pages(thread_id, new_pages)  # before what references them
        saving = self._store.save(workflow_id, step, state, info, lease)
        # Encoded: this frame keeps nothing of the record while the save waits, so no
        # container of it lives long enough for the garbage collector to promote.
        del state, info, new_pages
        await saving
        self._remember(self._channels, workflow_id, (checkpoint["id"], channels))
        await self._retain(workflow_id, step)
        return _config(thread_id, ns, checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store the writes of one task for the checkpoint ``config`` names."""
        self._bind()
        thread_id, ns, checkpoint_id = _target(config)
        if checkpoint_id is None:
            raise InvalidArgumentError("put_writes needs a config with a checkpoint_id")
        workflow_id = keys.workflow_id(thread_id, ns)
        step = keys.writes_step(checkpoint_id)
        async with self._locks[hash((workflow_id, step)) % _LOCKS]:
            owner, old = await self._stored_writes(workflow_id, step)
            if owner is not None and owner != checkpoint_id:
                raise CheckpointIdCollisionError(workflow_id, checkpoint_id, owner)
            merged = records.merge_writes(self.serde, old, writes, task_id, task_path)
            info = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
            leases = self._leases
            lease = None if leases is None else await leases.fence(workflow_id, thread_id)
            self._writes.pop((workflow_id, step), None)  # unknown again if the save fails
            # Stored as JSON lists: a tuple would be a typed value, tagged on the way in and
            # restored on the way out for a checkpoint the saver never looks at.
            state = {"writes": [list(write) for write in merged]}
            saving = self._store.save(workflow_id, step, state, info, lease)
            stored = records.flat_writes(checkpoint_id, merged)
            del state, info, merged, old  # encoded (see aput)
            try:
                await saving
            except BaseException:
                # Stored or not (a save cancelled in its batch commits): read back next time.
                self._started.pop(workflow_id, None)
                raise
            self._remember(self._writes, (workflow_id, step), stored)

    async def _stored_writes(
        self, workflow_id: str, step: int
    ) -> tuple[str | None, Sequence[records.Write]]:
        """The checkpoint id the writes at ``step`` belong to (None: unknown), and them."""
        cached = self._writes.get((workflow_id, step))
        if cached is not None:
            return cached[0], records.unflat_writes(cached)
        if self._after_newest_put(workflow_id, step):
            return None, []
        owner, stored = await self._store.load_writes(workflow_id, step)
        return owner, [] if stored is None else records.decode_writes(stored.state_snapshot.data)

    def _after_newest_put(self, workflow_id: str, step: int) -> bool:
        """Whether the writes ``step`` is of a checkpoint newer than any this saver put.

        LangGraph saves a step's checkpoint in the background, after the one before it, and
        its tasks' writes as they finish: a task's writes often come before their
        checkpoint's ``aput``. A checkpoint newer than the newest whose ``aput`` started
        here was made by the run this saver serves, so nothing is stored for it yet and the
        writes are not read back (a round trip to the store per task). A namespace this
        saver has not put to since it last read it (:meth:`aget_tuple`: a thread another
        process may have run on) is read.
        """
        newest = self._started.get(workflow_id)
        return newest is not None and step > newest + 1

    async def _fence(self, workflow_id: str, thread_id: str) -> Any:
        if self._leases is None:
            return None
        return await self._leases.fence(workflow_id, thread_id)

    @staticmethod
    def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > _CACHED_THREADS:
            cache.popitem(last=False)

    async def _retain(self, workflow_id: str, step: int) -> None:
        if self._max_checkpoints is None:
            return
        steps = self._recent.get(workflow_id)
        if steps is None:
            steps = sorted(await self._store.checkpoint_steps(workflow_id))
        elif step not in steps:
            steps = sorted([*steps, step])
        while len(steps) > self._max_checkpoints:
            old = steps.pop(0)
            await self._store.delete(workflow_id, old)
            await self._store.delete(workflow_id, old + 1)
            self._writes.pop((workflow_id, old + 1), None)
        self._remember(self._recent, workflow_id, steps)

    # -- reading --------------------------------------------------------------------

    async def _tuple(self, pair: Pair) -> CheckpointTuple:
        info = pair.checkpoint.metadata
        thread_id, ns = str(info.get("thread_id")), str(info.get("checkpoint_ns", ""))
        state = pair.checkpoint.state_snapshot.data
        hashes = records.page_hashes(state)
        pages = await self._store.load_pages(thread_id, hashes) if hashes else {}
        checkpoint, metadata = records.decode_checkpoint(self.serde, state, pages)
        parent = info.get("parent_checkpoint_id")
        writes = (
            [] if pair.writes is None else records.decode_writes(pair.writes.state_snapshot.data)
        )
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint["id"]),
            checkpoint=checkpoint,
            metadata=metadata,  # type: ignore[arg-type]
            parent_config=None if parent is None else _config(thread_id, ns, str(parent)),
            pending_writes=records.pending_writes(self.serde, writes),
        )

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (the thread's latest without a checkpoint_id)."""
        self._bind()
        thread_id, ns, checkpoint_id = _target(config)
        workflow_id = keys.workflow_id(thread_id, ns)
        # A run goes on from what is stored, which another process may have put: its writes
        # are read back until this saver puts again (_after_newest_put).
        self._started.pop(workflow_id, None)
        try:
            step = None if checkpoint_id is None else keys.checkpoint_step(checkpoint_id)
        except InvalidArgumentError:
            return None  # an id this saver cannot have stored
        pair = await self._store.load_pair(workflow_id, step)
        if pair is None:
            return None
        found = await self._tuple(pair)
        if checkpoint_id is not None and found.checkpoint["id"] != checkpoint_id:
            return None
        return found

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first: of a thread (and namespace), or of every thread.

        ``filter`` keeps those whose metadata has every given key with the given value;
        ``before`` keeps those older than the checkpoint it names; ``limit`` caps the count.
        """
        self._bind()
        if limit is not None and limit <= 0:
            return
        bound = None
        if before is not None:
            before_id = _target(before)[2]
            bound = None if before_id is None else keys.checkpoint_step(before_id)
        wanted_id = None if config is None else _target(config)[2]
        count = 0
        for workflow_id in await self._list_targets(config):
            async for pair in self._store.pairs(workflow_id, before=bound):
                found = await self._tuple(pair)
                if wanted_id is not None and found.checkpoint["id"] != wanted_id:
                    continue
                if filter and any(found.metadata.get(k) != v for k, v in filter.items()):
                    continue
                yield found
                count += 1
                if limit is not None and count >= limit:
                    return

    async def _list_targets(self, config: RunnableConfig | None) -> list[str]:
        if config is None:
            return await self._store.all_workflows()
        thread_id, ns, _ = _target(config)
        if "checkpoint_ns" in (config.get("configurable") or {}):
            return [keys.workflow_id(thread_id, ns)]
        return await self._store.thread_workflows(thread_id)

    # -- maintenance ----------------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of a thread, in every namespace."""
        self._bind()
        await self._drop_thread(str(thread_id), await self._store.thread_workflows(str(thread_id)))

    async def _drop_thread(self, thread_id: str, workflows: Sequence[str]) -> None:
        for workflow_id in workflows:
            await self._drop(workflow_id)
        pages = keys.pages_workflow(thread_id)
        await self._store.delete(pages)
        self._store.forget_pages(pages)

    async def _drop(self, workflow_id: str) -> None:
        await self._store.delete(workflow_id)
        self._forget(workflow_id)

    def _forget(self, workflow_id: str) -> None:
        self._channels.pop(workflow_id, None)
        self._recent.pop(workflow_id, None)
        self._started.pop(workflow_id, None)
        for key in [key for key in self._writes if key[0] == workflow_id]:
            del self._writes[key]
        if self._leases is not None:
            self._leases.forget(workflow_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata has one of ``run_ids``.

        This reads every LangGraph checkpoint in the store once.
        """
        self._bind()
        runs = set(run_ids)
        if not runs:
            return
        for workflow_id in await self._store.all_workflows():
            doomed = [
                pair.checkpoint.step
                async for pair in self._store.pairs(workflow_id, before=None)
                if records.decode_metadata(self.serde, pair.checkpoint.state_snapshot.data).get(
                    "run_id"
                )
                in runs
            ]
            for step in doomed:
                await self._store.delete(workflow_id, step)
                await self._store.delete(workflow_id, step + 1)
            self._forget(workflow_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another thread id."""
        self._bind()
        target = str(target_thread_id)
        source = str(source_thread_id)
        await self._store.copy_pages(source, target)
        for workflow_id in await self._store.thread_workflows(source):
            async for pair in self._store.pairs(workflow_id, before=None):
                await self._copy(pair, target)

    async def _copy(self, pair: Pair, target: str) -> None:
        for record in (pair.checkpoint, pair.writes):
            if record is None:
                continue
            info = {**record.metadata, "thread_id": target}
            workflow_id = keys.workflow_id(target, str(info.get("checkpoint_ns", "")))
            lease = await self._fence(workflow_id, target)
            await self._store.save_copy(
                workflow_id, record.step, record.state_snapshot.data, info, lease
            )
            self._forget(workflow_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads, by ``strategy``.

        ``"keep_latest"`` keeps each namespace's newest checkpoint (with its writes),
        ``"delete"`` deletes the threads.
        """
        self._bind()
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgumentError(f"unknown prune strategy {strategy!r}")
        for thread_id in thread_ids:
            workflows = await self._store.thread_workflows(str(thread_id))
            if strategy == "delete":
                await self._drop_thread(str(thread_id), workflows)
                continue
            for workflow_id in workflows:
                await self._keep_latest(workflow_id)

    async def _keep_latest(self, workflow_id: str) -> None:
        steps = await self._store.checkpoint_steps(workflow_id)
        for step in steps[1:]:
            await self._store.delete(workflow_id, step)
            await self._store.delete(workflow_id, step + 1)
        self._forget(workflow_id)

    async def aprune_idle(self, idle_for: float | None = None) -> list[str]:
        """Delete the threads not written for ``idle_for`` seconds; return their ids.

        ``idle_for`` defaults to the saver's ``thread_ttl``. A thread is idle when no
        namespace of it has had a checkpoint or a write for that long (judged by the
        timestamps of its newest records). This reads the newest record of every LangGraph
        namespace in the store: run it now and then (a periodic task), not per step.
        """
        self._bind()
        ttl = _seconds(self._thread_ttl if idle_for is None else idle_for, "idle_for")
        if ttl is None:
            raise InvalidArgumentError("aprune_idle needs idle_for or the saver's thread_ttl")
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=ttl)
        busy: set[str] = set()
        namespaces: dict[str, list[str]] = {}
        for workflow_id in await self._store.all_workflows():
            seen = await self._store.last_activity(workflow_id)
            if seen is not None:
                namespaces.setdefault(seen[0], []).append(workflow_id)
                if seen[1] > cutoff:
                    busy.add(seen[0])
        idle = sorted(set(namespaces) - busy)
        for thread_id in idle:
            await self._drop_thread(thread_id, namespaces[thread_id])
        return idle

    # -- the sync API -----------------------------------------------------------------

    def _run(self, work: Callable[[], Awaitable[_T]]) -> _T:
        loop = self._loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or loop.is_closed():
            raise InvalidArgumentError(
                "AioCheckpointSaver's sync methods need the saver opened on a running event "
                "loop (async with); call them from another thread"
            )
        if running is loop:
            raise InvalidArgumentError(
                "AioCheckpointSaver's sync methods cannot run inside the saver's own event "
                "loop: use the async methods (ainvoke, astream) there, or call the sync ones "
                "from another thread"
            )

        async def call() -> _T:
            return await work()

        return asyncio.run_coroutine_threadsafe(call(), loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync :meth:`aget_tuple` (from a thread other than the saver's loop)."""
        return self._run(lambda: self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync :meth:`alist` (from a thread other than the saver's loop)."""

        async def collect() -> list[CheckpointTuple]:
            found = self.alist(config, filter=filter, before=before, limit=limit)
            return [item async for item in found]

        return iter(self._run(collect))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync :meth:`aput` (from a thread other than the saver's loop)."""
        return self._run(lambda: self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync :meth:`aput_writes` (from a thread other than the saver's loop)."""
        self._run(lambda: self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Sync :meth:`adelete_thread`."""
        self._run(lambda: self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync :meth:`adelete_for_runs`."""
        self._run(lambda: self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync :meth:`acopy_thread`."""
        self._run(lambda: self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync :meth:`aprune`."""
        self._run(lambda: self.aprune(thread_ids, strategy=strategy))
