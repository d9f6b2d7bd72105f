"""The SQL the writer and the readers run on the ``checkpoints`` table, in one place.

Every statement here is an index lookup on ``checkpoints_workflow_step`` (the query-plan
test runs ``EXPLAIN QUERY PLAN`` on each of them): its cost never grows with the length of
a workflow's history or with the number of workflows.
"""

from __future__ import annotations

import functools
from typing import Final


@functools.cache
def upsert_sql(rows: int) -> str:
    """The upsert of ``rows`` checkpoint rows (``workflow_id, step, data`` each) in one statement.

    One statement for many rows, not ``executemany``: each ``sqlite3_step`` gives the GIL
    back, and a writer taking it back from an event loop that is running Python (the
    LangGraph saver's graph runs while its saves commit) waits up to the switch interval
    each time. SQLite applies the rows in order, so a step named twice keeps the later row.
    """
    values = ", ".join(["(?, ?, ?)"] * rows)
    return (
        f"INSERT INTO checkpoints (workflow_id, step, data) VALUES {values} "
        "ON CONFLICT (workflow_id, step) DO UPDATE SET data = excluded.data, refs = NULL"
    )


# Keep the N highest steps: delete below the N-th highest (NULL, so nothing, if fewer exist).
_PRUNE: Final = (
    "DELETE FROM checkpoints WHERE workflow_id = ? AND step < ("
    "SELECT step FROM checkpoints WHERE workflow_id = ? ORDER BY step DESC LIMIT 1 OFFSET ?)"
)
_DELETE_STEP: Final = "DELETE FROM checkpoints WHERE workflow_id = ? AND step = ?"
_DELETE_WORKFLOW: Final = "DELETE FROM checkpoints WHERE workflow_id = ?"
# The blob is only fetched when it is small enough; length() of a blob reads no content.
_COLUMNS: Final = "step, length(data), CASE WHEN length(data) <= ? THEN data END"
# A step that is not an integer >= 0 (possible only in a hand-edited table, whose CHECK
# constraints were off) makes a foreign row: the reads pass it over.
_STEP_OK: Final = "typeof(step) = 'integer'"
_LATEST: Final = (
    f"SELECT {_COLUMNS} FROM checkpoints WHERE workflow_id = ? AND step >= 0 AND {_STEP_OK} "
    "ORDER BY step DESC LIMIT 1"
)
_ONE: Final = (
    f"SELECT {_COLUMNS} FROM checkpoints WHERE workflow_id = ? AND step = ? AND {_STEP_OK}"
)
_SCAN: Final = (
    f"SELECT {_COLUMNS} FROM checkpoints WHERE workflow_id = ? AND step > ? AND step <= ? "
    f"AND {_STEP_OK} ORDER BY step {{order}} LIMIT ?"
)
_EXISTS_ANY: Final = "SELECT 1 FROM checkpoints WHERE workflow_id = ? LIMIT 1"
_EXISTS_STEP: Final = "SELECT 1 FROM checkpoints WHERE workflow_id = ? AND step = ?"
# A loose index scan: one index seek per workflow instead of a pass over every row.
_WORKFLOWS: Final = """
    WITH RECURSIVE ids(id) AS (
        SELECT min(workflow_id) FROM checkpoints
        UNION ALL
        SELECT (SELECT min(workflow_id) FROM checkpoints WHERE workflow_id > ids.id)
        FROM ids WHERE ids.id IS NOT NULL
    )
    SELECT id FROM ids WHERE id IS NOT NULL
"""
# Every row, for the report of foreign rows (a full pass: only verification tools call it).
_ALL_ROWS: Final = "SELECT rowid, workflow_id, step, typeof(data) FROM checkpoints"
