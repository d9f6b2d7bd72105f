"""What the workflow-record backends share: step facts, queries, JSON text of record fields.

A save tells a :class:`~aiocheckpoint.storage.base.WorkflowStorage` the step's agent and
agent status (:class:`StepInfo`), so that the workflow's record names its latest step
without anyone decoding the record. :class:`WorkflowQuery` is one page of a filtered
listing; every backend orders it by workflow id and indexes metadata as one row per
top-level key, whose value is the key's canonical JSON text (:func:`metadata_pairs`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NamedTuple

from .._validation import check_workflow_id
from ..errors import InvalidArgumentError, InvalidWorkflowIdError
from ..leases import WorkflowRecord, WorkflowStatus, check_kind

__all__ = [
    "MAX_FILTER_KEYS",
    "MAX_PAGE",
    "StepInfo",
    "WorkflowQuery",
    "build_query",
    "encode_cursor",
    "failure_update",
    "json_text",
    "matches",
    "metadata_pairs",
    "query_sql",
]

#: The most records one page may hold.
MAX_PAGE: Final = 10_000
#: The most metadata keys one query may filter on.
MAX_FILTER_KEYS: Final = 8
#: The largest metadata, resume input or error, as JSON text.
MAX_FIELD_BYTES: Final = 64 * 1024


class StepInfo(NamedTuple):
    """The agent and agent status of a saved step, for the workflow's record.

    A tuple of strings: the garbage collector stops tracking it, so the thousands a
    group commit holds while it waits never make it work (docs/performance.md).
    ``kind`` (checked by :func:`~aiocheckpoint.leases.check_kind`) is the kind of the
    workflow's record: a new record gets it, an existing one of the default kind
    (``"workflow"``) takes it, in the save's transaction; None (or ``"workflow"``) creates
    a ``"workflow"`` record and leaves an existing record's kind as it is.
    """

    agent_id: str
    agent_status: str
    kind: str | None = None
    #: An event a store keeping events appends in the save's transaction, after the record
    #: is written: its kind and data (JSON object text). A fork's first save carries
    #: ``forked``, so that the fork and its event are stored together or not at all.
    note: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class WorkflowQuery:
    """A filter over workflow records, and one page of the result (ordered by workflow id).

    ``metadata`` holds canonical JSON texts (:func:`metadata_pairs`); ``after`` is the last
    workflow id of the previous page (exclusive); ``limit`` None means every match.
    ``in_doubt`` True keeps the workflows with an effect in doubt, False those without.
    ``finished_before`` keeps the records that finished or failed before that time (a
    record without ``finished_at`` counts from its ``updated_at``): what finished and
    failed TTLs count from. ``kind`` keeps the records of that kind (None: every kind).
    ``newest_first`` orders the page by ``updated_at``, latest first (ties in any order), instead
    of by id: with ``updated_after`` on SQLite and PostgreSQL it reads a range of the index of
    ``updated_at``'s minute, newest minute first, until it has ``limit`` (``after`` must be
    None).
    """

    status: WorkflowStatus | None = None
    agent_status: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    after: str | None = None
    limit: int | None = None
    in_doubt: bool | None = None
    finished_before: datetime | None = None
    kind: str | None = None
    newest_first: bool = False


def build_query(
    status: WorkflowStatus | None,
    agent_status: str | None,
    metadata: Mapping[str, Any] | None,
    updated: tuple[datetime | None, datetime | None],
    limit: int | None,
    cursor: str | None,
    in_doubt: bool | None = None,
    kind: str | None = None,
) -> WorkflowQuery:
    """Check a listing's filters (statuses already checked) and make its query."""
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidArgumentError(f"metadata must be a mapping, not {type(metadata).__qualname__}")
    if metadata is not None and not all(isinstance(k, str) for k in metadata):
        raise InvalidArgumentError("metadata keys must be str")
    pairs = metadata_pairs(metadata or {})
    if len(pairs) > MAX_FILTER_KEYS:
        raise InvalidArgumentError(f"filter on at most {MAX_FILTER_KEYS} metadata keys")
    for moment in updated:
        if moment is not None and (not isinstance(moment, datetime) or moment.tzinfo is None):
            raise InvalidArgumentError(f"updated_after/before must be aware datetimes: {moment!r}")
    if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_PAGE):
        raise InvalidArgumentError(f"limit must be an int in 1..{MAX_PAGE} or None: {limit!r}")
    if in_doubt is not None and not isinstance(in_doubt, bool):
        raise InvalidArgumentError(f"in_doubt must be a bool or None: {in_doubt!r}")
    return WorkflowQuery(
        status=status,
        agent_status=agent_status,
        metadata=pairs,
        updated_after=updated[0],
        updated_before=updated[1],
        after=None if cursor is None else decode_cursor(cursor),
        limit=limit,
        in_doubt=in_doubt,
        kind=None if kind is None else check_kind(kind),
    )


def encode_cursor(last_workflow_id: str) -> str:
    """The opaque cursor of the page that follows ``last_workflow_id``."""
    text = json.dumps({"after": last_workflow_id}, ensure_ascii=False)
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: object) -> str:
    """The workflow id a cursor continues after; a cursor we did not make is refused."""
    if not isinstance(cursor, str) or len(cursor) > 1024:
        raise InvalidArgumentError(f"not a workflow listing cursor: {cursor!r}")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        after = json.loads(raw.decode("utf-8"))["after"]
        return check_workflow_id(after)
    except (binascii.Error, ValueError, KeyError, TypeError, InvalidWorkflowIdError):
        raise InvalidArgumentError(f"not a workflow listing cursor: {cursor!r}") from None


def json_text(value: Any, what: str) -> str:
    """``value`` as canonical JSON text (sorted keys), or InvalidArgumentError."""
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgumentError(
            f"{what} must be JSON (str keys, finite numbers): {exc}"
        ) from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FIELD_BYTES:
        raise InvalidArgumentError(f"{what} is over {MAX_FIELD_BYTES} bytes as JSON")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} holds a lone surrogate") from None
    return text


def metadata_pairs(metadata: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Each top-level key of ``metadata`` with its value's canonical JSON text, sorted."""
    return tuple(sorted((key, json_text(value, "metadata")) for key, value in metadata.items()))


def matches(record: WorkflowRecord, query: WorkflowQuery, in_doubt: Collection[str] = ()) -> bool:
    """Whether ``record`` passes ``query``'s filters (for stores that filter in Python).

    ``in_doubt`` holds the workflows with an effect in doubt (read when the query asks).
    """
    if query.after is not None and record.workflow_id <= query.after:
        return False
    if query.in_doubt is not None and (record.workflow_id in in_doubt) is not query.in_doubt:
        return False
    if query.status is not None and record.status is not query.status:
        return False
    if query.kind is not None and record.kind != query.kind:
        return False
    if query.agent_status is not None and record.latest_agent_status != query.agent_status:
        return False
    if query.updated_after is not None and record.updated_at <= query.updated_after:
        return False
    if query.updated_before is not None and record.updated_at >= query.updated_before:
        return False
    ended = record.updated_at if record.finished_at is None else record.finished_at
    if query.finished_before is not None and ended >= query.finished_before:
        return False
    have = dict(metadata_pairs(record.metadata)) if query.metadata else {}
    return all(have.get(key) == value for key, value in query.metadata)


def failure_update(attempts: int, delays: Sequence[float]) -> tuple[WorkflowStatus, float | None]:
    """After failed run number ``attempts + 1``: the new status and the retry delay (or None)."""
    failed = attempts + 1
    if failed <= len(delays):
        delay = delays[failed - 1]
        return WorkflowStatus.UNFINISHED, delay if math.isfinite(delay) else 0.0
    return WorkflowStatus.FAILED, None


def query_sql(
    query: WorkflowQuery,
    columns: Sequence[str],
    table: str,
    metadata_table: str,
    mark: Callable[[int], str],
    moment: Callable[[datetime], Any],
    in_doubt: str = "",
    drive_metadata: bool = False,
    minute: Callable[[str], str] | None = None,
) -> tuple[str, list[Any]]:
    """The SELECT of ``query`` for a database: one join per metadata key, ordered by id.

    ``mark(n)`` spells the n-th (1-based) parameter, ``moment`` converts a time to the
    database's representation. With a metadata filter the first key's index rows
    (``key, value, workflow_id``) drive the walk in workflow id order; otherwise the
    ``(kind, status, workflow_id)``, ``(status, workflow_id)``, ``(latest_agent_status,
    workflow_id)`` or ``(kind, workflow_id)`` index does, or the primary key: a page costs
    about its own size divided by the share of the walk's rows that pass the other filters,
    not the number of workflows (``tests/test_scale_plans.py`` checks the plans).
    ``in_doubt`` is the database's condition "workflow ``w`` has an effect in doubt" (over
    the effect journal's partial index), for ``query.in_doubt``. ``drive_metadata``
    (PostgreSQL) says so to the planner: the first key's rows, in id order, each look up
    their workflow (``LATERAL ... OFFSET 0``), where its statistics chose a merge join that
    read every workflow the page's ids span and every row of a rare value after the cursor.
    ``minute(p)`` is the database's SQL of the minute of the time bound to ``p``, as its
    records' indexed ``updated_minute`` column holds it: an ``updated_at`` bound then bounds
    that column too, and a ``newest_first`` page is ordered by it, then by ``updated_at``
    (the same order), so that a range of its index drives the page.
    """
    args: list[Any] = []

    def bind(value: Any) -> str:
        args.append(value)
        return mark(len(args))

    pairs = list(zip(_aliases(query), query.metadata, strict=True))
    driven = drive_metadata and bool(pairs)
    joins = [
        f"JOIN {metadata_table} AS {alias} ON {alias}.workflow_id = w.workflow_id "
        f"AND {alias}.key = {bind(key)} AND {alias}.value = {bind(value)}"
        for alias, (key, value) in pairs[driven:]
    ]
    order = "m0.workflow_id" if pairs else "w.workflow_id"
    if query.newest_first and (query.after is not None or query.metadata):
        raise InvalidArgumentError("newest_first pages take no cursor and no metadata filter")
    # With an agent status and no status, the agent status index drives and the kind is
    # only checked (COALESCE: no index serves it): no index holds both, and SQLite, without
    # statistics, walked every workflow of the kind for a rare agent status.
    by_agent = query.agent_status is not None and query.status is None
    where = [
        f"{clause} {bind(value)}"
        for clause, value in (
            ("COALESCE(w.kind, '') =" if by_agent else "w.kind =", query.kind),
            ("w.status =", None if query.status is None else query.status.value),
            ("w.latest_agent_status =", query.agent_status),
            (
                "w.updated_at >",
                None if query.updated_after is None else moment(query.updated_after),
            ),
            (
                "w.updated_at <",
                None if query.updated_before is None else moment(query.updated_before),
            ),
            (
                "COALESCE(w.finished_at, w.updated_at) <",
                None if query.finished_before is None else moment(query.finished_before),
            ),
        )
        if value is not None
    ]
    where += _minute_bounds(query, minute, bind, moment)
    if query.after is not None:
        # The bound on every side the walk may start from: PostgreSQL does not carry an
        # inequality across the join's equality, so a bound on m0 alone left the planner a
        # walk of workflows from the first id (its cost grew with the cursor's position).
        sides = ["w", *(alias for alias, _ in pairs[driven:])]
        where += [f"{side}.workflow_id > {bind(query.after)}" for side in sides]
    if query.in_doubt is not None:
        where.append(in_doubt if query.in_doubt else f"NOT {in_doubt}")
    selected = ", ".join(f"w.{c}" for c in columns)
    if driven:
        alias, (key, value) = pairs[0]
        driver = (
            f"SELECT {alias}.workflow_id FROM {metadata_table} AS {alias} "
            f"WHERE {alias}.key = {bind(key)} AND {alias}.value = {bind(value)}"
        )
        if query.after is not None:
            driver += f" AND {alias}.workflow_id > {bind(query.after)}"
        where.insert(0, f"w.workflow_id = {alias}.workflow_id")
        lookup = f"SELECT {selected} FROM {table} AS w {' '.join(joins)}"
        lookup += " WHERE " + " AND ".join(where) + " OFFSET 0"
        sql = f"SELECT {selected} FROM ({driver}) AS {alias} CROSS JOIN LATERAL ({lookup}) AS w"
    else:
        sql = f"SELECT {selected} FROM {table} AS w {' '.join(joins)}"
        if where:
            sql += " WHERE " + " AND ".join(where)
    if query.newest_first:
        order = "w.updated_minute DESC, w.updated_at DESC" if minute else "w.updated_at DESC"
    sql += f" ORDER BY {order}"
    if query.limit is not None:
        sql += f" LIMIT {bind(query.limit)}"
    return sql, args


def _minute_bounds(
    query: WorkflowQuery,
    minute: Callable[[str], str] | None,
    bind: Callable[[Any], str],
    moment: Callable[[datetime], Any],
) -> list[str]:
    """The ``updated_minute`` bounds of the query's ``updated_at`` bounds (none without ``minute``).

    The minute of a bound: the rows' minutes on its side of it or equal to it.
    """
    if minute is None:
        return []
    bounds = ((">=", query.updated_after), ("<=", query.updated_before))
    return [
        f"w.updated_minute {op} {minute(bind(moment(at)))}" for op, at in bounds if at is not None
    ]


def _aliases(query: WorkflowQuery) -> list[str]:
    """The aliases of the metadata table's joins, one per filtered key."""
    return [f"m{n}" for n in range(len(query.metadata))]
