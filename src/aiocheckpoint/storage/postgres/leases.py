"""Workflow records and leases in PostgreSQL (:class:`~aiocheckpoint.WorkflowStorage`).

They live in the ``workflows`` table; lease expiry is judged by the server's clock (``now()``)
and fencing tokens come from one sequence per store. A fenced save rides in the group commit
(:mod:`.batching`): its token is compared with the record's, locked ``FOR SHARE``, in the
batch statement. See docs/leases.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...errors import (
    CheckpointNotFoundError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLostError,
)
from ...leases import Lease, WorkflowRecord, WorkflowStatus
from ..events import EventNote, Reseal, StoredEvent, reseal_fields
from ..lifecycle import CancelledRecordError, cancelled_refusal
from ..queries import WorkflowQuery, metadata_pairs, query_sql
from .connection import Connection
from .events import EventSql
from .minute import minute_bound
from .sql import RECORD_COLUMNS, Sql

__all__ = ["Leases", "events_page", "put_events", "query_statement", "record_from_row", "reseal"]


class Leases:
    """The lease and workflow-record statements of one store; arguments are checked already."""

    def __init__(self, connection: Connection, sql: Sql, events: EventSql) -> None:
        self._connection = connection
        self._sql = sql
        self._events = events

    async def set_status(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        token: int | None,
        lease: Lease | None,
        note: EventNote | None = None,
    ) -> WorkflowRecord:
        """Create or update the record with ``status``; only if ``token`` is current, if given.

        The statement appends the change's event (``note``'s, when given).
        """
        args: list[object] = [workflow_id, status.value]
        sql = self._events.status_upsert
        if token is not None:
            sql = self._events.status_fenced
            args.append(token)
        args += [None, None] if note is None else [note.kind.value, note.data]
        run = self._connection.run
        row = await run("set_workflow_status", lambda con: con.fetchrow(sql, *args))
        if row is None:
            raise await self._refused(workflow_id, token, lease)
        return _workflow_record(row)

    async def sleep(
        self, workflow_id: str, seconds: float, token: int | None, lease: Lease | None
    ) -> WorkflowRecord:
        """UNFINISHED, claimable ``seconds`` from now (the server's clock); ``sleeping``."""
        sql = self._events.sleep

        async def update(con: Any) -> Any:
            if token is not None:  # fenced: the record exists, one statement
                return await con.fetchrow(sql, workflow_id, seconds, token)
            async with con.transaction():
                await con.execute(self._sql.ensure, workflow_id)
                return await con.fetchrow(sql, workflow_id, seconds, token)

        row = await self._connection.run("sleep_workflow", update, retry=False)
        if row is None:
            raise await self._refused(workflow_id, token, lease)
        return _workflow_record(row)

    async def _refused(self, workflow_id: str, token: int | None, lease: Lease | None) -> Exception:
        """Why a status write wrote nothing: a lease no longer current, or a CANCELLED record.

        The statements carry both guards; this read only names the one that refused.
        """
        record = await self.get(workflow_id)
        if token is not None and (record is None or record.fencing_token != token):
            return lost(workflow_id, lease)
        if record is not None and record.status is WorkflowStatus.CANCELLED:
            return cancelled_refusal(record)
        return CancelledRecordError(workflow_id)  # retried since the guard refused

    async def get(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        sql = self._sql.get_record
        row = await self._connection.run("get_workflow", lambda con: con.fetchrow(sql, workflow_id))
        return None if row is None else _workflow_record(row)

    async def records(self, status: WorkflowStatus | None) -> list[WorkflowRecord]:
        """Records ordered by workflow id, optionally only those with ``status``."""
        value = None if status is None else status.value
        sql = self._sql.list_records
        run = self._connection.run
        rows = await run("list_workflow_records", lambda con: con.fetch(sql, value))
        return [_workflow_record(row) for row in rows]

    async def register(
        self, workflow_id: str, metadata: str | None, kind: str | None = None
    ) -> WorkflowRecord:
        """Create the record if missing; with ``metadata``, replace it and its index rows.

        A new record takes ``kind``; an existing one of the default kind does too.
        """
        sql = self._sql
        pairs = [] if metadata is None else metadata_pairs(json.loads(metadata))

        async def upsert(con: Any) -> Any:
            async with con.transaction():
                row = await con.fetchrow(sql.register, workflow_id, metadata, kind)
                if metadata is not None:
                    await con.execute(sql.metadata_drop, workflow_id)
                    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
                    await con.execute(sql.metadata_add, workflow_id, keys, values)
                return row

        return _workflow_record(await self._connection.run("register_workflow", upsert))

    async def resume(self, workflow_id: str, resume_input: str) -> WorkflowRecord:
        """Make a PAUSED workflow UNFINISHED with ``resume_input``; refuse any other status."""
        sql = self._events.resume
        run = self._connection.run
        row = await run("resume_workflow", lambda con: con.fetchrow(sql, workflow_id, resume_input))
        if row is not None:
            return _workflow_record(row)
        record = await self.get(workflow_id)
        if record is None:
            raise CheckpointNotFoundError(workflow_id)
        raise InvalidArgumentError(
            f"workflow {workflow_id!r} is {record.status}, not paused: nothing to resume"
        )

    async def fail(
        self,
        workflow_id: str,
        error: str,
        delays: tuple[float, ...],
        token: int | None,
        lease: Lease | None,
    ) -> WorkflowRecord:
        """Count a failed run: back to UNFINISHED with a retry time, or FAILED."""
        sql = self._sql

        async def update(con: Any) -> Any:
            async with con.transaction():
                if token is None:
                    await con.execute(sql.ensure, workflow_id)
                fail = self._events.fail
                return await con.fetchrow(fail, workflow_id, error, list(delays), token)

        # Not retried after a lost connection: it may have counted the attempt already.
        row = await self._connection.run("record_failure", update, retry=False)
        if row is None:
            raise await self._refused(workflow_id, token, lease)
        return _workflow_record(row)

    async def query(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        """One page of the records passing ``query``: one indexed statement."""
        sql, args = query_statement(self._sql, query)
        rows = await self._connection.run("query_workflows", lambda con: con.fetch(sql, *args))
        return [_workflow_record(row) for row in rows]

    async def acquire(self, workflow_id: str, owner: str, ttl: float) -> Lease:
        """Grant the lease if free, expired or ``owner``'s already; not retried (see the store)."""

        async def grant(con: Any) -> Any:
            for _ in range(3):
                row = await con.fetchrow(self._events.acquire, workflow_id, owner, ttl)
                if row is not None:
                    return row
                held = await con.fetchrow(self._sql.holder, workflow_id)
                if held is not None and held[0] is not None and not held[2]:
                    raise LeaseHeldError(
                        f"workflow {workflow_id!r} is leased by {held[0]!r} until {held[1]}"
                    )
                # Released or expired between the two statements: try again.
            raise LeaseHeldError(f"workflow {workflow_id!r} is contended; try again")

        row = await self._connection.run("acquire_lease", grant, retry=False)
        return Lease(workflow_id=workflow_id, owner=owner, token=row[0], expires_at=row[1], ttl=ttl)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend a lease whose token is still current to ``ttl`` seconds from now."""
        sql, args = self._sql.renew, [lease.workflow_id, lease.token, lease.owner, ttl]
        expires = await self._connection.run("renew_lease", lambda con: con.fetchval(sql, *args))
        if expires is None:
            raise lost(lease.workflow_id, lease)
        return lease.model_copy(update={"expires_at": expires, "ttl": ttl})

    async def release(self, lease: Lease) -> None:
        """Free a current lease; a stale one is ignored."""
        sql, args = self._sql.release, [lease.workflow_id, lease.token]
        await self._connection.run("release_lease", lambda con: con.execute(sql, *args))

    async def claim(self, owner: str, ttl: float) -> Lease | None:
        """Lease the oldest unfinished workflow whose lease is free or expired, or None."""
        sql = self._events.claim
        row = await self._connection.run(
            "claim_next_workflow", lambda con: con.fetchrow(sql, owner, ttl), retry=False
        )
        if row is None:
            return None
        return Lease(workflow_id=row[0], owner=owner, token=row[1], expires_at=row[2], ttl=ttl)


async def put_events(
    connection: Connection,
    sql: EventSql,
    workflow_id: str,
    events: list[StoredEvent],
    replace: bool,
) -> None:
    """Append carried events as they are, in one statement (after deleting, with ``replace``)."""
    columns = (
        [e.kind for e in events],
        [e.at for e in events],
        [e.step for e in events],
        [e.attempt for e in events],
        [e.data for e in events],
    )
    await connection.run(
        "put_events", lambda con: con.execute(sql.put, workflow_id, replace, *columns), retry=False
    )


async def events_page(
    connection: Connection, sql: EventSql, workflow_id: str, after: int | None, limit: int
) -> list[StoredEvent]:
    """The workflow's events after ``after``, oldest first, at most ``limit``."""
    args = (workflow_id, -1 if after is None else after, limit)
    rows = await connection.run("get_events", lambda con: con.fetch(sql.page, *args))
    return [StoredEvent(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]


def query_statement(
    sql: Sql, query: WorkflowQuery, columns: Sequence[str] = RECORD_COLUMNS
) -> tuple[str, list[Any]]:
    """The SELECT of ``query`` and its arguments, as the store runs it (``query_sql``)."""
    return query_sql(
        query,
        columns,
        sql.workflows_table,
        sql.metadata_table,
        _placeholder,
        _same,
        sql.in_doubt,
        drive_metadata=True,
        minute=minute_bound,
    )


async def reseal(
    connection: Connection, events: str, workflows: str, workflow_id: str, changes: list[Reseal]
) -> int:
    """Replace each change's text that still holds its ``old``, in one transaction.

    The record's row read ``FOR UPDATE``, the events in one statement, the record's fields
    compared as JSON values (their stored text may be spelled otherwise) and written.
    """
    moved = [c for c in changes if c.field == "event"]
    fields = [c for c in changes if c.field != "event"]
    update = (
        f"WITH u AS (UPDATE {events} AS v SET data = n.new FROM unnest($2::bigint[], "
        "$3::text[], $4::text[]) AS n(seq, old, new) WHERE v.workflow_id = $1 "
        "AND v.seq = n.seq AND v.data = n.old RETURNING 1) SELECT count(*) FROM u"
    )
    read = f"SELECT resume_input, last_error FROM {workflows} WHERE workflow_id = $1 FOR UPDATE"
    write = f"UPDATE {workflows} SET resume_input = $2, last_error = $3 WHERE workflow_id = $1"

    async def op(con: Any) -> int:
        done = 0
        async with con.transaction():
            # The record's row first, as every write of a workflow's life locks it before
            # its events: no deadlock with a status change or a sweep.
            row = await con.fetchrow(read, workflow_id)
            if moved:
                columns = ([c.seq for c in moved], [c.old for c in moved], [c.new for c in moved])
                done += await con.fetchval(update, workflow_id, *columns)
            if row is None or not fields:
                return done
            resume, error, changed = reseal_fields(row[0], row[1], fields)
            if changed:
                await con.execute(write, workflow_id, resume, error)
            return done + changed

    return await connection.run("reseal", op)


def lost(workflow_id: str, lease: Lease | None) -> LeaseLostError:
    """The error of a write under a lease that is no longer current."""
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
        metadata=json.loads(row[8]),
        latest_step=row[9],
        latest_agent_id=row[10],
        latest_agent_status=row[11],
        attempts=row[12],
        last_error=None if row[13] is None else json.loads(row[13]),
        retry_at=row[14],
        resume_input=None if row[15] is None else json.loads(row[15]),
        kind=row[16],
    )


def _placeholder(n: int) -> str:
    return f"${n}"


def _same(moment: datetime) -> datetime:
    return moment


#: A record from a row of ``RECORD_COLUMNS`` (for the store's other statement modules).
record_from_row = _workflow_record
