"""Batched sweeps in PostgreSQL: a batch of workflows read in one read, deleted in one statement.

Each statement takes the locks in the order every other write takes them: workflow
records first (in id order), then checkpoint rows in ``(workflow_id, step)`` order, then
the effect journal; the deleted records' blob references are released in the same
transaction (:meth:`.records.Records.releasing`). Like the one-workflow deletes of
:mod:`.sql`, a deleted step takes its effects in the same statement.
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..base import Cut, History, HistoryRecords, histories_to_read
from ..turns import in_turns
from .connection import Connection
from .records import Records
from .sql import VERSION_2

__all__ = ["PAGE_SETTINGS", "PLANNER_SETTINGS", "Sweeps"]

#: Run first in each of a sweep's transactions. Without statistics (a store autovacuum has
#: not analyzed yet) the planner takes these statements for large ones and compiles them
#: (JIT): up to a second per statement, for statements that run in milliseconds; or it
#: joins a page's ids to a sequential scan of every checkpoint, or starts parallel workers
#: for a page (50-150 ms each on a loaded machine). Each statement is meant to probe the
#: primary key, whatever the statistics say. The deleted rows the effects'
#: statement trigger reads stay in memory up to ``work_mem`` (the default 4 MB spilled a
#: batch to disk and cost as much as the deletes).
PLANNER_SETTINGS = (
    "SET LOCAL jit = off; SET LOCAL enable_seqscan = off; "
    "SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL work_mem = '64MB'"
)
#: And for the read of a page of histories: no hash aggregate and no sort of the rows
#: after ``$1`` (a store never analyzed estimates a few hundred distinct ids in all).
PAGE_SETTINGS = PLANNER_SETTINGS + "; SET LOCAL enable_hashagg = off; SET LOCAL enable_sort = off"
#: A read of a page: one snapshot, read only, with :data:`PAGE_SETTINGS`.
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; " + PAGE_SETTINGS


class Sweeps:
    """The batched sweep statements of one store; arguments are checked already."""

    def __init__(
        self, connection: Connection, quoted: str, records: Records, max_record_bytes: int
    ) -> None:
        self._connection = connection
        self._records = records
        self._max = max_record_bytes
        self._quoted = quoted
        t, w, e = f"{quoted}.checkpoints", f"{quoted}.workflows", f"{quoted}.effects"
        # The next $2 workflows with checkpoints after $1, in id order (a walk of the
        # primary key, grouped as it goes: PAGE_SETTINGS leave the planner no other plan):
        # each one's count, lowest step, bytes, whether it has effects below its lowest
        # step, whether its record says PAUSED and its record's kind. (Counting from the
        # key's columns alone, bytes only for the histories read, made the walk an
        # index-only one on a vacuumed table but twice as slow right after a bulk sweep,
        # before autovacuum: bench/NOTES.md.)
        self._page = (
            "SELECT g.w, g.n, g.low, g.size, "
            f"EXISTS (SELECT 1 FROM {e} AS x WHERE x.workflow_id = g.w AND x.step < g.low), "
            f"EXISTS (SELECT 1 FROM {w} AS r WHERE r.workflow_id = g.w AND r.status = 'paused'), "
            f"(SELECT r.kind FROM {w} AS r WHERE r.workflow_id = g.w) "
            "FROM (SELECT workflow_id AS w, count(*) AS n, min(step) AS low, "
            f"sum(octet_length(data)) AS size FROM {t} WHERE workflow_id > $1 "
            "GROUP BY workflow_id ORDER BY workflow_id LIMIT $2) AS g"
        )
        # Each workflow's records by an index probe of its own, packed into one bytea per
        # workflow (8-byte step, 4-byte length, the record; in any order), NULL for one
        # with a record over $2. A row per record made ~20,000 asyncpg records per page,
        # each tracked by the collector and alive across the fetch's young collections:
        # most reached the oldest generation and set off full collections (bench/NOTES.md).
        self._records_of = (
            "SELECT u.w, (SELECT CASE WHEN bool_or(octet_length(c.data) > $2) THEN NULL "
            "ELSE string_agg(int8send(c.step) || int4send(octet_length(c.data)) || c.data, "
            f"''::bytea) END FROM {t} AS c WHERE c.workflow_id = u.w) "
            "FROM unnest($1::text[]) AS u(w)"
        )
        v2 = VERSION_2.format(c="c.data")
        self._thin = (
            "WITH r AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::bigint[]) AS r(w, s)), "
            f"lk AS MATERIALIZED (SELECT c.workflow_id AS w, c.step AS s FROM {t} AS c "
            "JOIN r ON c.workflow_id = r.w AND c.step = r.s ORDER BY 1, 2 FOR UPDATE OF c), "
            f"cps AS (DELETE FROM {t} AS c USING lk WHERE c.workflow_id = lk.w "
            f"AND c.step = lk.s RETURNING c.workflow_id AS w, c.step AS s, {v2} AS d), "
            f"fx AS (DELETE FROM {e} AS x USING r WHERE x.workflow_id = r.w AND x.step = r.s "
            "AND (SELECT count(*) FROM lk) >= 0), "
            "o AS MATERIALIZED (SELECT * FROM unnest($3::text[], $4::bigint[]) AS o(w, b)), "
            # The steps below ``b`` without a checkpoint in this statement's snapshot: the
            # steps ``cps`` deletes still have theirs here, and ``fx`` takes their effects.
            f"orph AS (DELETE FROM {e} AS x USING o WHERE x.workflow_id = o.w AND x.step < o.b "
            # OFFSET 0 keeps the test a probe of the primary key per effect: without it,
            # a store without statistics may plan an anti join over every checkpoint.
            f"AND NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.workflow_id = o.w "
            "AND c.step = x.step OFFSET 0) AND (SELECT count(*) FROM lk) >= 0 RETURNING 1), "
            # The events below ``b``, thinned with the checkpoints they describe.
            f"ev AS (DELETE FROM {quoted}.workflow_events AS v USING o "
            "WHERE v.workflow_id = o.w AND v.step < o.b) "
            "SELECT (SELECT count(*) FROM orph), (SELECT array_agg(w) FROM cps), "
            "(SELECT array_agg(s) FROM cps), (SELECT array_agg(d) FROM cps WHERE d IS NOT NULL)"
        )
        self._delete = (
            "WITH r AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::timestamptz[]) "
            "AS r(w, u)), "
            # Locked in id order, each only while untouched since the sweep read it (a
            # record updated meanwhile is read again, and then fails the test).
            f"rl AS MATERIALIZED (SELECT x.workflow_id AS w FROM {w} AS x JOIN r "
            "ON x.workflow_id = r.w AND x.updated_at = r.u "
            "WHERE x.lease_owner IS NULL OR x.lease_expires_at <= now() "
            "ORDER BY 1 FOR UPDATE OF x), "
            f"rec AS (DELETE FROM {w} AS x USING rl WHERE x.workflow_id = rl.w "
            "RETURNING x.workflow_id AS w), "
            f"lk AS MATERIALIZED (SELECT c.workflow_id AS w, c.step AS s FROM {t} AS c "
            "WHERE c.workflow_id IN (SELECT w FROM rec) ORDER BY 1, 2 FOR UPDATE OF c), "
            f"cps AS (DELETE FROM {t} AS c USING lk WHERE c.workflow_id = lk.w "
            f"AND c.step = lk.s RETURNING c.workflow_id AS w, octet_length(c.data) AS n, "
            f"{v2} AS d), "
            f"fx AS (DELETE FROM {e} AS x WHERE x.workflow_id IN (SELECT w FROM rec) "
            "AND (SELECT count(*) FROM lk) >= 0) "
            "SELECT (SELECT array_agg(w) FROM rec), (SELECT array_agg(w) FROM cps), "
            "(SELECT array_agg(n) FROM cps), (SELECT array_agg(d) FROM cps WHERE d IS NOT NULL)"
        )

    async def histories(
        self, after: str | None, limit: int, budget: tuple[int, int, int]
    ) -> list[History]:
        """The next ``limit`` histories after ``after``, from one snapshot (``SweepStorage``).

        ``budget`` is ``(more_than, max_records, max_bytes)`` of ``histories_to_read``.
        """

        async def read(con: Any) -> list[History]:
            # The transaction and its settings in one round trip (con.transaction() takes
            # one of its own): a sweep with nothing to delete is mostly these reads.
            await con.execute(_BEGIN_READ)
            try:
                # Plain tuples at once: tuples of strings, ints and bools leave the
                # collector's tracking at its next young pass; asyncpg's records do not.
                page = [
                    tuple(row)
                    for row in await con.fetch(self._page, "" if after is None else after, limit)
                ]
                sizes = dict(await in_turns(_sizes, page))
                wanted = histories_to_read(sizes, *budget)
                packed: dict[str, bytes | None] = {}
                if wanted:
                    # Into a dict of strings and bytes (untracked) in one step: the
                    # fetched records are freed before the unpacking allocates anything.
                    packed = dict(await con.fetch(self._records_of, wanted, self._max))
            except BaseException:
                if not con.is_closed() and con.is_in_transaction():
                    await con.execute("ROLLBACK")
                raise
            await con.execute("COMMIT")
            found = await _grouped(packed)
            return await in_turns(lambda row: _history(row, found), page)

        return await self._connection.run("sweep's read", read)

    async def thin_many(self, cuts: Sequence[Cut]) -> tuple[list[tuple[str, int]], int]:
        """Delete every cut in one statement and transaction (``SweepStorage``)."""
        steps = [(cut.workflow_id, step) for cut in cuts for step in cut.steps]
        below = [(cut.workflow_id, cut.below) for cut in cuts if cut.below is not None]
        args = (
            [w for w, _ in steps],
            [s for _, s in steps],
            [w for w, _ in below],
            [b for _, b in below],
        )

        async def run(con: Any) -> tuple[tuple[list[tuple[str, int]], int], list[bytes] | None]:
            await con.execute(PLANNER_SETTINGS)
            dropped, ids, deleted, released = await con.fetchrow(self._thin, *args)
            pairs = list(zip(ids or [], deleted or [], strict=True))
            return (pairs, int(dropped)), released

        return await self._records.releasing("sweep's thinning", run)

    async def delete_workflows(self, pairs: Sequence[tuple[str, datetime]]) -> list[int | None]:
        """Delete each untouched workflow whole, in one statement (``SweepStorage``)."""
        args = ([wf for wf, _ in pairs], [at for _, at in pairs])

        async def run(con: Any) -> tuple[list[int | None], list[bytes] | None]:
            await con.execute(PLANNER_SETTINGS)
            gone, ids, sizes, released = await con.fetchrow(self._delete, *args)
            total: Counter[str] = Counter()
            for wf, size in zip(ids or [], sizes or [], strict=True):
                total[wf] += int(size)
            deleted = set(gone or [])
            return [total[wf] if wf in deleted else None for wf, _ in pairs], released

        return await self._records.releasing("sweep's deletes", run)

    async def compact(self) -> tuple[int, int]:
        """``VACUUM (ANALYZE)`` each of the store's tables; their bytes before and after.

        Dead rows become reusable and the planner's statistics are fresh; only empty pages
        at a table's end go back to the filesystem (``VACUUM FULL`` would rewrite the
        tables, locking out every reader and writer meanwhile: left to the operator).
        """

        async def run(con: Any) -> tuple[int, int]:
            tables = await con.fetch(_TABLES, self._quoted)
            before = await con.fetchval(_BYTES, self._quoted)
            for (table,) in tables:
                # A name from pg_class, quoted: VACUUM takes no parameters.
                escaped = str(table).replace('"', '""')
                await con.execute(f'VACUUM (ANALYZE) {self._quoted}."{escaped}"')
            return int(before), int(await con.fetchval(_BYTES, self._quoted))

        return await self._connection.run("compact", run, retry=False)


_TABLES = "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind = 'r'"
_BYTES = (
    "SELECT coalesce(sum(pg_total_relation_size(oid)), 0) FROM pg_class "
    "WHERE relnamespace = $1::regnamespace AND relkind = 'r'"
)


async def _grouped(packed: dict[str, bytes | None]) -> dict[str, HistoryRecords]:
    """Each workflow's records, newest first; one over the limit left out.

    Other tasks run every few dozen workflows.
    """
    found: dict[str, HistoryRecords] = {}
    items = list(packed.items())
    for start in range(0, len(items), _WORKFLOWS_PER_TURN):
        if start:
            await asyncio.sleep(0)
        for wf, records in items[start : start + _WORKFLOWS_PER_TURN]:
            if records is not None:
                found[wf] = unpacked(records)
    return found


#: Workflows unpacked per loop turn by :func:`_grouped` (~10 records each).
_WORKFLOWS_PER_TURN = 32
_HEAD = struct.Struct(">qi")


def unpacked(packed: bytes) -> HistoryRecords:
    """A workflow's records from their packed form, newest first."""
    steps: list[int] = []
    data: list[bytes] = []
    at, end = 0, len(packed)
    while at < end:
        step, size = _HEAD.unpack_from(packed, at)
        at += _HEAD.size
        steps.append(step)
        data.append(packed[at : at + size])
        at += size
    return HistoryRecords.newest_first(steps, data)


def _sizes(row: Any) -> tuple[str, tuple[int, int]]:
    return row[0], (int(row[1]), int(row[3]))


def _history(row: Any, found: dict[str, HistoryRecords]) -> History:
    wf, n, low, _size, orphans, paused, kind = row
    return History(wf, int(n), int(low), bool(orphans), bool(paused), kind, found.get(wf))
