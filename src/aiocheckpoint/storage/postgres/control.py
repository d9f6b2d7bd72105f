"""Cancel and retry in PostgreSQL (``storage/lifecycle.py``).

Each is one conditional ``UPDATE``: the status check and the write are atomic; when it
matches no row, the record is read to say why (missing, or which status refused it).
"""

from __future__ import annotations

from typing import Any

from ...errors import InvalidArgumentError
from ...leases import WorkflowRecord
from ..lifecycle import cancel_error, check_cancel, check_retry
from .connection import Connection
from .events import EventSql
from .leases import Leases, record_from_row
from .sql import RECORD_COLUMNS, Sql

__all__ = ["Control"]


class Control:
    """The cancel and retry statements of one store; arguments are checked already."""

    def __init__(self, connection: Connection, sql: Sql, leases: Leases, events: EventSql) -> None:
        self._connection = connection
        self._leases = leases
        table = sql.workflows_table
        # The store's fencing sequence: the cancel's token is newer than any lease granted.
        sequence = table.rsplit(".", 1)[0] + ".fencing"
        record = ", ".join(RECORD_COLUMNS)
        cancel = (
            f"UPDATE {table} SET status = 'cancelled', last_error = $2, finished_at = now(), "
            "retry_at = NULL, lease_owner = NULL, lease_expires_at = NULL, "
            f"fencing_token = nextval('{sequence}'), updated_at = now() "
            f"WHERE workflow_id = $1 AND status IN ('unfinished', 'paused') RETURNING {record}"
        )
        retry = (
            f"UPDATE {table} SET status = 'unfinished', attempts = 0, retry_at = NULL, "
            "finished_at = NULL, updated_at = now() "
            f"WHERE workflow_id = $1 AND status IN ('failed', 'cancelled') RETURNING {record}"
        )
        self._cancel = events.cancel(cancel)
        self._retry = events.retry(retry, table)

    async def cancel(self, workflow_id: str, reason: str | None) -> WorkflowRecord:
        """Cancel an UNFINISHED or PAUSED workflow and revoke its lease; else refuse."""
        sql, error = self._cancel, cancel_error(reason)
        row = await self._run(
            "cancel_workflow", lambda con: con.fetchrow(sql, workflow_id, error, reason)
        )
        if row is None:
            check_cancel(await self._leases.get(workflow_id), workflow_id)
        return _settled(row, workflow_id)

    async def retry(self, workflow_id: str) -> WorkflowRecord:
        """Make a FAILED or CANCELLED workflow UNFINISHED with attempts back to 0; else refuse."""
        sql = self._retry
        row = await self._run("retry_workflow", lambda con: con.fetchrow(sql, workflow_id))
        if row is None:
            check_retry(await self._leases.get(workflow_id), workflow_id)
        return _settled(row, workflow_id)

    async def _run(self, what: str, op: Any) -> Any:
        # Not retried after a lost connection: the write may have happened (a cancel's token).
        return await self._connection.run(what, op, retry=False)


def _settled(row: Any, workflow_id: str) -> WorkflowRecord:
    """The written record; without one, the status changed between the write and the read."""
    if row is None:
        raise InvalidArgumentError(
            f"workflow {workflow_id!r} changed while this ran; nothing was written: try again"
        )
    return record_from_row(row)
