"""The minute of a workflow record's ``updated_at``, and the index of time ranges on it.

Every save moves its record's ``updated_at``: an index of ``updated_at`` itself had every
save delete and insert an entry of it. ``updated_minute`` is ``updated_at``'s whole minutes
since the epoch, kept by triggers that write it only when the minute changes, so a workflow
saving many times a minute moves its entry once a minute; the saves' own statements never
name the column, so SQLite leaves its index alone. The minute index serves a time range in
``updated_at`` order: a range of minutes, each minute's rows ordered by ``updated_at``
(:func:`~aiocheckpoint.storage.queries.query_sql` asks for both orders), with a ``LIMIT``
reading the newest minutes only.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MIGRATION_STATEMENTS", "minute_of"]


def minute_of(seconds: str) -> str:
    """The SQL of the minute of ``seconds`` (a time as the records store it).

    The triggers' expression, so that a bound and a row's minute are computed alike.
    """
    return f"CAST({seconds} / 60 AS INTEGER)"


_STALE: Final = f"new.updated_minute IS NOT {minute_of('new.updated_at')}"
_SET: Final = (
    f"UPDATE workflows SET updated_minute = {minute_of('new.updated_at')} WHERE rowid = new.rowid"
)

MIGRATION_STATEMENTS: Final[tuple[str, ...]] = (
    "ALTER TABLE workflows ADD COLUMN updated_minute INTEGER",
    f"UPDATE workflows SET updated_minute = {minute_of('updated_at')}",
    "DROP INDEX workflows_updated",
    "CREATE INDEX workflows_updated_minute ON workflows (updated_minute)",
    # Fired by every statement that writes a record, whatever sets its time; each writes the
    # column only when the minute is not the one it holds.
    f"CREATE TRIGGER workflows_minute_new AFTER INSERT ON workflows WHEN {_STALE} "
    f"BEGIN {_SET}; END",
    f"CREATE TRIGGER workflows_minute_moved AFTER UPDATE OF updated_at ON workflows "
    f"WHEN {_STALE} BEGIN {_SET}; END",
)
