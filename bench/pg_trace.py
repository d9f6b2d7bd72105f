"""``bench/sweep_writers.py --trace`` on PostgreSQL: a save's stages, and what the server waits on.

Client side (:func:`hook_postgres`): each writer's save is stamped where the store's group
commit queues it (``submit``), where a writer task takes its batch (``taken``), where the
batch's connection is in hand and its statements start (``run_start``: the pool's acquire
before it), where they end (``run_end``: the server's answer, its commit included) and where
the batch's callers are resolved (``done``). The sweep's reads and writes are timed as
events (``pg_read``, ``pg_write``: from the call to its result, on the loop) and their
statements alone (``pg_read_sql``, ``pg_write_sql``: the connection in hand).

Server side (:class:`WaitSampler`): a child process samples ``pg_stat_activity`` every few
milliseconds and counts, per phase, what each of the store's backends (its
``application_name`` is the schema's name) was doing, by its statement's kind (a writer's
upsert, the sweep's page read, records read, thinning or deletes): on the CPU (active, no
wait event), waiting (the wait event), or idle in a transaction. A writer's backend waiting
on ``LWLock:WALWrite`` or ``IO:WALSync`` waits for a WAL flush; on ``Lock:*``, for a row or
a transaction; ``CPU`` beside a busy sweep backend on two cores, for a core. With each
phase come the server's WAL counters over it (``pg_stat_wal``: the whole server's, other
sessions' included): records, full-page images, bytes, writes forced by full WAL buffers.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from typing import Any

import asyncpg

from aiocheckpoint.storage.postgres import batching, sweeps

__all__ = ["WaitSampler", "hook_postgres"]

#: How often the sampler reads ``pg_stat_activity``.
SAMPLE_SECONDS = 0.004

#: Fragments of each statement kind's text (the first found names it).
_KINDS = (
    ("sweep_page", "GROUP BY workflow_id ORDER BY workflow_id LIMIT"),
    ("sweep_records", "WITH ORDINALITY AS u(w, i)"),
    ("sweep_thin", "orph AS (DELETE"),
    ("sweep_delete", "rl AS MATERIALIZED"),
    ("writer_upsert", "rec AS (INSERT INTO"),
    ("blob_release", "blob"),
    ("commit", "COMMIT"),
    ("begin", "BEGIN"),
    ("settings", "SET LOCAL"),
)


def hook_postgres(
    save_of: Callable[[], dict[str, float] | None],
    event: Callable[[str, float], None],
) -> None:
    """Stamp the writers' saves (``save_of()``: the running save's record) and sweep events."""
    _hook_group_commit(save_of)
    _hook_sweeps(event)


def _records(items: Any) -> list[dict[str, float]]:
    found = (getattr(w.future, "_bench_save", None) for w in items)
    return [r for r in found if r is not None]


def _stamp(records: list[dict[str, float]], key: str) -> None:
    now = time.perf_counter()
    for record in records:
        record[key] = now


def _hook_group_commit(save_of: Callable[[], dict[str, float] | None]) -> None:
    cls, tx = batching.GroupCommit, batching._BatchTransaction
    write, take, write_batch = cls.write, cls._take_batch, cls._write_batch
    init, run = tx.__init__, tx.run

    async def _write(self: Any, item: Any) -> None:
        record = save_of()
        if record is not None:
            record["submit"] = time.perf_counter()
            item.future._bench_save = record
        await write(self, item)

    def _take_batch(self: Any) -> Any:
        batch = take(self)
        _stamp(_records(batch), "taken")
        return batch

    def _init(self: Any, batch: Any, *args: Any) -> None:
        init(self, batch, *args)
        self._bench = _records(batch)

    async def _run(self: Any, con: Any) -> None:
        _stamp(self._bench, "run_start")
        try:
            await run(self, con)
        finally:
            _stamp(self._bench, "run_end")

    async def _write_batch(self: Any, batch: Any) -> None:
        try:
            await write_batch(self, batch)
        finally:
            _stamp(_records(batch), "done")

    cls.write = _write  # type: ignore[method-assign]
    cls._take_batch = _take_batch  # type: ignore[method-assign]
    cls._write_batch = _write_batch  # type: ignore[method-assign]
    tx.__init__ = _init  # type: ignore[method-assign,assignment]
    tx.run = _run  # type: ignore[method-assign]


def _hook_sweeps(event: Callable[[str, float], None]) -> None:
    cls = sweeps.Sweeps
    histories, thin_many, delete_workflows = cls.histories, cls.thin_many, cls.delete_workflows

    def timed(kind: str, method: Any) -> Any:
        async def wrapper(self: Any, *args: Any) -> Any:
            began = time.perf_counter()
            try:
                return await method(self, *args)
            finally:
                event(kind, began)

        return wrapper

    cls.histories = timed("pg_read", histories)  # type: ignore[method-assign]
    cls.thin_many = timed("pg_write", thin_many)  # type: ignore[method-assign]
    cls.delete_workflows = timed("pg_write", delete_workflows)  # type: ignore[method-assign]


def _kind(query: str) -> str:
    for kind, fragment in _KINDS:
        if fragment in query:
            return kind
    return "other"


async def _sample(dsn: str, schema: str, pipe: Pipe) -> None:
    con = await asyncpg.connect(dsn)
    counts: dict[str, Counter[str]] = {}
    wal: dict[str, dict[str, int]] = {}
    phase: str | None = None
    try:
        while True:
            if pipe.poll():
                stats = await _wal(con)
                if phase is not None:  # the phase's WAL (the whole server's: others' too)
                    wal[phase] = {k: v - wal[phase].get(k, 0) for k, v in stats.items()}
                phase = pipe.recv()
                if phase is None:
                    break
                counts.setdefault(phase, Counter())
                wal[phase] = stats
            if phase is not None:
                for state, kind, name, query in await con.fetch(_ACTIVITY, schema):
                    what = "CPU" if kind is None else f"{kind}:{name}"
                    if state != "active":
                        what = state
                    counts[phase][f"{_kind(query)} {what}"] += 1
                counts[phase]["_samples"] += 1
            await asyncio.sleep(SAMPLE_SECONDS)
    finally:
        await con.close()
    pipe.send({p: {**dict(c.most_common()), "_wal": wal.get(p)} for p, c in counts.items()})


_ACTIVITY = (
    "SELECT state, wait_event_type, wait_event, query FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND application_name = $1 AND state <> 'idle'"
)
_WAL = (
    "SELECT wal_records, wal_fpi, wal_bytes::bigint, wal_buffers_full, wal_write, wal_sync "
    "FROM pg_stat_wal"
)


async def _wal(con: Any) -> dict[str, int]:
    """The server's WAL counters now (``pg_stat_wal``)."""
    return {k: int(v) for k, v in dict(await con.fetchrow(_WAL)).items()}


def _sampler_main(dsn: str, schema: str, pipe: Pipe) -> None:
    asyncio.run(_sample(dsn, schema, pipe))


class WaitSampler:
    """The child process sampling the server's view of one store's backends, per phase."""

    def __init__(self, dsn: str, schema: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._pipe, child = ctx.Pipe()
        self._process = ctx.Process(target=_sampler_main, args=(dsn, schema, child), daemon=True)
        self._process.start()

    def phase(self, name: str) -> None:
        """Count the samples from now on under ``name``."""
        self._pipe.send(name)

    def finish(self) -> dict[str, dict[str, Any]]:
        """Stop sampling; the counts of each phase (``"kind wait"``: samples; its WAL)."""
        self._pipe.send(None)
        counts: dict[str, dict[str, Any]] = self._pipe.recv()
        self._process.join(5)
        return counts
