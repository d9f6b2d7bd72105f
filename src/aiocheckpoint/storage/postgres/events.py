"""A workflow's event history in PostgreSQL (:mod:`aiocheckpoint.storage.events`).

Each statement that changes a workflow's life is wrapped so that the same statement
appends its event (a ``WITH`` part inserting into ``workflow_events``): atomic with the
change and no round trip of its own. The record's state before the statement is read in
the statement's snapshot (a scalar sub-query), the record after it from the change's
``RETURNING``. A workflow's events go with its record (``ON DELETE CASCADE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..events import ENTERED, LEFT, EventKind
from .sql import RECORD_COLUMNS, Sql

__all__ = ["MIGRATION", "EventSql"]

MIGRATION: Final[tuple[str, ...]] = (
    """
    CREATE TABLE IF NOT EXISTS {s}.workflow_events (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        workflow_id text COLLATE "C" NOT NULL
            REFERENCES {s}.workflows (workflow_id) ON DELETE CASCADE,
        kind text NOT NULL,
        at timestamptz NOT NULL DEFAULT now(),
        step bigint,
        attempt bigint,
        data text NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS workflow_events_workflow ON {s}.workflow_events (workflow_id, seq)",
)

_RECORD: Final = ", ".join(RECORD_COLUMNS)
#: A timestamptz as Python's isoformat writes it in UTC.
_ISO: Final = "to_char(({c}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')"


def _derived(old: str, new: str) -> str:
    """SQL of the kind a status write derives, or NULL.

    As :func:`aiocheckpoint.storage.events.status_event` derives it.
    """
    entered = " ".join(f"WHEN {new} = '{s.value}' THEN '{k.value}'" for s, k in ENTERED.items())
    left = " ".join(
        f"WHEN {new} = 'unfinished' AND {old} = '{s.value}' THEN '{k.value}'"
        for s, k in LEFT.items()
    )
    return f"CASE WHEN {old} IS NOT DISTINCT FROM {new} THEN NULL {entered} {left} END"


@dataclass(frozen=True, slots=True)
class EventSql:
    """The event-appending statements of one store (see the module docstring)."""

    status_upsert: str
    status_fenced: str
    resume: str
    fail: str
    acquire: str
    claim: str
    page: str
    table: str
    sleep: str
    put: str

    @classmethod
    def build(cls, quoted: str, sql: Sql) -> EventSql:
        """Wrap ``sql``'s statements that change a workflow's life."""
        w, ev = sql.workflows_table, f"{quoted}.workflow_events"
        insert = f"INSERT INTO {ev} (workflow_id, kind, step, attempt, data) "
        old = f"(SELECT status FROM {w} WHERE workflow_id = $1)"

        def status(statement: str, kind: int) -> str:
            # $kind, $kind + 1: a note's kind and data (NULL: the derived event, if any).
            derived = _derived("o.status", "$2")
            retried = f"'{EventKind.RETRIED.value}'"
            data = (
                f"coalesce(${kind + 1}, CASE WHEN {derived} = {retried} "
                "THEN json_build_object('previous', o.status)::text ELSE '{}' END)"
            )
            return (
                f"WITH o AS MATERIALIZED (SELECT {old} AS status), u AS ({statement}), "
                f"e AS ({insert}SELECT u.workflow_id, k.kind, u.latest_step, "
                f"CASE WHEN k.kind = 'failed' THEN u.attempts END, k.data FROM u CROSS JOIN o "
                f"CROSS JOIN LATERAL (SELECT coalesce(${kind}, {derived}) AS kind, {data} AS data) "
                f"AS k WHERE k.kind IS NOT NULL) SELECT {_RECORD} FROM u"
            )

        failed = (
            "(VALUES (1, 'step_failed', $2::text), "
            "(2, CASE WHEN $2::json->>'type' = 'EffectInDoubtError' THEN 'effect_in_doubt' END, "
            "$2::text), (3, CASE WHEN u.status = 'failed' THEN 'failed' "
            "ELSE 'retry_scheduled' END, CASE WHEN u.status = 'failed' THEN '{}' "
            f"ELSE json_build_object('at', {_ISO.format(c='u.retry_at')})::text END)) "
            "AS k(n, kind, data)"
        )
        # The claim's candidate keeps the owner whose lease it takes over.
        claim = sql.claim.replace(
            "SELECT workflow_id FROM", "SELECT workflow_id, lease_owner AS prior FROM", 1
        )
        if claim == sql.claim:  # the claim's text changed: this wrapper must follow it
            raise RuntimeError("the claim statement has no candidate sub-query to extend")
        prior = f"(SELECT lease_owner AS o, lease_expires_at <= now() AS gone FROM {w} "
        return cls(
            status_upsert=status(sql.status_upsert, 3),
            status_fenced=status(sql.status_fenced, 4),
            resume=(
                f"WITH u AS ({sql.resume}), e AS ({insert}SELECT u.workflow_id, 'resumed', "
                "u.latest_step, NULL, '{\"input\": ' || $2 || '}' FROM u) "
                f"SELECT {_RECORD} FROM u"
            ),
            fail=(
                f"WITH u AS ({sql.fail}), e AS ({insert}SELECT u.workflow_id, k.kind, "
                f"u.latest_step, u.attempts, k.data FROM u CROSS JOIN LATERAL {failed} "
                f"WHERE k.kind IS NOT NULL ORDER BY k.n) SELECT {_RECORD} FROM u"
            ),
            acquire=(
                f"WITH p AS MATERIALIZED {prior}WHERE workflow_id = $1), "
                f"g AS ({sql.acquire}, latest_step), "
                f"e AS ({insert}SELECT $1, 'lease_taken_over', g.latest_step, NULL, "
                "json_build_object('previous_owner', p.o)::text FROM g CROSS JOIN p "
                "WHERE p.o IS NOT NULL AND p.o <> $2 AND p.gone) "
                "SELECT fencing_token, lease_expires_at FROM g"
            ),
            claim=(
                f"WITH g AS ({claim}, "
                "x.latest_step, c.prior), "
                f"e AS ({insert}SELECT g.workflow_id, 'lease_taken_over', g.latest_step, NULL, "
                "json_build_object('previous_owner', g.prior)::text FROM g "
                "WHERE g.prior IS NOT NULL AND g.prior <> $1) "
                "SELECT workflow_id, fencing_token, lease_expires_at FROM g"
            ),
            page=(
                f"SELECT seq, kind, at, step, attempt, data FROM {ev} "
                "WHERE workflow_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
            ),
            table=ev,
            # $1 id, $2 replace, then the events' columns as arrays, in order.
            put=(
                f"WITH d AS (DELETE FROM {ev} WHERE $2 AND workflow_id = $1 RETURNING 1) "
                f"INSERT INTO {ev} (at, workflow_id, kind, step, attempt, data) "
                "SELECT a, $1, k, s, t, x FROM unnest($3::text[], $4::timestamptz[], "
                "$5::bigint[], $6::bigint[], $7::text[]) WITH ORDINALITY AS e(k, a, s, t, x, n) "
                "WHERE (SELECT count(*) FROM d) >= 0 ORDER BY n"
            ),
            # $1 id, $2 seconds, $3 the fence's token (NULL: none).
            sleep=(
                f"WITH u AS (UPDATE {w} SET status = 'unfinished', "
                "retry_at = now() + make_interval(secs => $2::float8), finished_at = NULL, "
                "updated_at = now() WHERE workflow_id = $1 "
                "AND ($3::bigint IS NULL OR fencing_token = $3) AND status <> 'cancelled' "
                f"RETURNING {_RECORD}), e AS ({insert}SELECT u.workflow_id, 'sleeping', "
                f"u.latest_step, NULL, json_build_object('until', {_ISO.format(c='u.retry_at')})"
                "::text FROM u) "
                f"SELECT {_RECORD} FROM u"
            ),
        )

    def cancel(self, statement: str) -> str:
        """Control's cancel (``$1`` id, ``$2`` error) appending ``cancelled`` (``$3`` reason)."""
        return (
            f"WITH u AS ({statement}), e AS (INSERT INTO {self.table} (workflow_id, kind, step, "
            "attempt, data) SELECT u.workflow_id, 'cancelled', u.latest_step, NULL, "
            f"json_build_object('reason', $3::text)::text FROM u) SELECT {_RECORD} FROM u"
        )

    def retry(self, statement: str, workflows: str) -> str:
        """Control's retry (``$1`` id) appending ``retried`` with the status it left."""
        return (
            f"WITH o AS MATERIALIZED (SELECT status FROM {workflows} WHERE workflow_id = $1), "
            f"u AS ({statement}), e AS (INSERT INTO {self.table} (workflow_id, kind, step, "
            "attempt, data) SELECT u.workflow_id, 'retried', u.latest_step, NULL, "
            "json_build_object('previous', o.status)::text FROM u CROSS JOIN o) "
            f"SELECT {_RECORD} FROM u"
        )
