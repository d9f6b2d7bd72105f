"""The minute of a workflow record's ``updated_at``, and the index of time ranges on it.

Every save moves its record's ``updated_at``: with an index of ``updated_at`` itself no
save's update of the record could be HOT (an indexed column changed), so each one inserted
an entry into every index of the table and left the old row for vacuum. ``updated_minute``
is a stored generated column, ``updated_at``'s whole minutes since the epoch: an update that
leaves the minute as it was changes no indexed column and stays HOT, so a workflow saving
many times a minute touches the indexes once a minute. The minute index serves a time range
in ``updated_at`` order: a range of minutes, each minute's rows sorted by ``updated_at``
(an incremental sort: :func:`~aiocheckpoint.storage.queries.query_sql` asks for both
orders), with a ``LIMIT`` reading the newest minutes only.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MIGRATION", "minute_bound", "minute_of"]


def minute_of(moment: str) -> str:
    """The SQL of the minute of ``moment`` (a timestamptz): the column's own expression.

    So a bound and a row's minute are computed alike (an interval's epoch: immutable).
    """
    since = f"({moment} - timestamptz '1970-01-01 00:00:00+00')"
    return f"floor(extract(epoch FROM {since}) / 60)::bigint"


def minute_bound(mark: str) -> str:
    """The SQL of the minute of the time bound to the parameter ``mark`` (``$3``)."""
    return minute_of(f"{mark}::timestamptz")


MIGRATION: Final[tuple[str, ...]] = (
    # Depends on migration 11 (the index it replaces). Rewrites the table once.
    "ALTER TABLE {s}.workflows ADD COLUMN IF NOT EXISTS updated_minute bigint "
    f"GENERATED ALWAYS AS ({minute_of('updated_at')}) STORED",
    "DROP INDEX IF EXISTS {s}.workflows_updated",
    "CREATE INDEX IF NOT EXISTS workflows_updated_minute ON {s}.workflows (updated_minute)",
)
