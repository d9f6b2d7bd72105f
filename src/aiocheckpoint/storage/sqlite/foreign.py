"""Rows the library could not have written: how they are recognised, skipped and reported.

The schema's ``CHECK`` constraints keep every row well typed, but a database edited by hand
(or by a tool that turned the checks off) can hold, say, a BLOB workflow id. Such a row is
foreign: listings skip it (with a warning in the log) rather than hand a caller an id that
is not a ``str``, a read of the one record at fault raises a typed error naming it, and
:meth:`SQLiteCheckpointStorage.foreign_rows
<aiocheckpoint.storage.sqlite.SQLiteCheckpointStorage.foreign_rows>` lists them all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..._validation import check_workflow_id
from ...errors import InvalidArgumentError

__all__ = ["ForeignRow", "id_problem", "warn_skipped"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ForeignRow:
    """A row of the database that the library could not have written.

    ``table`` is ``"checkpoints"`` or ``"workflows"``, ``rowid`` the row's SQLite rowid (to
    find it with the sqlite3 shell), ``reason`` what is wrong with it.
    """

    table: str
    rowid: int
    reason: str


def id_problem(value: object) -> str | None:
    """Why ``value`` is not a workflow id the library accepts, or None if it is one."""
    try:
        check_workflow_id(value)
    except InvalidArgumentError as exc:
        return f"workflow id {value!r}: {exc}"
    return None


def warn_skipped(table: str, count: int) -> None:
    """Log that a listing left out ``count`` foreign rows of ``table``."""
    if count:
        logger.warning(
            "SQLite store: %d foreign row(s) in table %r skipped (hand-edited?); "
            "SQLiteCheckpointStorage.foreign_rows() lists them",
            count,
            table,
        )
