"""Batched sweeps in SQLite: a batch of workflows read in one read, deleted in a few writes.

:func:`read_histories` runs in a read thread (one read transaction); :func:`thin_one` and
:func:`delete_one` run in the writer's transaction, as many workflows per transaction as
a slice's time allows (:meth:`~.groupcommit.GroupCommit._in_slices`): a batch of workflows
costs a commit (one fsync) per few milliseconds of deletes, however many steps it
deletes, and a save queued meanwhile waits one slice at most. The triggers take a deleted
step's effects and queue its blobs' references for release, as they do for any delete.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Final

from ..base import History, HistoryRecords, histories_to_read
from ..turns import gil_breaks
from . import effects
from .foreign import id_problem
from .writer import delete_untouched

__all__ = ["CutRow", "delete_one", "read_histories", "thin_one"]

#: Ids per statement: well under SQLite's variable limit.
_CHUNK: Final = 500
_STEP_OK: Final = "typeof(step) = 'integer' AND step >= 0"
_DELETE_EFFECTS: Final = "DELETE FROM effects WHERE workflow_id = ?"
_DELETE_STEPS: Final = "DELETE FROM checkpoints WHERE workflow_id = ?"
_WORKFLOW: Final = itemgetter(0)


def _marks(count: int) -> str:
    return ",".join("?" * count)


#: The next workflows with checkpoints after ?1, ?2 of them, in id order (an index walk):
#: each one's count, lowest step, bytes (``length`` reads no data), whether it has effects
#: below its lowest step, whether its record says PAUSED and its record's kind (one index
#: probe each).
_PAGE: Final = f"""
    SELECT g.w, g.n, g.low, g.size,
        EXISTS (SELECT 1 FROM effects AS e WHERE e.workflow_id = g.w AND e.step < g.low),
        EXISTS (SELECT 1 FROM workflows AS x WHERE x.workflow_id = g.w AND x.status = 'paused'),
        (SELECT x.kind FROM workflows AS x WHERE x.workflow_id = g.w)
    FROM (
        SELECT workflow_id AS w, count(*) AS n, min(step) AS low, sum(length(data)) AS size
        FROM checkpoints
        WHERE workflow_id > ?1 AND typeof(workflow_id) = 'text' AND {_STEP_OK}
        GROUP BY workflow_id ORDER BY workflow_id LIMIT ?2
    ) AS g
"""


def read_histories(
    conn: sqlite3.Connection,
    after: str | None,
    limit: int,
    budget: tuple[int, int, int],
    max_bytes: int,
    busy: Callable[[], bool],
    held: Callable[[], bool] | None = None,
) -> list[History]:
    """The next ``limit`` histories after ``after`` from one snapshot (``SweepStorage``).

    ``budget`` is ``(more_than, max_records, max_bytes)`` of
    :func:`~..base.histories_to_read`; ``max_bytes`` the largest record this store reads;
    ``busy`` whether the loops over rows rest for the writer thread, ``held`` whether
    saves are in flight (:func:`.gil_breaks`).
    """
    conn.execute("BEGIN")
    try:
        rows = conn.execute(_PAGE, ("" if after is None else after, limit)).fetchall()
        rows = [row for row in gil_breaks(rows, busy, held) if id_problem(row[0]) is None]
        sizes = {row[0]: (row[1], row[3]) for row in rows}
        found = _records(conn, histories_to_read(sizes, *budget), max_bytes, busy, held)
    finally:
        conn.execute("COMMIT")
    return [
        History(wf, n, low, bool(orphans), bool(paused), kind, found.get(wf))
        for wf, n, low, _size, orphans, paused, kind in gil_breaks(rows, busy, held)
    ]


def _records(
    conn: sqlite3.Connection,
    ids: list[str],
    max_bytes: int,
    busy: Callable[[], bool],
    held: Callable[[], bool] | None,
) -> dict[str, HistoryRecords]:
    """Every record of ``ids``, newest first; a workflow with one over the limit left out.

    The rows come grouped by workflow: each group becomes one :class:`~..base.HistoryRecords`,
    with no object per record the collector tracks.
    """
    found: dict[str, HistoryRecords] = {}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        sql = (
            "SELECT workflow_id, step, CASE WHEN length(data) <= ? THEN data END "
            f"FROM checkpoints WHERE workflow_id IN ({_marks(len(chunk))}) AND {_STEP_OK} "
            "ORDER BY workflow_id, step DESC"
        )
        # Rows as the cursor steps (not fetchall): each goes once grouped, so the rows
        # add nothing to the count of objects that sets off the collector's passes.
        rows = conn.execute(sql, [max_bytes, *chunk])
        for wf, group in groupby(gil_breaks(rows, busy, held), _WORKFLOW):
            steps: list[int] = []
            records: list[bytes] = []
            for _wf, step, data in group:
                steps.append(step)
                records.append(data)
            if all(type(data) is bytes for data in records):
                found[wf] = HistoryRecords(tuple(steps), tuple(records))
    return found


#: A checked cut's fields: ``(workflow_id, steps, below)`` (:class:`~..base.Cut`'s).
CutRow = tuple[str, tuple[int, ...], int | None]


def thin_one(conn: sqlite3.Connection, now: float, cut: CutRow) -> tuple[str, tuple[int, ...], int]:
    """Delete one cut's steps and orphaned effects, in the writer's transaction.

    Returns its workflow, the steps deleted (another sweeper may have taken some already:
    ``RETURNING`` says which were still there, with no read of its own) and the orphans
    dropped: a plain tuple, which the garbage collector stops tracking (a sweep's write
    keeps every workflow's outcome until its last slice).
    """
    wf, cut_steps, below = cut
    present: list[int] = []
    for start in range(0, len(cut_steps), _CHUNK):
        steps = cut_steps[start : start + _CHUNK]
        marks = _marks(len(steps))
        # The effects of every cut step, with a checkpoint or not (the trigger takes only the
        # former), then the checkpoints.
        conn.execute(f"{_DELETE_EFFECTS} AND step IN ({marks})", (wf, *steps))
        rows = conn.execute(f"{_DELETE_STEPS} AND step IN ({marks}) RETURNING step", (wf, *steps))
        present += [step for (step,) in rows.fetchall()]
    dropped = 0
    if below is not None:
        dropped = effects.drop_orphans(conn, now, workflow_id=wf, below=below)
    return wf, tuple(present), dropped


def delete_one(conn: sqlite3.Connection, now: float, pair: tuple[str, datetime]) -> int | None:
    """The workflow of ``pair`` untouched since its time, deleted whole; its bytes or None."""
    return delete_untouched(conn, now, workflow_id=pair[0], updated_at=pair[1])
