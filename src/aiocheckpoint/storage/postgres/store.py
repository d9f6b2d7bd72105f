"""The PostgreSQL store's public class: its options, the storage protocol, argument checks.

The work is done by the package's parts: :mod:`.connection` (the pool, retries),
:mod:`.batching` (group commit of saves), :mod:`.records` (reads and deletes),
:mod:`.blobs` (reference counts of incremental checkpoints), :mod:`.leases` (workflow
records and leases), over the tables of :mod:`.schema` and the statements of :mod:`.sql`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..._validation import (
    check_limit,
    check_optional_step,
    check_save,
    check_step,
    check_workflow_id,
)
from ...errors import InvalidArgumentError
from ...format import SplitResult, TreeParams
from ...leases import (
    Lease,
    WorkflowRecord,
    WorkflowStatus,
    check_kind,
    check_ttl,
    fence_token,
)
from ..base import (
    DEFAULT_MAX_RECORD_BYTES,
    BaseStorage,
    Cut,
    History,
    StoredCheckpoint,
    StoredEffect,
    check_effect_key,
    check_record_size,
)
from ..events import (
    MAX_EVENT_PAGE,
    EventNote,
    Reseal,
    StoredEvent,
    check_event_page,
    check_events,
    check_reseals,
    check_sleep,
)
from ..queries import StepInfo, WorkflowQuery
from ..turns import in_turns
from .batching import BatchLimits, GroupCommit, Write
from .blobs import Blobs
from .connection import Connection
from .control import Control
from .dsn import check_connect_options, check_dsn
from .effects import Effects
from .events import EventSql
from .leases import Leases, events_page, put_events, reseal
from .records import Records
from .schema import quote_schema
from .sql import Sql
from .stats import WriteStats
from .sweeps import Sweeps

__all__ = ["PostgresCheckpointStorage"]


class PostgresCheckpointStorage(BaseStorage):
    """Stores checkpoint records in PostgreSQL, in one table of its own schema.

    ``dsn_or_pool`` is a connection string (the storage then creates, owns and closes an
    asyncpg pool of ``min_size``..``max_size`` connections; ``connect_kwargs`` go to
    ``asyncpg.create_pool``) or an existing ``asyncpg.Pool`` (used as is, never closed).
    A DSN asyncpg could not parse (host, port, query) and an option it does not take raise
    :class:`~aiocheckpoint.InvalidArgumentError` here. Nothing connects until the first
    call, which also creates or migrates the schema.

    Every operation is one primary-key lookup or range scan. ``save`` is durable when it
    returns (the row's transaction has committed). A connection lost mid-operation is
    retried up to ``retries`` times on a fresh connection for idempotent calls (save, load,
    scan, exists, list_workflows); otherwise it raises :class:`StorageBackendError`.
    """

    db_system = "postgresql"

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
        quoted = quote_schema(schema)
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
        if isinstance(dsn_or_pool, str):
            try:
                check_dsn(dsn_or_pool)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"bad PostgreSQL DSN: {exc}") from None
        elif not hasattr(dsn_or_pool, "acquire"):
            raise InvalidArgumentError(
                f"dsn_or_pool must be a DSN str or an asyncpg pool, not {type(dsn_or_pool)!r}"
            )
        check_connect_options(connect_kwargs)
        self._params = blob_params or TreeParams()
        self._schema = schema
        self._max_record_bytes = max_record_bytes
        self.stats = WriteStats()
        settings = {"synchronous_commit": "on", **connect_kwargs.pop("server_settings", {})}
        pool_options = {
            "min_size": min_size,
            "max_size": max_size,
            # Durability must not depend on the server's default: a commit returns only
            # after its WAL record is flushed, unless the caller explicitly asks otherwise.
            "server_settings": settings,
            # The store leaves no session state on a connection (no SET, LISTEN, cursor or
            # session-level advisory lock; asyncpg still rolls back an open transaction), so
            # asyncpg's reset query on each release would only cost a round trip.
            "reset": _keep_session,
            **connect_kwargs,
        }
        self._connection = Connection(
            dsn_or_pool,
            schema=schema,
            quoted=quoted,
            pool_options=pool_options,
            retries=retries,
            stats=self.stats,
            owner=type(self).__name__,
            check_open=self._check_open,
        )
        sql = Sql.for_schema(quoted)
        blobs = Blobs(sql, schema, self.stats, max_record_bytes)
        self._records = Records(self._connection, sql, blobs, max_record_bytes)
        self._event_sql = EventSql.build(quoted, sql)
        self._workflows_table = sql.workflows_table
        self._leases = Leases(self._connection, sql, self._event_sql)
        self._control = Control(self._connection, sql, self._leases, self._event_sql)
        limits = BatchLimits(write_concurrency, max_batch_rows, max_batch_bytes)
        self._group_commit = GroupCommit(self._connection, sql, blobs, self.stats, limits)
        self._effects = Effects(self._connection, quoted, max_record_bytes)
        self._sweeps = Sweeps(self._connection, quoted, self._records, max_record_bytes)

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
        step_info: StepInfo | None = None,
    ) -> None:
        """Store ``data`` as ``step``; with ``keep_last`` prune older steps in the same commit.

        Returns once the row is committed. Cancelled while still queued, the row is not
        written; cancelled once its batch is in flight, the batch completes whole. The
        workflow gets an UNFINISHED record if it has none. With ``fence``, the row is written
        only if ``fence.token`` is the workflow's current fencing token; otherwise this call
        (and only this one in its batch) raises :class:`~aiocheckpoint.LeaseLostError`.
        """
        self._check_open()
        self._check_write(workflow_id, step, keep_last)
        data = _bytes("data", data)
        check_record_size(data, self._max_record_bytes)
        await self._enqueue(workflow_id, step, data, keep_last, fence, None, step_info)

    async def save_tree(
        self,
        workflow_id: str,
        step: int,
        record: bytes,
        split: SplitResult,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
        step_info: StepInfo | None = None,
    ) -> None:
        """Store ``split``'s blobs and the version-2 ``record`` in one transaction.

        Queued and batched like :meth:`save` (same cancellation, fencing and retention
        behaviour). In the batch's transaction, each tree level costs one statement for all
        the batch's trees: blobs already stored get one more reference and are not
        descended into, missing ones are inserted. The refs of a record this replaces or
        ``keep_last`` prunes are released after, in the same transaction. A blob the save
        sends over ``max_record_bytes`` raises :class:`~aiocheckpoint.InvalidArgumentError`
        for this caller alone, and nothing of its tree is stored.
        """
        self._check_open()
        self._check_write(workflow_id, step, keep_last)
        if not isinstance(split, SplitResult):
            raise InvalidArgumentError(f"split must be a SplitResult, not {type(split).__name__}")
        record = _bytes("record", record)
        check_record_size(record, self._max_record_bytes)
        # The blobs' sizes are checked as they are sent (Blobs.add): only the new part of a
        # large tree is, not every blob of it at every save.
        await self._enqueue(workflow_id, step, record, keep_last, fence, split, step_info)

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes``: one indexed statement.

        A blob over ``max_record_bytes`` is left out (the reader reports it as missing).
        """
        self._check_open()
        if any(not isinstance(h, (bytes, bytearray, memoryview)) for h in hashes):
            raise InvalidArgumentError("fetch_blobs takes a collection of bytes hashes")
        return await self._records.fetch_blobs([bytes(h) for h in hashes])

    async def compact(self) -> tuple[int, int]:
        """``VACUUM (ANALYZE)`` the store's tables (``CompactingStorage``): bytes before, after."""
        self._check_open()
        return await self._sweeps.compact()

    async def collect_garbage(self) -> int:
        """Return 0: a blob is deleted in the transaction that drops its last reference."""
        self._check_open()
        return 0

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest when ``step`` is None), or None."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._records.load(workflow_id, None if step is None else check_step(step))

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
        return await self._records.scan(workflow_id, after, before, limit, descending)

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step) is stored."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._records.exists(workflow_id, None if step is None else check_step(step))

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow; return whether anything was deleted.

        Not retried after a lost connection (the answer would be unreliable): that raises
        :class:`StorageBackendError`, and the delete may or may not have committed.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        step = None if step is None else check_step(step)
        return await self._records.delete(workflow_id, step)

    async def delete_workflow(self, workflow_id: str, *, updated_at: datetime) -> int | None:
        """Delete the workflow whole if its record is untouched since ``updated_at``.

        Returns its checkpoint records' bytes, or None when nothing was deleted. The record
        row is deleted first, so a save (which updates that row before its checkpoint rows)
        either committed first and moved ``updated_at``, or waits and writes a new workflow.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._records.delete_untouched(workflow_id, updated_at)

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, in code point order."""
        self._check_open()
        return await self._records.list_workflows()

    # --- batched sweeps (SweepStorage) ---------------------------------------------------

    def saving_lately(self) -> bool:
        """Whether a save was queued lately: a sweep then rests after each of its writes."""
        return self._group_commit.saving_lately()

    async def histories(
        self,
        *,
        after: str | None,
        limit: int,
        more_than: int,
        max_records: int,
        max_bytes: int,
    ) -> list[History]:
        """The next ``limit`` histories after ``after``, in one read (``SweepStorage``)."""
        self._check_open()
        after = None if after is None else check_workflow_id(after)
        return await self._sweeps.histories(after, limit, (more_than, max_records, max_bytes))

    async def thin_many(self, cuts: Sequence[Cut]) -> tuple[list[tuple[str, int]], int]:
        """Delete every cut in one statement (``SweepStorage``).

        Not retried after a lost connection, like :meth:`delete`.
        """
        self._check_open()
        await in_turns(_check_cut, cuts)
        return await self._sweeps.thin_many(cuts)

    async def delete_workflows(self, pairs: Sequence[tuple[str, datetime]]) -> list[int | None]:
        """Delete each untouched workflow whole, in one statement (``SweepStorage``)."""
        self._check_open()
        await in_turns(lambda pair: check_workflow_id(pair[0]), pairs)
        return await self._sweeps.delete_workflows(pairs)

    # --- the effect journal (EffectStorage) ----------------------------------------------

    async def put_effect(
        self,
        workflow_id: str,
        step: int,
        key: str,
        data: bytes,
        *,
        in_doubt: bool,
        fence: Lease | None = None,
    ) -> None:
        """Store an effect record of ``step``, fenced if asked, in the group commit.

        It shares the batches and transactions of concurrent checkpoints (one commit).
        """
        self._check_open()
        check_workflow_id(workflow_id)
        step, key = check_step(step), check_effect_key(key)
        data = _bytes("data", data)
        check_record_size(data, self._max_record_bytes)
        token = None if fence is None else fence_token(fence, workflow_id)
        await self._connection.pool()
        self._check_open()
        future = asyncio.get_running_loop().create_future()
        write = Write(
            workflow_id, step, data, None, token, future, key=key, in_doubt=bool(in_doubt)
        )
        await self._group_commit.write(write)

    async def load_effects(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """The effect records of ``step``, ordered by key (code point order)."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._effects.load(workflow_id, check_step(step))

    async def in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt, in code point order (a partial index)."""
        self._check_open()
        return await self._effects.in_doubt_workflows()

    async def in_doubt_page(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` workflows in doubt after ``after``, in code point order."""
        self._check_open()
        size = check_limit(limit)
        start = None if after is None else check_workflow_id(after)
        return await self._effects.in_doubt_page(start, size or 1)

    async def has_effects(self, workflow_id: str) -> bool:
        """Whether the workflow has any effect record (a probe of the primary key)."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._effects.has_any(workflow_id)

    async def in_doubt_effects(self, workflow_id: str) -> list[StoredEffect]:
        """The workflow's effect records in doubt, ordered by step then key (an index)."""
        self._check_open()
        return await self._effects.in_doubt_of(check_workflow_id(workflow_id))

    async def effect_workflows(self) -> list[str]:
        """Every workflow with at least one effect record, in code point order."""
        self._check_open()
        return await self._effects.workflows()

    async def effect_steps(self, workflow_id: str) -> list[int]:
        """The steps of ``workflow_id`` with effect records, ascending (an index range)."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._effects.steps(workflow_id)

    async def drop_orphan_effects(self, workflow_id: str, below: int) -> int:
        """Delete the effect records of steps below ``below`` without a checkpoint."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._effects.drop_orphans(workflow_id, check_step(below))

    # --- workflow records and leases (WorkflowStorage) ----------------------------------

    async def set_workflow_status(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        *,
        fence: Lease | None = None,
        note: EventNote | None = None,
    ) -> WorkflowRecord:
        """Create or update the workflow's record with ``status`` (fenced by ``fence``).

        The same statement appends the change's event (``note``'s, when given).
        """
        self._check_open()
        check_workflow_id(workflow_id)
        status = WorkflowStatus(status)
        token = None if fence is None else fence_token(fence, workflow_id)
        return await self._leases.set_status(workflow_id, status, token, fence, note)

    async def sleep_workflow(
        self, workflow_id: str, seconds: float, *, fence: Lease | None = None
    ) -> WorkflowRecord:
        """UNFINISHED, claimable ``seconds`` from now (the server's clock); ``sleeping``."""
        self._check_open()
        check_workflow_id(workflow_id)
        token = None if fence is None else fence_token(fence, workflow_id)
        return await self._leases.sleep(workflow_id, check_sleep(seconds), token, fence)

    async def put_events(
        self, workflow_id: str, events: Sequence[StoredEvent], *, replace: bool
    ) -> None:
        """Append carried events as they are; ``replace``: drop the workflow's others first."""
        self._check_open()
        check_workflow_id(workflow_id)
        carried = check_events(events)
        await put_events(self._connection, self._event_sql, workflow_id, carried, bool(replace))

    async def reseal(self, workflow_id: str, changes: Sequence[Reseal]) -> int:
        """Replace each change's text that still holds its ``old``; how many were replaced."""
        self._check_open()
        check_workflow_id(workflow_id)
        events, workflows = self._event_sql.table, self._workflows_table
        return await reseal(
            self._connection, events, workflows, workflow_id, check_reseals(changes)
        )

    async def get_events(
        self, workflow_id: str, *, after: int | None = None, limit: int = MAX_EVENT_PAGE
    ) -> list[StoredEvent]:
        """The workflow's events after sequence number ``after``, oldest first."""
        self._check_open()
        check_workflow_id(workflow_id)
        after, limit = check_event_page(after, limit)
        return await events_page(self._connection, self._event_sql, workflow_id, after, limit)

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._leases.get(workflow_id)

    async def list_workflow_records(
        self, status: WorkflowStatus | None = None
    ) -> list[WorkflowRecord]:
        """Records ordered by workflow id (code point order), optionally only ``status``."""
        self._check_open()
        return await self._leases.records(None if status is None else WorkflowStatus(status))

    async def register_workflow(
        self, workflow_id: str, *, metadata: str | None = None, kind: str | None = None
    ) -> WorkflowRecord:
        """Create the record if missing; with ``metadata`` (JSON text), replace its metadata.

        A new record takes ``kind`` (``"workflow"`` when None); an existing record of the
        default kind takes a ``kind`` that is not None, one of any other kind keeps it.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        kind = None if kind is None else check_kind(kind)
        return await self._leases.register(workflow_id, metadata, kind)

    async def resume_workflow(self, workflow_id: str, resume_input: str) -> WorkflowRecord:
        """Make a PAUSED workflow UNFINISHED, holding ``resume_input`` for its next run."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._leases.resume(workflow_id, resume_input)

    async def cancel_workflow(self, workflow_id: str, reason: str | None) -> WorkflowRecord:
        """Cancel an UNFINISHED or PAUSED workflow and revoke its lease (``lifecycle``)."""
        self._check_open()
        return await self._control.cancel(check_workflow_id(workflow_id), reason)

    async def retry_workflow(self, workflow_id: str) -> WorkflowRecord:
        """Make a FAILED or CANCELLED workflow UNFINISHED with a fresh attempt budget."""
        self._check_open()
        return await self._control.retry(check_workflow_id(workflow_id))

    async def record_failure(
        self,
        workflow_id: str,
        error: str,
        *,
        retry_delays: tuple[float, ...] = (),
        fence: Lease | None = None,
    ) -> WorkflowRecord:
        """Count a failed run and store ``error``; retry it after a delay, or mark it FAILED."""
        self._check_open()
        check_workflow_id(workflow_id)
        token = None if fence is None else fence_token(fence, workflow_id)
        return await self._leases.fail(workflow_id, error, tuple(retry_delays), token, fence)

    async def query_workflow_records(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        """The records passing ``query``, ordered by workflow id: one indexed statement."""
        self._check_open()
        return await self._leases.query(query)

    async def acquire_lease(self, workflow_id: str, owner: str, ttl: float) -> Lease:
        """Grant the lease if it is free, expired or already ``owner``'s (a new token).

        Not retried after a lost connection (a grant may have committed): that raises
        :class:`StorageBackendError`; acquiring again as the same owner is safe.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._leases.acquire(workflow_id, owner, check_ttl(ttl))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend a lease whose token is still current to ``ttl`` seconds from now."""
        self._check_open()
        return await self._leases.renew(lease, check_ttl(ttl))

    async def release_lease(self, lease: Lease) -> None:
        """Free a current lease; a stale one is ignored."""
        self._check_open()
        await self._leases.release(lease)

    async def claim_next_workflow(self, owner: str, ttl: float) -> Lease | None:
        """Lease the oldest unfinished workflow whose lease is free or expired, or None.

        ``FOR UPDATE SKIP LOCKED``: concurrent claimers (in any process) get distinct
        workflows. Not retried after a lost connection (a claim may have committed; its
        lease then simply expires).
        """
        self._check_open()
        return await self._leases.claim(owner, check_ttl(ttl))

    async def close(self) -> None:
        """Wait for queued and in-flight writes, then close the pool if this storage owns it."""
        if self._closed:
            return
        self._closed = True
        await self._group_commit.drain()
        await self._connection.close()

    # --- internals ----------------------------------------------------------------------

    @staticmethod
    def _check_write(workflow_id: str, step: int, keep_last: int | None) -> None:
        check_save(workflow_id, step, keep_last)

    async def _enqueue(
        self,
        workflow_id: str,
        step: int,
        data: bytes,
        keep_last: int | None,
        fence: Lease | None,
        split: SplitResult | None,
        step_info: StepInfo | None,
    ) -> None:
        token = None if fence is None else fence_token(fence, workflow_id)
        await self._connection.pool()
        self._check_open()
        future = asyncio.get_running_loop().create_future()
        await self._group_commit.write(
            Write(workflow_id, step, data, keep_last, token, future, split, step_info)
        )


async def _keep_session(connection: object) -> None:
    """The pool's ``reset``: nothing to undo on a connection handed back (see ``__init__``)."""


def _bytes(name: str, value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"{name} must be bytes, not {type(value).__qualname__}")
    return bytes(value)


def _check_cut(cut: Cut) -> None:
    check_workflow_id(cut.workflow_id)
    for step in cut.steps:
        check_step(step)
    if cut.below is not None:
        check_step(cut.below)
