"""PostgreSQL storage over asyncpg, with group commit.

asyncpg is an optional dependency (``pip install aiocheckpoint[postgres]``): it is imported
the first time a storage is used, never when this module is imported.

Concurrent ``save`` calls share round trips: each call queues its row and waits; up to
``write_concurrency`` writer tasks take the queued rows and write each batch with one
``INSERT ... SELECT FROM unnest(...)`` (plus one retention ``DELETE`` in the same transaction
when ``keep_last`` is used). A caller returns only after the transaction holding its row has
committed. See docs/postgres-storage.md for the schema, durability and cost of each call.

Workflow records and leases (:class:`~aiocheckpoint.storage.base.WorkflowStorage`) live in a
``workflows`` table; lease expiry is judged by the server's clock (``now()``). A fenced save
rides in the same batch statement as the others: its token is compared with the record's,
locked ``FOR SHARE``, and only that caller gets :class:`~aiocheckpoint.LeaseLostError` if it
is stale. See docs/leases.md.

Incremental (version-2) checkpoints keep their blobs in a ``blobs`` table with reference
counts (docs/incremental.md, section 8): ``save_tree`` rows ride in the same batches, and
each batch's transaction adds the refs of its new trees (one statement per tree level, all
trees of the batch together), writes the records, then releases the refs of the version-2
records it replaced or pruned; ``delete`` releases in its own transaction. A blob is deleted
in the transaction that drops its count to 0, so there is nothing for ``collect_garbage`` to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from .._validation import check_limit, check_optional_step, check_step, check_workflow_id
from ..errors import (
    CheckpointCorruptedError,
    CheckpointError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLostError,
    StorageBackendError,
    StorageClosedError,
)
from ..format import SplitResult, TreeParams
from ..leases import Lease, WorkflowRecord, WorkflowStatus, check_ttl, fence_token
from ._pg_schema import Sql, migrate, quote_schema
from .base import DEFAULT_MAX_RECORD_BYTES, BaseStorage, StoredCheckpoint, check_record_size
from .refcounts import Rows, aadd_references, arelease_references, held_root_refs, missing_blob

__all__ = ["PostgresCheckpointStorage", "WriteStats"]

T = TypeVar("T")

_MAX_STEP = 2**63 - 1
#: Attempts of a batch that lost a deadlock or serialization conflict to another writer (e.g.
#: two processes writing the same workflow, one waiting for the blob lock the other holds).
_CONFLICT_ATTEMPTS = 30
_asyncpg: ModuleType | None = None


def _import_asyncpg() -> ModuleType:
    global _asyncpg
    if _asyncpg is None:
        try:
            _asyncpg = importlib.import_module("asyncpg")
        except ImportError as exc:
            raise StorageBackendError(
                "PostgresCheckpointStorage needs asyncpg, which is not installed: "
                "pip install 'aiocheckpoint[postgres]'"
            ) from exc
    return _asyncpg


def _driver_errors(pg: ModuleType) -> tuple[type[BaseException], ...]:
    return (
        pg.PostgresError,
        pg.InterfaceError,
        pg.InternalClientError,
        OSError,
        asyncio.TimeoutError,
    )


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is dead or its protocol state is unusable."""
    if isinstance(exc, (OSError, asyncio.TimeoutError)):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    if state.startswith(("08", "57P")):
        return True
    pg = _asyncpg
    if pg is None:
        return False
    # asyncpg can be left in a confused protocol state by a server-side termination
    # (MagicStack/asyncpg#1069): such a connection must be discarded, like a dead one.
    if isinstance(exc, pg.InternalClientError):
        return True
    if isinstance(exc, pg.InterfaceError):
        text = str(exc).lower()
        return "connection" in text and "closed" in text
    return False


class _Raced(Exception):
    """A record appeared after the batch statement's snapshot: run the transaction again."""


def _conflict(exc: BaseException) -> bool:
    """A deadlock or serialization failure, or a race the batch detected: retry it whole."""
    return isinstance(exc, _Raced) or getattr(exc, "sqlstate", None) in ("40001", "40P01")


def _is_transient(exc: BaseException) -> bool:
    """Whether running the same idempotent operation again may well succeed."""
    if _connection_lost(exc) or _conflict(exc):
        return True
    pg = _asyncpg
    # A concurrent ALTER TABLE invalidated a cached statement; asyncpg has dropped it.
    return pg is not None and isinstance(exc, pg.InvalidCachedStatementError)


@dataclass
class WriteStats:
    """Counters of the group-commit writer: how many rows shared how many transactions."""

    rows: int = 0
    batches: int = 0
    retries: int = 0
    split_batches: int = 0
    largest_batch: int = 0
    #: Statements that added or released blob references (one per tree level and batch).
    blob_statements: int = 0


@dataclass(eq=False)
class _Write:
    workflow_id: str
    step: int
    data: bytes
    keep_last: int | None
    token: int | None
    future: asyncio.Future[None] = field(repr=False)
    split: SplitResult | None = field(default=None, repr=False)


class PostgresCheckpointStorage(BaseStorage):
    """Stores checkpoint records in PostgreSQL, in one table of its own schema.

    ``dsn_or_pool`` is a connection string (the storage then creates, owns and closes an
    asyncpg pool of ``min_size``..``max_size`` connections; ``connect_kwargs`` go to
    ``asyncpg.create_pool``) or an existing ``asyncpg.Pool`` (used as is, never closed).
    Nothing connects until the first call, which also creates or migrates the schema.

    Every operation is one primary-key lookup or range scan. ``save`` is durable when it
    returns (the row's transaction has committed). A connection lost mid-operation is
    retried up to ``retries`` times on a fresh connection for idempotent calls (save, load,
    scan, exists, list_workflows); otherwise it raises :class:`StorageBackendError`.
    """

    def __init__(
        self,
        dsn_or_pool: Any,
        *,
        schema: str = "aiocheckpoint",
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        min_size: int = 1,
        max_size: int = 10,
        write_concurrency: int = 2,
        max_batch_rows: int = 500,
        max_batch_bytes: int = 16 * 1024 * 1024,
        retries: int = 2,
        blob_params: TreeParams | None = None,
        **connect_kwargs: Any,
    ) -> None:
        self._quoted = quote_schema(schema)
        for name, value, low in (
            ("max_record_bytes", max_record_bytes, 1),
            ("min_size", min_size, 0),
            ("max_size", max_size, 1),
            ("write_concurrency", write_concurrency, 1),
            ("max_batch_rows", max_batch_rows, 1),
            ("max_batch_bytes", max_batch_bytes, 1),
            ("retries", retries, 0),
        ):
            if type(value) is not int or value < low:
                raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r}")
        if blob_params is not None and not isinstance(blob_params, TreeParams):
            raise InvalidArgumentError("blob_params must be a TreeParams or None")
        self._params = blob_params or TreeParams()
        if isinstance(dsn_or_pool, str):
            self._dsn: str | None = dsn_or_pool
            self._given_pool: Any = None
        elif hasattr(dsn_or_pool, "acquire"):
            self._dsn = None
            self._given_pool = dsn_or_pool
        else:
            raise InvalidArgumentError(
                f"dsn_or_pool must be a DSN str or an asyncpg pool, not {type(dsn_or_pool)!r}"
            )
        self._pool: Any = None
        self._schema = schema
        self._sql = Sql.for_schema(self._quoted)
        self._max_record_bytes = max_record_bytes
        settings = {"synchronous_commit": "on", **connect_kwargs.pop("server_settings", {})}
        self._pool_options = {
            "min_size": min_size,
            "max_size": max_size,
            # Durability must not depend on the server's default: a commit returns only
            # after its WAL record is flushed, unless the caller explicitly asks otherwise.
            "server_settings": settings,
            **connect_kwargs,
        }
        self._write_concurrency = write_concurrency
        self._max_batch_rows = max_batch_rows
        self._max_batch_bytes = max_batch_bytes
        self._retries = retries
        self._open_lock = asyncio.Lock()
        self._queue: deque[_Write] = deque()
        self._writers: set[asyncio.Task[None]] = set()
        self._active_writers = 0
        self._in_flight: set[str] = set()
        self._trees_in_flight = False
        self.stats = WriteStats()

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding this store's tables."""
        return self._schema

    @property
    def blob_params(self) -> TreeParams:
        """How this store cuts large states into blobs (the ``blob_params`` option)."""
        return self._params

    # --- the protocol -------------------------------------------------------------------

    async def save(
        self,
        workflow_id: str,
        step: int,
        data: bytes,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Store ``data`` as ``step``; with ``keep_last`` prune older steps in the same commit.

        Returns once the row is committed. Cancelled while still queued, the row is not
        written; cancelled once its batch is in flight, the batch completes whole. The
        workflow gets an UNFINISHED record if it has none. With ``fence``, the row is written
        only if ``fence.token`` is the workflow's current fencing token; otherwise this call
        (and only this one in its batch) raises :class:`~aiocheckpoint.LeaseLostError`.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        check_step(step)
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"data must be bytes, not {type(data).__qualname__}")
        data = bytes(data)
        check_record_size(data, self._max_record_bytes)
        await self._enqueue(workflow_id, step, data, keep_last, fence, None)

    async def save_tree(
        self,
        workflow_id: str,
        step: int,
        record: bytes,
        split: SplitResult,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Store ``split``'s blobs and the version-2 ``record`` in one transaction.

        Queued and batched like :meth:`save` (same cancellation, fencing and retention
        behaviour). In the batch's transaction, each tree level costs one statement for all
        the batch's trees: blobs already stored get one more reference and are not
        descended into, missing ones are inserted. The refs of a record this replaces or
        ``keep_last`` prunes are released after, in the same transaction.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        check_step(step)
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if not isinstance(split, SplitResult):
            raise InvalidArgumentError(f"split must be a SplitResult, not {type(split).__name__}")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"record must be bytes, not {type(record).__qualname__}")
        record = bytes(record)
        check_record_size(record, self._max_record_bytes)
        for blob in split.blobs.values():
            check_record_size(blob, self._max_record_bytes)
        await self._enqueue(workflow_id, step, record, keep_last, fence, split)

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes``: one indexed statement.

        A blob over ``max_record_bytes`` is left out (the reader reports it as missing).
        """
        self._check_open()
        if any(not isinstance(h, (bytes, bytearray, memoryview)) for h in hashes):
            raise InvalidArgumentError("fetch_blobs takes a collection of bytes hashes")
        wanted = [bytes(h) for h in hashes]
        if not wanted:
            return {}
        sql, cap = self._sql.blob_fetch, self._max_record_bytes
        rows = await self._run("fetch_blobs", lambda con: con.fetch(sql, wanted, cap))
        return {bytes(row[0]): bytes(row[1]) for row in rows}

    async def collect_garbage(self) -> int:
        """Return 0: a blob is deleted in the transaction that drops its last reference."""
        self._check_open()
        return 0

    async def _enqueue(
        self,
        workflow_id: str,
        step: int,
        data: bytes,
        keep_last: int | None,
        fence: Lease | None,
        split: SplitResult | None,
    ) -> None:
        token = None if fence is None else fence_token(fence, workflow_id)
        await self._ensure_open()
        self._check_open()
        item = _Write(
            workflow_id,
            step,
            data,
            keep_last,
            token,
            asyncio.get_running_loop().create_future(),
            split,
        )
        self._queue.append(item)
        if self._active_writers < self._write_concurrency:
            self._active_writers += 1
            task = asyncio.create_task(self._writer())
            self._writers.add(task)
            task.add_done_callback(self._writers.discard)
        # Cancelling this await cancels the future: a writer drops it while it is queued.
        await item.future

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest when ``step`` is None), or None."""
        self._check_open()
        check_workflow_id(workflow_id)
        if step is None:
            sql, args = self._sql.latest, [workflow_id, self._max_record_bytes]
        else:
            sql, args = self._sql.at_step, [workflow_id, check_step(step), self._max_record_bytes]
        row = await self._run("load", lambda con: con.fetchrow(sql, *args))
        return None if row is None else self._record(workflow_id, row)

    async def scan(
        self,
        workflow_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[StoredCheckpoint]:
        """Return records with ``after < step < before`` in step order, at most ``limit``."""
        self._check_open()
        check_workflow_id(workflow_id)
        after = check_optional_step(after, "after")
        before = check_optional_step(before, "before")
        limit = check_limit(limit)
        upper = _MAX_STEP if before is None else before - 1
        sql = self._sql.scan_desc if descending else self._sql.scan_asc
        args = (workflow_id, -1 if after is None else after, upper, limit, self._max_record_bytes)
        rows = await self._run("scan", lambda con: con.fetch(sql, *args))
        return [self._record(workflow_id, row) for row in rows]

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step) is stored."""
        self._check_open()
        check_workflow_id(workflow_id)
        args: list[object]
        if step is None:
            sql, args = self._sql.exists_any, [workflow_id]
        else:
            sql, args = self._sql.exists_step, [workflow_id, check_step(step)]
        return bool(await self._run("exists", lambda con: con.fetchval(sql, *args)))

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow; return whether anything was deleted.

        Not retried after a lost connection (the answer would be unreliable): that raises
        :class:`StorageBackendError`, and the delete may or may not have committed.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        args: list[object]
        if step is None:
            sql, args = self._sql.delete_all, [workflow_id]
        else:
            sql, args = self._sql.delete_step, [workflow_id, check_step(step)]

        async def delete(con: Any) -> bool:
            async with con.transaction():
                if step is None:
                    count, records = await con.fetchrow(sql, *args)
                    found = bool(count)
                else:
                    rows = await con.fetch(sql, *args)
                    found, records = bool(rows), [row[0] for row in rows]
                if records:
                    await self._lock_blobs(con)
                    await self._release_records(con, records)
            return found

        return await self._run("delete", delete, retry=False)

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, in code point order."""
        self._check_open()
        rows = await self._run("list_workflows", lambda con: con.fetch(self._sql.workflows))
        return [str(row[0]) for row in rows]

    # --- workflow records and leases (WorkflowStorage) ----------------------------------

    async def set_workflow_status(
        self, workflow_id: str, status: WorkflowStatus, *, fence: Lease | None = None
    ) -> WorkflowRecord:
        """Create or update the workflow's record with ``status`` (fenced by ``fence``)."""
        self._check_open()
        check_workflow_id(workflow_id)
        args: list[object] = [workflow_id, WorkflowStatus(status).value]
        sql = self._sql.status_upsert
        if fence is not None:
            sql = self._sql.status_fenced
            args.append(fence_token(fence, workflow_id))
        row = await self._run("set_workflow_status", lambda con: con.fetchrow(sql, *args))
        if row is None:
            raise _lost(workflow_id, fence)
        return _workflow_record(row)

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        self._check_open()
        check_workflow_id(workflow_id)
        sql = self._sql.get_record
        row = await self._run("get_workflow", lambda con: con.fetchrow(sql, workflow_id))
        return None if row is None else _workflow_record(row)

    async def list_workflow_records(
        self, status: WorkflowStatus | None = None
    ) -> list[WorkflowRecord]:
        """Records ordered by workflow id (code point order), optionally only ``status``."""
        self._check_open()
        value = None if status is None else WorkflowStatus(status).value
        sql = self._sql.list_records
        rows = await self._run("list_workflow_records", lambda con: con.fetch(sql, value))
        return [_workflow_record(row) for row in rows]

    async def acquire_lease(self, workflow_id: str, owner: str, ttl: float) -> Lease:
        """Grant the lease if it is free, expired or already ``owner``'s (a new token).

        Not retried after a lost connection (a grant may have committed): that raises
        :class:`StorageBackendError`; acquiring again as the same owner is safe.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        ttl = check_ttl(ttl)

        async def grant(con: Any) -> Any:
            for _ in range(3):
                row = await con.fetchrow(self._sql.acquire, workflow_id, owner, ttl)
                if row is not None:
                    return row
                held = await con.fetchrow(self._sql.holder, workflow_id)
                if held is not None and held[0] is not None and not held[2]:
                    raise LeaseHeldError(
                        f"workflow {workflow_id!r} is leased by {held[0]!r} until {held[1]}"
                    )
                # Released or expired between the two statements: try again.
            raise LeaseHeldError(f"workflow {workflow_id!r} is contended; try again")

        row = await self._run("acquire_lease", grant, retry=False)
        return Lease(workflow_id=workflow_id, owner=owner, token=row[0], expires_at=row[1], ttl=ttl)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend a lease whose token is still current to ``ttl`` seconds from now."""
        self._check_open()
        ttl = check_ttl(ttl)
        sql, args = self._sql.renew, [lease.workflow_id, lease.token, lease.owner, ttl]
        expires = await self._run("renew_lease", lambda con: con.fetchval(sql, *args))
        if expires is None:
            raise _lost(lease.workflow_id, lease)
        return lease.model_copy(update={"expires_at": expires, "ttl": ttl})

    async def release_lease(self, lease: Lease) -> None:
        """Free a current lease; a stale one is ignored."""
        self._check_open()
        sql, args = self._sql.release, [lease.workflow_id, lease.token]
        await self._run("release_lease", lambda con: con.execute(sql, *args))

    async def claim_next_workflow(self, owner: str, ttl: float) -> Lease | None:
        """Lease the oldest unfinished workflow whose lease is free or expired, or None.

        ``FOR UPDATE SKIP LOCKED``: concurrent claimers (in any process) get distinct
        workflows. Not retried after a lost connection (a claim may have committed; its
        lease then simply expires).
        """
        self._check_open()
        ttl = check_ttl(ttl)
        sql = self._sql.claim
        row = await self._run(
            "claim_next_workflow", lambda con: con.fetchrow(sql, owner, ttl), retry=False
        )
        if row is None:
            return None
        return Lease(workflow_id=row[0], owner=owner, token=row[1], expires_at=row[2], ttl=ttl)

    async def close(self) -> None:
        """Wait for queued and in-flight writes, then close the pool if this storage owns it."""
        if self._closed:
            return
        self._closed = True
        while self._writers:
            await asyncio.gather(*self._writers, return_exceptions=True)
        async with self._open_lock:
            pool, self._pool = self._pool, None
            if pool is not None and self._dsn is not None:
                await pool.close()

    # --- opening ------------------------------------------------------------------------

    async def _ensure_open(self) -> Any:
        pool = self._pool
        if pool is not None:
            return pool
        async with self._open_lock:
            self._check_open()
            if self._pool is None:
                self._pool = await self._open()
            return self._pool

    async def _open(self) -> Any:
        pg = _import_asyncpg()
        errors = _driver_errors(pg)
        pool: Any = None
        try:
            if self._dsn is None:
                pool = self._given_pool
            else:
                pool = await pg.create_pool(self._dsn, **self._pool_options)
            async with pool.acquire() as con:
                await migrate(con, self._quoted, self._schema)
        except BaseException as exc:
            if pool is not None and self._dsn is not None:
                pool.terminate()
            if isinstance(exc, errors):
                raise StorageBackendError(
                    f"cannot open PostgreSQL store (schema {self._schema!r}): {_describe(exc)}"
                ) from exc
            raise
        return pool

    # --- running statements -------------------------------------------------------------

    async def _run(self, what: str, op: Callable[[Any], Awaitable[T]], *, retry: bool = True) -> T:
        """Run ``op`` on a pooled connection; map driver errors; retry a lost connection."""
        pool = await self._ensure_open()
        errors = _driver_errors(_import_asyncpg())
        attempt = 0
        while True:
            try:
                return await self._on_connection(pool, op)
            except errors as exc:
                if self._closed and self._pool is None:
                    raise StorageClosedError(f"{type(self).__name__} is closed") from exc
                if retry and attempt < self._retries and _is_transient(exc):
                    attempt += 1
                    self.stats.retries += 1
                    continue
                raise StorageBackendError(f"PostgreSQL {what} failed: {_describe(exc)}") from exc

    @staticmethod
    async def _on_connection(pool: Any, op: Callable[[Any], Awaitable[T]]) -> T:
        async with pool.acquire() as con:
            try:
                return await op(con)
            except Exception as exc:
                if _connection_lost(exc):
                    # Never hand a broken connection back to the pool. If asyncpg already saw
                    # it close, it has detached it from the proxy and terminate() raises;
                    # the original error is the one to report (and to retry on).
                    with contextlib.suppress(Exception):
                        con.terminate()
                raise

    def _record(self, workflow_id: str, row: Any) -> StoredCheckpoint:
        step, size, data = row[0], row[1], row[2]
        if data is None:
            raise CheckpointCorruptedError(
                f"record of {size} bytes exceeds max_record_bytes={self._max_record_bytes}",
                workflow_id=workflow_id,
                step=step,
            )
        return StoredCheckpoint(int(step), bytes(data))

    # --- the group-commit writer --------------------------------------------------------

    async def _writer(self) -> None:
        try:
            while batch := self._take_batch():
                try:
                    await self._write_batch(batch)
                finally:
                    self._in_flight.difference_update(w.workflow_id for w in batch)
                    if batch[0].split is not None:
                        self._trees_in_flight = False
        finally:
            # Counted down in the same step that found the queue empty: a save queued just
            # after sees the writer gone and starts one (the task's done callbacks run later).
            self._active_writers -= 1

    def _take_batch(self) -> list[_Write]:
        """Take queued rows for one transaction, oldest first.

        A workflow being written by another batch, or whose rows in this batch would repeat
        a step or mix ``keep_last`` values, is left queued (with its later rows, keeping
        their order): retention then stays exact, and one statement never touches a row
        twice.

        A batch holds either trees (``save_tree``) or plain rows, and one tree batch at most
        is in flight: tree batches of a store commit one at a time anyway (the blob lock),
        so plain rows go on through the other writers instead of waiting behind them.
        """
        batch: list[_Write] = []
        keeps: dict[str, int | None] = {}
        steps: set[tuple[str, int]] = set()
        blocked: set[str] = set()
        left: deque[_Write] = deque()
        size = 0
        while self._queue:
            item = self._queue.popleft()
            if item.future.done():  # cancelled while queued: never written
                continue
            wf = item.workflow_id
            weight = _weight(item)
            full = len(batch) >= self._max_batch_rows or (
                batch and size + weight > self._max_batch_bytes
            )
            clash = wf in keeps and (keeps[wf] != item.keep_last or (wf, item.step) in steps)
            tree = item.split is not None
            other_kind = (
                (batch[0].split is not None) != tree if batch else (tree and self._trees_in_flight)
            )
            if full or wf in blocked or wf in self._in_flight or clash or other_kind:
                blocked.add(wf)
                left.append(item)
                continue
            batch.append(item)
            keeps[wf] = item.keep_last
            steps.add((wf, item.step))
            size += weight
        self._queue = left
        self._in_flight.update(keeps)
        if batch and batch[0].split is not None:
            self._trees_in_flight = True
        return batch

    async def _write_batch(self, batch: list[_Write]) -> None:
        """Commit the batch, then resolve each caller; on failure, find the guilty rows."""
        try:
            await self._run_write(batch)
        except Exception as exc:
            if len(batch) > 1 and not _is_transient(exc):
                # One bad row fails the whole statement: write rows one by one so that only
                # its own caller sees the error.
                self.stats.split_batches += 1
                for item in batch:
                    await self._write_batch([item])
                return
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(self._write_error(exc))
            return
        except BaseException:
            for item in batch:
                item.future.cancel()
            raise
        for item in batch:
            if not item.future.done():
                item.future.set_result(None)

    def _write_error(self, exc: Exception) -> Exception:
        if isinstance(exc, CheckpointError):
            return exc
        error = StorageBackendError(f"PostgreSQL save failed: {_describe(exc)}")
        error.__cause__ = exc
        return error

    async def _run_write(self, batch: list[_Write]) -> None:
        # A stable order makes concurrent writers (other processes too) lock rows in the same
        # order, so two batches cannot deadlock on their records.
        batch = sorted(batch, key=lambda w: (w.workflow_id, w.step))
        args = (
            [w.workflow_id for w in batch],
            [w.step for w in batch],
            [w.data for w in batch],
            [w.token for w in batch],
        )
        keeps = {w.workflow_id: w.keep_last for w in batch if w.keep_last is not None}
        trees = [w for w in batch if w.split is not None]
        written: set[tuple[str, int]] = set()

        def record(rows: list[Any], committed: bool) -> Counter[bytes]:
            released: Counter[bytes] = Counter()
            for row in rows:
                written.add((row[0], row[1]))
                if row[2] and not row[3] and not committed:
                    # Replaced a row this statement's snapshot did not see, so its refs
                    # (if it was version 2) were not handed back: run the batch again.
                    raise _Raced("a record was written concurrently; the batch runs again")
                if row[4] is not None:
                    released.update(held_root_refs(row[4]))
            return released

        async def write(con: Any) -> None:
            written.clear()
            if not keeps and not trees:
                # One statement, its implicit transaction committing before it returns,
                # unless it would replace a version-2 record (refs to release): then it
                # writes nothing and the batch runs in a transaction below.
                rows = await con.fetch(self._sql.upsert, *args, True)
                if rows:
                    record(rows, committed=True)
                    return
            async with con.transaction():
                # Adds before releases: a blob shared by a replaced record and its
                # replacement never drops to 0 in between.
                if trees:
                    await self._lock_blobs(con)
                    await aadd_references(
                        [w.split for w in trees if w.split is not None],
                        _BlobLevels(con, self._sql, self.stats),
                    )
                released = record(await con.fetch(self._sql.upsert, *args, False), committed=False)
                for w in trees:
                    if (w.workflow_id, w.step) not in written and w.split is not None:
                        released.update(w.split.root_refs)  # stale lease: undo its adds
                # Only workflows that got a row: a stale writer prunes nothing.
                prune = {wf: n for wf, n in keeps.items() if any(w == wf for w, _ in written)}
                if prune:
                    rows = await con.fetch(self._sql.prune, list(prune), list(prune.values()))
                    for row in rows:
                        released.update(held_root_refs(row[0]))
                if released and not trees:
                    await self._lock_blobs(con)
                await self._release(con, released.elements())

        errors: tuple[type[BaseException], ...] = (*_driver_errors(_import_asyncpg()), _Raced)
        attempt = conflicts = 0
        while True:
            try:
                await self._on_connection(self._pool, write)
                break
            except errors as exc:
                # The transaction is all or nothing, so after a lost deadlock running it again
                # is safe. If the commit's fate is unknown because the connection died and it
                # did commit, the run again adds the trees' refs a second time, but its upsert
                # then replaces the batch's own records and releases their refs: the counts
                # come out exact either way, and the upsert and the prune are idempotent.
                if _conflict(exc) and conflicts < _CONFLICT_ATTEMPTS:
                    conflicts += 1
                    self.stats.retries += 1
                    await asyncio.sleep(random.uniform(0, 0.002 * conflicts))
                    continue
                if attempt < self._retries and _is_transient(exc):
                    attempt += 1
                    self.stats.retries += 1
                    continue
                raise
        self.stats.rows += len(written)
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        for item in batch:
            if (item.workflow_id, item.step) not in written and not item.future.done():
                item.future.set_exception(
                    LeaseLostError(
                        f"lease {item.token} on workflow {item.workflow_id!r} is no longer "
                        "current; the checkpoint was not written"
                    )
                )

    # --- reference counts (docs/incremental.md, section 8) --------------------------------

    async def _lock_blobs(self, con: Any) -> None:
        """Serialise this transaction's blob counting with every other writer's."""
        await con.execute(self._sql.blob_lock, self._schema)

    async def _release(self, con: Any, released: Iterable[bytes]) -> None:
        """Release the counted hashes level by level, then drop the blobs that reached 0."""
        freed = await arelease_references(released, _BlobLevels(con, self._sql, self.stats))
        if freed:
            await con.execute(self._sql.blob_drop, freed)

    async def _release_records(self, con: Any, records: Iterable[bytes | None]) -> None:
        # NULL: a version-1 record, which holds no refs.
        await self._release(
            con, [h for data in records if data is not None for h in held_root_refs(data)]
        )


class _BlobLevels:
    """:class:`~aiocheckpoint.refcounts.AsyncRefCounts`: one statement per tree level.

    Hashes go in sorted, so concurrent transactions lock blob rows in the same order.
    """

    def __init__(self, con: Any, sql: Sql, stats: WriteStats) -> None:
        self._con = con
        self._sql = sql
        self._stats = stats

    async def upsert(self, rows: Rows) -> list[bytes]:
        """One ``INSERT ... ON CONFLICT DO UPDATE`` for the level; return the hashes inserted."""
        hashes = sorted(rows)
        counts: list[int] = []
        data: list[bytes] = []
        for h in hashes:
            n, blob = rows[h]
            if blob is None:  # the statement needs every blob's bytes, stored or not
                raise missing_blob(h)
            counts.append(n)
            data.append(blob)
        result = await self._con.fetch(self._sql.blob_add, hashes, counts, data)
        self._stats.blob_statements += 1
        # Inserted now if its count is what was sent: an existing blob ends above that.
        return [bytes(r[0]) for r in result if r[1] == rows[bytes(r[0])][0]]

    async def subtract(self, counts: Mapping[bytes, int]) -> dict[bytes, bytes]:
        """One ``UPDATE`` for the level; return the blobs at 0 (dropped after the walk)."""
        hashes = sorted(counts)
        result = await self._con.fetch(self._sql.blob_release, hashes, [counts[h] for h in hashes])
        self._stats.blob_statements += 1
        return {bytes(r[0]): bytes(r[2]) for r in result if r[1] <= 0}


def _weight(item: _Write) -> int:
    """What a queued write adds to its batch's size: its record and its blobs."""
    if item.split is None:
        return len(item.data)
    return len(item.data) + sum(len(b) for b in item.split.blobs.values())


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _lost(workflow_id: str, lease: Lease | None) -> LeaseLostError:
    token = "?" if lease is None else lease.token
    return LeaseLostError(f"lease {token} on workflow {workflow_id!r} is no longer current")


def _workflow_record(row: Any) -> WorkflowRecord:
    return WorkflowRecord(
        workflow_id=row[0],
        status=WorkflowStatus(row[1]),
        created_at=row[2],
        updated_at=row[3],
        finished_at=row[4],
        lease_owner=row[5],
        lease_expires_at=row[6],
        fencing_token=row[7],
    )
