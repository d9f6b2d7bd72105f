"""A SQLite status change's cost in the writer thread, this tree vs another, side by side.

    python bench/status_writer.py --base-src /path/to/other/checkout/src [--rounds N] [--n N]

What ``bench/events_cost.py`` cannot isolate on a loaded machine: the writer thread's own
work for ``mark_workflow`` paused and back, run by each tree's ``records.set_status`` on a
real SQLite file (WAL, ``synchronous=NORMAL`` as the store opens it), in a subprocess per
tree and round, alternately. Two figures, microseconds of that thread's CPU time per status
change: ``statements`` (all of them in one open transaction: the SQL and Python of the
change) and ``committed`` (each change its own transaction: the WAL pages it writes too).
Prints each figure's median per side and the ratio head / base (``events_cost.compare``).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # not ROOT / "src": the child measures PYTHONPATH's tree
from bench.events_cost import command  # noqa: E402


def child(n: int) -> None:
    """Measure with the tree on ``PYTHONPATH``; one JSON line."""
    from aiocheckpoint.leases import WorkflowStatus
    from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage, records

    async def make(path: Path) -> None:
        async with SQLiteCheckpointStorage(path) as storage:
            await storage.register_workflow("toggle")

    def changes(conn: sqlite3.Connection, commit: bool) -> float:
        started = time.thread_time()
        for _ in range(n):
            for status in (WorkflowStatus.PAUSED, WorkflowStatus.UNFINISHED):
                if commit:
                    conn.execute("BEGIN IMMEDIATE")
                records.set_status(conn, time.time(), "toggle", status, None)
                if commit:
                    conn.execute("COMMIT")
        return (time.thread_time() - started) / (2 * n) * 1e6

    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "status.db"
        asyncio.run(make(path))
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        statements = changes(conn, commit=False)
        conn.execute("COMMIT")
        committed = changes(conn, commit=True)
        conn.close()
    print(json.dumps({"backend": "sqlite", "statements": statements, "committed": committed}))


def main() -> None:
    """Parse the arguments; alternate the two trees; print medians and ratios."""
    command(child, __file__, rounds=7, n=1000)


if __name__ == "__main__":
    main()
