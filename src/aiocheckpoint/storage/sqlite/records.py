"""Workflow records and leases in SQLite: code that runs only in the database threads.

Every function that changes something runs inside the writer's ``BEGIN IMMEDIATE``
transaction, so SQLite's one-writer lock makes each check-then-write atomic: two claimers
(in any process) can never both see a lease free. ``now`` is this host's clock
(``time.time()``), read in the writer thread when the operation runs. Functions that refuse
(``LeaseHeldError``, ``LeaseLostError``) do so before writing anything, so the writer can
report the refusal to its caller and still commit the rest of the batch.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any, Final, TypeVar

from ...errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLostError,
)
from ...leases import WORKFLOW_KIND, Lease, WorkflowRecord, WorkflowStatus
from ..events import (
    EventKind,
    EventNote,
    failure_events,
    status_event,
    status_event_data,
    taken_over,
)
from ..lifecycle import cancelled_refusal
from ..queries import StepInfo, WorkflowQuery, failure_update, metadata_pairs, query_sql
from . import events
from .foreign import ForeignRow, id_problem, warn_skipped
from .minute import minute_of

_T = TypeVar("_T")
_COLUMNS: Final = (
    "workflow_id, status, created_at, updated_at, finished_at, lease_owner, "
    "lease_expires_at, fencing_token, metadata, latest_step, latest_agent_id, "
    "latest_agent_status, attempts, last_error, retry_at, resume_input, kind"
)
#: The most rows of one multi-row statement (records created or noted, checkpoints upserted).
ROWS_PER_STATEMENT: Final = 128
DELETE_RECORD: Final = "DELETE FROM workflows WHERE workflow_id = ?"
_TOKEN: Final = "SELECT fencing_token FROM workflows WHERE workflow_id = ?"
_NEXT_TOKEN: Final = (
    "UPDATE fencing SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token"
)
_GET: Final = f"SELECT {_COLUMNS} FROM workflows WHERE workflow_id = ?"
_LIST: Final = f"SELECT {_COLUMNS} FROM workflows ORDER BY workflow_id"
_LIST_STATUS: Final = f"SELECT {_COLUMNS} FROM workflows WHERE status = ? ORDER BY workflow_id"
_SET_STATUS: Final = (
    "UPDATE workflows SET status = ?1, finished_at = ?2, updated_at = ?3, retry_at = NULL, "
    "attempts = CASE WHEN status = 'failed' AND ?1 = 'unfinished' THEN 0 ELSE attempts END "
    "WHERE workflow_id = ?4 AND status <> 'cancelled'"
)
_SET_METADATA: Final = "UPDATE workflows SET metadata = ?, updated_at = ? WHERE workflow_id = ?"
#: A kind other than the default names what writes the workflow: it sticks.
_SET_KIND: Final = "UPDATE workflows SET kind = ? WHERE workflow_id = ? AND kind = 'workflow'"
_DROP_METADATA: Final = "DELETE FROM workflow_metadata WHERE workflow_id = ?"
_ADD_METADATA: Final = "INSERT INTO workflow_metadata (workflow_id, key, value) VALUES (?, ?, ?)"
_RESUME: Final = (
    "UPDATE workflows SET status = 'unfinished', finished_at = NULL, retry_at = NULL, "
    "resume_input = ?, updated_at = ? WHERE workflow_id = ?"
)
_FAIL: Final = (
    "UPDATE workflows SET status = ?, attempts = attempts + 1, last_error = ?, "
    "finished_at = ?, retry_at = ?, updated_at = ? WHERE workflow_id = ? "
    "AND status <> 'cancelled'"
)
_GRANT: Final = (
    "UPDATE workflows SET lease_owner = ?, lease_expires_at = ?, fencing_token = ?, "
    "updated_at = ? WHERE workflow_id = ?"
)
_UNTOUCHED: Final = (
    "SELECT updated_at, lease_owner, lease_expires_at FROM workflows WHERE workflow_id = ?"
)
_HOLDER: Final = "SELECT lease_owner, lease_expires_at FROM workflows WHERE workflow_id = ?"
_RELEASE: Final = (
    "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, updated_at = ? "
    "WHERE workflow_id = ? AND fencing_token = ?"
)
# Read row by row until the first workflow whose id is valid (foreign rows are passed over).
# INDEXED BY: without statistics (SQLite gathers none unless asked) the planner took the
# (kind, status) index and sorted every unfinished workflow by age for each claim.
_CLAIMABLE: Final = (
    "SELECT workflow_id, lease_owner FROM workflows INDEXED BY workflows_claimable "
    "WHERE status = 'unfinished' AND kind = 'workflow' "
    "AND (lease_expires_at IS NULL OR lease_expires_at <= ?1) "
    "AND (retry_at IS NULL OR retry_at <= ?1) "
    "ORDER BY created_at, workflow_id"
)
_ALL_ROWS: Final = f"SELECT rowid, {_COLUMNS} FROM workflows"
#: What a status change reads first: the status it leaves, the fence's token, the attempts.
_STATUS: Final = "SELECT status, fencing_token, attempts FROM workflows WHERE workflow_id = ?"
#: The status writes returning the record they wrote (no read back: one statement less).
_SET_STATUS_BACK: Final = f"{_SET_STATUS} RETURNING {_COLUMNS}"
_FAIL_BACK: Final = f"{_FAIL} RETURNING {_COLUMNS}"
_SLEEP_BACK: Final = (
    "UPDATE workflows SET status = 'unfinished', retry_at = ?, finished_at = NULL, "
    f"updated_at = ? WHERE workflow_id = ? AND status <> 'cancelled' RETURNING {_COLUMNS}"
)
#: What a damaged row raises when it is made into a WorkflowRecord.
_DAMAGE: Final = (ValueError, TypeError, OverflowError, OSError)


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


def _record(row: Any) -> WorkflowRecord:
    """The row as a record; one the library could not have written raises a _DAMAGE error."""
    wf, status, created, updated, finished, owner, expires, token, *more = row
    meta, step, agent, agent_status, attempts, error, retry_at, resume_input, kind = more
    problem = id_problem(wf)
    if problem is not None:
        raise ValueError(problem)
    return WorkflowRecord(
        workflow_id=wf,
        status=WorkflowStatus(status),
        created_at=_time(created),
        updated_at=_time(updated),
        finished_at=_maybe_time(finished),
        lease_owner=owner,
        lease_expires_at=_maybe_time(expires),
        fencing_token=token,
        metadata=json.loads(meta),
        latest_step=step,
        latest_agent_id=agent,
        latest_agent_status=agent_status,
        attempts=attempts,
        last_error=None if error is None else json.loads(error),
        retry_at=_maybe_time(retry_at),
        resume_input=None if resume_input is None else json.loads(resume_input),
        kind=kind,
    )


def _maybe_time(seconds: float | None) -> datetime | None:
    return None if seconds is None else _time(seconds)


def _checked(row: Any, workflow_id: str) -> WorkflowRecord:
    """The row as a record; a damaged one raises CheckpointCorruptedError naming the workflow."""
    try:
        return _record(row)
    except _DAMAGE as exc:
        raise CheckpointCorruptedError(
            f"its workflow record is damaged: {exc}", workflow_id=workflow_id
        ) from exc


def lost(workflow_id: str, token: int | None) -> LeaseLostError:
    """The error for a write under a lease whose token is no longer current."""
    return LeaseLostError(
        f"lease {token} on workflow {workflow_id!r} is no longer current; nothing was written"
    )


def current_tokens(conn: sqlite3.Connection, workflow_ids: Iterable[str]) -> dict[str, int]:
    """The fencing token of each workflow that has a record."""
    tokens: dict[str, int] = {}
    for wf in dict.fromkeys(workflow_ids):
        rows = conn.execute(_TOKEN, (wf,)).fetchall()
        if rows:
            tokens[wf] = int(rows[0][0])
    return tokens


def ensure_records(conn: sqlite3.Connection, workflow_ids: Iterable[str], now: float) -> None:
    """Create an UNFINISHED record for each workflow that has none.

    One multi-row statement per 128 workflows: a third of the time of one ``executemany``
    row each, in the writer thread while the whole batch waits for it.
    """
    for chunk in padded_chunks(list(dict.fromkeys(workflow_ids))):
        conn.execute(_ensure_sql(len(chunk)), [now, *chunk])


def padded_chunks(items: Sequence[_T]) -> Iterator[list[_T]]:
    """``items`` in chunks of up to :data:`ROWS_PER_STATEMENT`, one multi-row statement each.

    Each is padded to :func:`padded_rows` by repeating its last item (a row written twice:
    the same outcome), so that few distinct statements stay in the connection's statement
    cache.
    """
    for start in range(0, len(items), ROWS_PER_STATEMENT):
        chunk = list(items[start : start + ROWS_PER_STATEMENT])
        yield chunk + [chunk[-1]] * (padded_rows(len(chunk)) - len(chunk))


def padded_rows(count: int) -> int:
    """The rows of the statement that takes ``count`` (1 to 128): few distinct statements.

    A power of two up to 8, then a multiple of 8: at most 19 statements of each kind stay
    in the connection's statement cache (128 by default), and a padding row (a repeated
    one, the same outcome) costs as much as a real one, so less padding than powers of two
    (100 saves took 128 rows, now 104).
    """
    if count <= 8:
        return 1 << (count - 1).bit_length()
    return (count + 7) & ~7


@functools.cache
def _ensure_sql(rows: int) -> str:
    values = ", ".join(f"(?{n}, ?1, ?1)" for n in range(2, rows + 2))
    return (
        f"INSERT INTO workflows (workflow_id, created_at, updated_at) VALUES {values} "
        "ON CONFLICT (workflow_id) DO NOTHING"
    )


def _check_token(conn: sqlite3.Connection, workflow_id: str, token: int) -> None:
    if current_tokens(conn, [workflow_id]).get(workflow_id) != token:
        raise lost(workflow_id, token)


def set_status(
    conn: sqlite3.Connection,
    now: float,
    workflow_id: str,
    status: WorkflowStatus,
    token: int | None,
    note: EventNote | None = None,
) -> WorkflowRecord:
    """Create or update the record with ``status``; fenced by ``token`` when given.

    Appends the change's event (``note``'s, when given) if the write happened. Three
    statements for an existing record, as many as before events: the old status (and the
    fence's token) in one read, the write returning the record, the event's insert.
    """
    row = _before(conn, now, workflow_id, token)
    old = None if row is None else WorkflowStatus(row[0])
    ends = status in (WorkflowStatus.FINISHED, WorkflowStatus.FAILED)
    args = (status.value, now if ends else None, now, workflow_id)
    record = _returned(conn, workflow_id, conn.execute(_SET_STATUS_BACK, args).fetchall())
    if note is not None:
        events.append_for(conn, now, record, note.kind, note.data)
    elif (kind := status_event(old, status)) is not None:
        events.append_for(conn, now, record, kind, status_event_data(old, kind))
    return record


def _before(
    conn: sqlite3.Connection, now: float, workflow_id: str, token: int | None
) -> tuple[str, int, int] | None:
    """The record's status, token and attempts before a status change (None: no record).

    Checks the fence's ``token``; creates the record if it has none.
    """
    rows = conn.execute(_STATUS, (workflow_id,)).fetchall()
    if token is not None and (not rows or rows[0][1] != token):
        raise lost(workflow_id, token)
    if not rows:
        ensure_records(conn, [workflow_id], now)
        return None
    row: tuple[str, int, int] = rows[0]
    return row


def _returned(conn: sqlite3.Connection, workflow_id: str, rows: list[Any]) -> WorkflowRecord:
    """The record a guarded status write returned; CancelledRecordError if it wrote nothing."""
    if not rows:  # the statement's guard refused the write: the record is CANCELLED
        raise cancelled_refusal(_read_back(conn, workflow_id))
    return _checked(rows[0], workflow_id)


def _read_back(conn: sqlite3.Connection, workflow_id: str) -> WorkflowRecord:
    return _checked(conn.execute(_GET, (workflow_id,)).fetchall()[0], workflow_id)


def note_saves(
    conn: sqlite3.Connection, now: float, saves: Sequence[tuple[str, int, StepInfo | None]]
) -> None:
    """Create the missing records of saved workflows and move their latest steps forward.

    In the save's transaction, before its checkpoints are written. Saves with a
    :class:`StepInfo` go through one multi-row upsert per 128, in the saves' order (a new
    record, or the latest step moved forward only, and the resume input consumed); the
    others through :func:`ensure_records`. A batch of saves costs a statement per 128, not
    two per save.
    """
    noted = [(wf, step, info) for wf, step, info in saves if info is not None]
    if len(noted) < len(saves):
        ensure_records(conn, (wf for wf, _, info in saves if info is None), now)
    for chunk in padded_chunks(noted):
        params: list[object] = [now]
        for wf, step, info in chunk:
            params += (wf, step, info.agent_id, info.agent_status, info.kind)
        kinds = any(info.kind not in (None, WORKFLOW_KIND) for _, _, info in chunk)
        conn.execute(_note_sql(len(chunk), kinds), params)
    for wf, _, info in noted:
        if info.note is not None:  # a fork's ``forked``: in the save's transaction
            events.append(conn, now, wf, EventKind(info.note[0]), info.note[1])


@functools.cache
def _note_sql(rows: int, kinds: bool = True) -> str:
    """The upsert of ``rows`` saves; ``kinds`` False when none names a kind of its own.

    A save of the default kind changes no record's kind: its statement does not name the
    column, or SQLite would rewrite the record's entries in both kind indexes every save.
    """
    values = ", ".join(
        f"(?{n}, ?1, ?1, ?{n + 1}, ?{n + 2}, ?{n + 3}, coalesce(?{n + 4}, 'workflow'))"
        for n in range(2, 5 * rows + 2, 5)
    )
    new = "excluded.latest_step >= coalesce(latest_step, -1)"
    # A kind other than the default names what writes the workflow: it sticks.
    kind = "kind = CASE WHEN kind = 'workflow' THEN excluded.kind ELSE kind END, "
    return (
        "INSERT INTO workflows (workflow_id, created_at, updated_at, latest_step, "
        f"latest_agent_id, latest_agent_status, kind) VALUES {values} "
        "ON CONFLICT (workflow_id) DO UPDATE SET updated_at = excluded.updated_at, "
        f"resume_input = NULL, {kind if kinds else ''}"
        f"latest_agent_id = CASE WHEN {new} THEN excluded.latest_agent_id "
        "ELSE latest_agent_id END, "
        f"latest_agent_status = CASE WHEN {new} THEN excluded.latest_agent_status "
        "ELSE latest_agent_status END, "
        "latest_step = max(excluded.latest_step, coalesce(latest_step, -1))"
    )


def register(
    conn: sqlite3.Connection,
    now: float,
    workflow_id: str,
    metadata: str | None,
    kind: str | None = None,
) -> WorkflowRecord:
    """Create the record if missing; with ``metadata``, replace it and its index rows.

    A new record takes ``kind``, and so does an existing one of the default kind.
    """
    ensure_records(conn, [workflow_id], now)
    if kind is not None:
        conn.execute(_SET_KIND, (kind, workflow_id))
    if metadata is not None:
        conn.execute(_SET_METADATA, (metadata, now, workflow_id))
        conn.execute(_DROP_METADATA, (workflow_id,))
        pairs = metadata_rows(workflow_id, metadata)
        conn.executemany(_ADD_METADATA, pairs)
    return _read_back(conn, workflow_id)


def metadata_rows(workflow_id: str, metadata: str) -> list[tuple[str, str, str]]:
    """The index rows of a metadata object given as JSON text."""
    return [(workflow_id, k, v) for k, v in metadata_pairs(json.loads(metadata))]


def resume(
    conn: sqlite3.Connection, now: float, workflow_id: str, resume_input: str
) -> WorkflowRecord:
    """Make a PAUSED workflow UNFINISHED with ``resume_input``; refuse any other status."""
    record = read_record(conn, workflow_id)
    if record is None:
        raise CheckpointNotFoundError(workflow_id)
    if record.status is not WorkflowStatus.PAUSED:
        raise InvalidArgumentError(
            f"workflow {workflow_id!r} is {record.status}, not paused: nothing to resume"
        )
    conn.execute(_RESUME, (resume_input, now, workflow_id))
    data = json.dumps({"input": json.loads(resume_input)})
    events.append(conn, now, workflow_id, EventKind.RESUMED, data)
    return _read_back(conn, workflow_id)


def fail(
    conn: sqlite3.Connection,
    now: float,
    workflow_id: str,
    error: str,
    delays: tuple[float, ...],
    token: int | None,
) -> WorkflowRecord:
    """Count a failed run: back to UNFINISHED with a retry time, or FAILED."""
    row = _before(conn, now, workflow_id, token)
    status, delay = failure_update(0 if row is None else int(row[2]), delays)
    retry_at = None if delay is None else now + delay
    finished = now if delay is None else None
    args = (status.value, error, finished, retry_at, now, workflow_id)
    record = _returned(conn, workflow_id, conn.execute(_FAIL_BACK, args).fetchall())
    at = None if retry_at is None else _time(retry_at).isoformat()
    for kind, data in failure_events(error, status, at):
        events.append_for(conn, now, record, kind, data)
    return record


def sleep(
    conn: sqlite3.Connection, now: float, workflow_id: str, seconds: float, token: int | None
) -> WorkflowRecord:
    """UNFINISHED, claimable ``seconds`` from now (fenced by ``token``); ``sleeping``."""
    _before(conn, now, workflow_id, token)
    until = now + seconds
    rows = conn.execute(_SLEEP_BACK, (until, now, workflow_id)).fetchall()
    record = _returned(conn, workflow_id, rows)
    data = json.dumps({"until": _time(until).isoformat()})
    events.append_for(conn, now, record, EventKind.SLEEPING, data)
    return record


def _grant(
    conn: sqlite3.Connection, now: float, workflow_id: str, owner: str, ttl: float, token: int
) -> Lease:
    expires = now + ttl
    conn.execute(_GRANT, (owner, expires, token, now, workflow_id))
    return Lease(
        workflow_id=workflow_id,
        owner=owner,
        token=token,
        expires_at=_time(expires),
        ttl=ttl,
    )


def _next_token(conn: sqlite3.Connection) -> int:
    return int(conn.execute(_NEXT_TOKEN).fetchall()[0][0])


def acquire(
    conn: sqlite3.Connection, now: float, workflow_id: str, owner: str, ttl: float
) -> Lease:
    """Grant the lease if free, expired or already ``owner``'s; else ``LeaseHeldError``."""
    rows = conn.execute(_HOLDER, (workflow_id,)).fetchall()
    if rows:
        holder, expires = rows[0]
        if holder is not None and holder != owner and expires > now:
            raise LeaseHeldError(
                f"workflow {workflow_id!r} is leased by {holder!r} until {_time(expires)}"
            )
        gone = expires is None or expires <= now
        _note_takeover(conn, now, workflow_id, taken_over(holder, gone, owner))
    else:
        ensure_records(conn, [workflow_id], now)
    return _grant(conn, now, workflow_id, owner, ttl, _next_token(conn))


def _note_takeover(
    conn: sqlite3.Connection, now: float, workflow_id: str, data: str | None
) -> None:
    if data is not None:
        events.append(conn, now, workflow_id, EventKind.LEASE_TAKEN_OVER, data)


def renew(conn: sqlite3.Connection, now: float, lease: Lease, ttl: float) -> Lease:
    """Extend a lease whose token is current (expired or not); else ``LeaseLostError``."""
    _check_token(conn, lease.workflow_id, lease.token)
    return _grant(conn, now, lease.workflow_id, lease.owner, ttl, lease.token)


def release(conn: sqlite3.Connection, now: float, lease: Lease) -> None:
    """Free a lease whose token is current; a stale one changes nothing."""
    conn.execute(_RELEASE, (now, lease.workflow_id, lease.token))


def claim(conn: sqlite3.Connection, now: float, owner: str, ttl: float) -> Lease | None:
    """Lease the oldest unfinished workflow whose lease is free or expired, or None."""
    cursor = conn.execute(_CLAIMABLE, (now,))
    try:
        found = next((row for row in cursor if id_problem(row[0]) is None), None)
    finally:
        cursor.close()
    if found is None:
        return None
    workflow_id, holder = found
    _note_takeover(conn, now, workflow_id, taken_over(holder, True, owner))
    return _grant(conn, now, workflow_id, owner, ttl, _next_token(conn))


def untouched(conn: sqlite3.Connection, now: float, workflow_id: str, updated_at: datetime) -> bool:
    """Whether the record was last changed at ``updated_at`` and no live lease holds it."""
    row = conn.execute(_UNTOUCHED, (workflow_id,)).fetchone()
    if row is None or not isinstance(row[0], float) or _time(row[0]) != updated_at:
        return False
    owner, expires = row[1], row[2]
    return owner is None or expires is None or expires <= now


def read_record(conn: sqlite3.Connection, workflow_id: str) -> WorkflowRecord | None:
    """The workflow's record, or None."""
    rows = conn.execute(_GET, (workflow_id,)).fetchall()
    return _checked(rows[0], workflow_id) if rows else None


def read_records(conn: sqlite3.Connection, status: WorkflowStatus | None) -> list[WorkflowRecord]:
    """Every record (or those with ``status``), ordered by workflow id."""
    if status is None:
        rows = conn.execute(_LIST).fetchall()
    else:
        rows = conn.execute(_LIST_STATUS, (status.value,)).fetchall()
    return _valid_records(rows)


def _valid_records(rows: list[Any]) -> list[WorkflowRecord]:
    """The rows as records; one that is not valid is skipped (and logged)."""
    found: list[WorkflowRecord] = []
    for row in rows:
        try:
            found.append(_record(row))
        except _DAMAGE:
            continue
    warn_skipped("workflows", len(rows) - len(found))
    return found


def _placeholder(_: int) -> str:
    return "?"


def _seconds(moment: datetime) -> float:
    return moment.timestamp()


#: ``w`` has an effect in doubt: one read of the journal's partial index (``effects``), so
#: that a page of the workflows in doubt starts from them, not from every workflow (a
#: correlated EXISTS walked the whole table when none was in doubt).
_IN_DOUBT: Final = "w.workflow_id IN (SELECT e.workflow_id FROM effects AS e WHERE e.in_doubt = 1)"


def query_records(conn: sqlite3.Connection, query: WorkflowQuery) -> list[WorkflowRecord]:
    """One page of the records passing ``query`` (see :func:`query_sql`)."""
    sql, args = query_statement(query)
    return _valid_records(conn.execute(sql, args).fetchall())


def query_statement(
    query: WorkflowQuery, columns: Sequence[str] | None = None
) -> tuple[str, list[Any]]:
    """The SELECT of ``query`` and its arguments (every record column unless ``columns``)."""
    return query_sql(
        query,
        columns or [c.strip() for c in _COLUMNS.split(",")],
        "workflows",
        "workflow_metadata",
        _placeholder,
        _seconds,
        _IN_DOUBT,
        minute=minute_of,
    )


def foreign_records(conn: sqlite3.Connection) -> list[ForeignRow]:
    """The rows of the ``workflows`` table that do not make a valid record."""
    foreign: list[ForeignRow] = []
    for rowid, *row in conn.execute(_ALL_ROWS).fetchall():
        try:
            _record(row)
        except _DAMAGE as exc:
            foreign.append(ForeignRow("workflows", rowid, str(exc)))
    return foreign
