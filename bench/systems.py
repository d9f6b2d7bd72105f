"""Every system the suite measures, behind one small async interface.

Three groups:

* ``ours``: :class:`aiocheckpoint.CheckpointManager` over each backend, opened with
  :func:`aiocheckpoint.open_storage`. A backend whose module is not importable yet is
  reported as not available; nothing here changes when it lands.
* ``peer``: what a user would otherwise pick: the seed's synchronous store
  (``splinter-agent``), called directly in the coroutine and through ``anyio.to_thread``, and
  LangGraph's ``AsyncSqliteSaver`` and ``AsyncPostgresSaver``.
* ``raw``: the machine's limits: plain sqlite3, plain files, plain asyncpg, with the same
  JSON bytes and the same durability (fsync / synchronous=FULL / synchronous_commit=on).

Each measurement gets a fresh system in a fresh directory (or PostgreSQL schema) that is
removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import itertools
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["ALL_SYSTEMS", "WORKLOADS", "Env", "System", "dir_bytes"]

WORKLOADS = frozenset({"write", "lag", "lookup", "growth", "resume"})
_schema_ids = itertools.count()


@dataclass
class Env:
    """Where systems put their data."""

    root: Path
    pg_dsn: str
    pg_error: str | None = None  # why PostgreSQL cannot be reached, if it cannot


def dir_bytes(path: Path) -> int:
    """Sum of the sizes of every file under ``path``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def checkpoint_sqlite_wals(path: Path) -> None:
    """Checkpoint and truncate the WAL of every SQLite database under ``path``.

    The WAL is a working file whose size depends on when SQLite last checkpointed, not on
    the history: the growth workload counts the bytes a store keeps at rest, as after its
    close (which truncates the WAL), the same way for every SQLite-based system.
    """
    for wal in path.rglob("*-wal"):
        con = sqlite3.connect(wal.with_name(wal.name[: -len("-wal")]), timeout=30)
        try:
            # A reader of the store mid-transaction makes the checkpoint stop short (busy):
            # the WAL would then be counted as history. Try again until it completes.
            for _ in range(100):
                busy = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                if not busy:
                    break
                time.sleep(0.05)
        finally:
            con.close()


def _dumps(state: Any) -> bytes:
    return json.dumps(state, separators=(",", ":")).encode()


def _missing(*modules: str) -> str | None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"cannot import {module} ({exc})"
    return None


class System:
    """One store under test. Subclasses implement the coroutines they support."""

    name: ClassVar[str]
    group: ClassVar[str]  # "ours", "peer" or "raw"
    note: ClassVar[str] = ""
    workloads: ClassVar[frozenset[str]] = WORKLOADS
    needs_postgres: ClassVar[bool] = False

    def __init__(self, workdir: Path, env: Env) -> None:
        self.workdir = workdir
        self.env = env
        self.schema = f"bench_{os.getpid()}_{next(_schema_ids)}"

    @classmethod
    def unavailable(cls, env: Env) -> str | None:
        """Why this system cannot run here, or None."""
        if cls.needs_postgres and env.pg_error:
            return f"PostgreSQL not reachable: {env.pg_error}"
        return None

    async def open(self) -> None:
        """Create the store."""

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        """Write one checkpoint durably."""
        raise NotImplementedError

    async def save_large(self, wf: str, step: int, state: dict[str, Any]) -> None:
        """:meth:`save` of a large state, held the way this system recommends for one."""
        await self.save(wf, step, state)

    async def latest(self, wf: str) -> Any:
        """Read and decode the newest checkpoint."""
        raise NotImplementedError

    async def page(self, wf: str, n: int) -> list[Any]:
        """Read and decode the newest ``n`` checkpoints."""
        raise NotImplementedError

    async def resume(self, wf: str) -> Any:
        """What a restarted workflow calls to get its state back."""
        return await self.latest(wf)

    async def stored_bytes(self) -> int:
        """Bytes the store occupies at rest: with SQLite's WAL checkpointed, as at close."""
        await asyncio.to_thread(checkpoint_sqlite_wals, self.workdir)
        return dir_bytes(self.workdir)

    async def close(self) -> None:
        """Release everything and drop what the store created outside ``workdir``."""

    # PostgreSQL helpers shared by the systems that use it.
    async def _pg_admin(self, sql: str) -> None:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(self.env.pg_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def _pg_schema_bytes(self) -> int:
        import asyncpg

        conn = await asyncpg.connect(self.env.pg_dsn)
        try:
            value = await conn.fetchval(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'm')",
                self.schema,
            )
        finally:
            await conn.close()
        return int(value)


# --------------------------------------------------------------------------- ours


class _Ours(System):
    group = "ours"
    backend: ClassVar[str]
    module: ClassVar[str | None] = None

    @classmethod
    def unavailable(cls, env: Env) -> str | None:
        if cls.module is not None:
            try:
                importlib.import_module(cls.module)
            except ImportError as exc:
                return f"{cls.module} not importable yet ({exc})"
        return super().unavailable(env)

    def _url(self) -> str:
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        return {}

    async def open(self) -> None:
        from aiocheckpoint import CheckpointManager, open_storage

        self.manager = CheckpointManager(open_storage(self._url(), **self._options()))
        self.shared: dict[str, Any] = {}

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        await self.manager.create_checkpoint(wf, step, "bench", "completed", state)

    async def save_large(self, wf: str, step: int, state: dict[str, Any]) -> None:
        """The state kept in a SharedState per workflow, as docs/state.md advises for large ones.

        Like the LangGraph writer's channels: a top-level key is set only when its value is
        not the object the previous step had; a list that grew (the same items first) is
        appended to.
        """
        from aiocheckpoint import SharedState

        shared, previous = self.shared.get(wf) or (SharedState(), {})
        changes: dict[str, Any] = {}
        for key, value in state.items():
            old = previous.get(key, _ABSENT)
            if old is value:
                continue
            if type(old) is list and type(value) is list and value[: len(old)] == old:
                shared.append(key, *value[len(old) :])
            else:
                changes[key] = value
        shared.update(changes)
        self.shared[wf] = (shared, dict(state))
        await self.manager.create_checkpoint(wf, step, "bench", "completed", shared)

    async def latest(self, wf: str) -> Any:
        return await self.manager.get_latest_checkpoint(wf)

    async def page(self, wf: str, n: int) -> list[Any]:
        return await self.manager.list_checkpoints(wf, limit=n, descending=True)

    async def resume(self, wf: str) -> Any:
        return await self.manager.get_resume_point(wf)

    async def close(self) -> None:
        manager = getattr(self, "manager", None)
        if manager is not None:
            await manager.close()


class OursMemory(_Ours):
    """CheckpointManager over InMemoryCheckpointStorage."""

    name = "ours-memory"
    backend = "memory"
    note = "in RAM, not durable; 'bytes' = the stored records and blobs"

    def _url(self) -> str:
        return "memory://"

    async def stored_bytes(self) -> int:
        total: int = self.manager.storage.stored_bytes  # type: ignore[attr-defined]
        return total


class OursFile(_Ours):
    """CheckpointManager over FileCheckpointStorage."""

    name = "ours-file"
    backend = "file"
    module = "aiocheckpoint.storage.file"

    def _url(self) -> str:
        return f"file://{self.workdir / 'store'}"


class OursSQLite(_Ours):
    """CheckpointManager over SQLiteCheckpointStorage."""

    name = "ours-sqlite"
    backend = "sqlite"
    module = "aiocheckpoint.storage.sqlite"

    def _url(self) -> str:
        return f"sqlite://{self.workdir / 'store.db'}"


class OursPostgres(_Ours):
    """CheckpointManager over PostgresCheckpointStorage, in a schema of its own."""

    name = "ours-postgres"
    backend = "postgres"
    module = "aiocheckpoint.storage.postgres"
    needs_postgres = True

    def _url(self) -> str:
        return self.env.pg_dsn

    def _options(self) -> dict[str, Any]:
        return {"schema": self.schema}

    async def open(self) -> None:
        await self._pg_admin(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        await super().open()

    async def stored_bytes(self) -> int:
        return await self._pg_schema_bytes()

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await self._pg_admin(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


# --------------------------------------------------------------------------- peers


class _Seed(System):
    group = "peer"
    direct: ClassVar[bool]

    @classmethod
    def unavailable(cls, env: Env) -> str | None:
        return _missing("splinter.coordination.checkpoint", "anyio")

    async def open(self) -> None:
        from splinter.coordination.checkpoint import (  # type: ignore[import-untyped]
            CheckpointManager,
            FileCheckpointStorage,
        )

        self.manager = CheckpointManager(storage=FileCheckpointStorage(self.workdir / "store"))

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.direct:
            return fn(*args)
        import anyio.to_thread

        return await anyio.to_thread.run_sync(functools.partial(fn, *args))

    def _save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        from splinter.schemas import (  # type: ignore[import-untyped]
            AgentStatus,
            ExecutionMetrics,
        )

        self.manager.create_checkpoint(
            workflow_id=wf,
            step=step,
            agent_id="bench",
            status=AgentStatus.COMPLETED,
            state=state,
            metrics=ExecutionMetrics(),
        )

    def _page(self, wf: str, n: int) -> list[Any]:
        # The seed has no paging: list_checkpoints reads and validates the whole history.
        return list(reversed(self.manager.list_checkpoints(wf)[-n:]))

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        await self._call(self._save, wf, step, state)

    async def latest(self, wf: str) -> Any:
        return await self._call(self.manager.get_latest_checkpoint, wf)

    async def page(self, wf: str, n: int) -> list[Any]:
        result: list[Any] = await self._call(self._page, wf, n)
        return result

    async def resume(self, wf: str) -> Any:
        return await self._call(self.manager.get_resume_point, wf)


class SeedDirect(_Seed):
    """splinter-agent's CheckpointManager + FileCheckpointStorage, called in the coroutine."""

    name = "seed-direct"
    direct = True
    note = "splinter-agent file store, sync calls on the event loop; no fsync"


class SeedThread(_Seed):
    """The same seed store, each call sent to a worker thread with anyio.to_thread."""

    name = "seed-thread"
    direct = False
    note = "splinter-agent file store via anyio.to_thread.run_sync; no fsync"


class _LangGraphWriter:
    """Turns (workflow, step, state) into LangGraph checkpoints, one channel per top-level key.

    A channel gets a new version only when its value changed, as in a real graph, so the
    PostgreSQL saver rewrites only the changed channels' blobs.
    """

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self.threads: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {}

    @staticmethod
    def config(wf: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": wf, "checkpoint_ns": ""}}

    async def put(self, wf: str, step: int, state: dict[str, Any]) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        config, previous, versions = self.threads.get(wf) or (self.config(wf), {}, {})
        versions = dict(versions)
        new_versions: dict[str, Any] = {}
        for key, value in state.items():
            old = previous.get(key, _ABSENT)
            if old is _ABSENT or (old is not value and old != value):
                versions[key] = self.saver.get_next_version(versions.get(key), None)
                new_versions[key] = versions[key]
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=step))
        checkpoint["channel_values"] = dict(state)
        checkpoint["channel_versions"] = versions
        checkpoint["updated_channels"] = sorted(new_versions)
        metadata = {"source": "loop", "step": step, "parents": {}}
        config = await self.saver.aput(config, checkpoint, metadata, new_versions)
        self.threads[wf] = (config, dict(state), versions)

    async def latest(self, wf: str) -> Any:
        return await self.saver.aget_tuple(self.config(wf))

    async def page(self, wf: str, n: int) -> list[Any]:
        return [t async for t in self.saver.alist(self.config(wf), limit=n)]


_ABSENT = object()


class LangGraphSQLite(System):
    """langgraph-checkpoint-sqlite's AsyncSqliteSaver (aiosqlite, WAL, synchronous=FULL)."""

    name = "lg-sqlite"
    group = "peer"
    note = "AsyncSqliteSaver, one aiosqlite connection"

    @classmethod
    def unavailable(cls, env: Env) -> str | None:
        return _missing("langgraph.checkpoint.sqlite.aio", "aiosqlite")

    async def open(self) -> None:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        self.conn = await aiosqlite.connect(str(self.workdir / "langgraph.db"))
        saver = AsyncSqliteSaver(self.conn)
        await saver.setup()
        self.lg = _LangGraphWriter(saver)

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        await self.lg.put(wf, step, state)

    async def latest(self, wf: str) -> Any:
        return await self.lg.latest(wf)

    async def page(self, wf: str, n: int) -> list[Any]:
        return await self.lg.page(wf, n)

    async def close(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            await conn.close()


class LangGraphPostgres(System):
    """langgraph-checkpoint-postgres's AsyncPostgresSaver over a psycopg pool of 10."""

    name = "lg-postgres"
    group = "peer"
    note = "AsyncPostgresSaver, psycopg AsyncConnectionPool(max_size=10)"
    needs_postgres = True

    @classmethod
    def unavailable(cls, env: Env) -> str | None:
        return _missing("langgraph.checkpoint.postgres.aio", "psycopg_pool") or super().unavailable(
            env
        )

    async def open(self) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        await self._pg_admin(f'CREATE SCHEMA "{self.schema}"')
        kwargs = {
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
            "options": f"-c search_path={self.schema}",
        }
        self.pool = AsyncConnectionPool(
            self.env.pg_dsn, min_size=10, max_size=10, kwargs=kwargs, open=False
        )
        await self.pool.open(wait=True)
        saver = AsyncPostgresSaver(self.pool)  # type: ignore[arg-type]
        await saver.setup()
        self.lg = _LangGraphWriter(saver)

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        await self.lg.put(wf, step, state)

    async def latest(self, wf: str) -> Any:
        return await self.lg.latest(wf)

    async def page(self, wf: str, n: int) -> list[Any]:
        return await self.lg.page(wf, n)

    async def stored_bytes(self) -> int:
        return await self._pg_schema_bytes()

    async def close(self) -> None:
        pool = getattr(self, "pool", None)
        try:
            if pool is not None:
                await pool.close()
        finally:
            await self._pg_admin(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


# --------------------------------------------------------------------------- raw limits


class _GroupCommit:
    """Queues writes and commits up to ``batch`` of them per transaction, one at a time."""

    def __init__(self, batch: int, commit: Callable[[list[Any]], Awaitable[None]]) -> None:
        self.batch = batch
        self.commit = commit
        self.queue: asyncio.Queue[tuple[Any, asyncio.Future[None]]] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def submit(self, row: Any) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self.queue.put((row, future))
        await future

    async def _run(self) -> None:
        while True:
            items = [await self.queue.get()]
            while len(items) < self.batch and not self.queue.empty():
                items.append(self.queue.get_nowait())
            try:
                await self.commit([row for row, _ in items])
            except Exception as exc:
                for _, future in items:
                    if not future.done():
                        future.set_exception(exc)
            else:
                for _, future in items:
                    if not future.done():
                        future.set_result(None)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class _RawSQLite(System):
    group = "raw"
    batch: ClassVar[int]
    workloads = frozenset({"write", "lag", "lookup", "resume"})

    async def open(self) -> None:
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="raw-sqlite")
        await self._in_thread(self._connect)
        self.writer = _GroupCommit(self.batch, self._commit)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _connect(self) -> None:
        self.db = sqlite3.connect(
            self.workdir / "raw.db", isolation_level=None, check_same_thread=False
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS ck (wf TEXT NOT NULL, step INTEGER NOT NULL,"
            " data BLOB NOT NULL, PRIMARY KEY (wf, step))"
        )

    def _write(self, rows: list[tuple[str, int, dict[str, Any]]]) -> None:
        encoded = [(wf, step, _dumps(state)) for wf, step, state in rows]
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR REPLACE INTO ck VALUES (?, ?, ?)", encoded)
        self.db.execute("COMMIT")

    async def _commit(self, rows: list[Any]) -> None:
        await self._in_thread(self._write, rows)

    def _select(self, wf: str, n: int) -> list[Any]:
        cursor = self.db.execute(
            "SELECT step, data FROM ck WHERE wf = ? ORDER BY step DESC LIMIT ?", (wf, n)
        )
        return [(step, json.loads(data)) for step, data in cursor]

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        await self.writer.submit((wf, step, state))

    async def latest(self, wf: str) -> Any:
        rows = await self._in_thread(self._select, wf, 1)
        return rows[0] if rows else None

    async def page(self, wf: str, n: int) -> list[Any]:
        result: list[Any] = await self._in_thread(self._select, wf, n)
        return result

    async def close(self) -> None:
        writer = getattr(self, "writer", None)
        if writer is not None:
            await writer.close()
        if hasattr(self, "db"):
            await self._in_thread(self.db.close)
        if hasattr(self, "executor"):
            self.executor.shutdown()


class RawSQLite1(_RawSQLite):
    """Plain sqlite3 in one thread: one row per transaction, WAL, synchronous=FULL."""

    name = "raw-sqlite-1"
    batch = 1
    note = "sqlite3, 1 row per commit, WAL + synchronous=FULL"


class RawSQLite100(_RawSQLite):
    """Plain sqlite3 group commit: up to 100 queued rows per transaction."""

    name = "raw-sqlite-100"
    batch = 100
    note = "sqlite3, up to 100 queued rows per commit, WAL + synchronous=FULL"


class RawFile(System):
    """One file per checkpoint: write, fsync, rename, fsync the directory (one thread hop)."""

    name = "raw-file"
    group = "raw"
    note = "write+fsync+rename+dir fsync in a worker thread"
    workloads = frozenset({"write", "lag", "resume"})

    async def open(self) -> None:
        self.made: set[str] = set()

    def _wf_dir(self, wf: str) -> Path:
        path = self.workdir / wf
        if wf not in self.made:
            path.mkdir(exist_ok=True)
            _fsync_dir(self.workdir)
            self.made.add(wf)
        return path

    def _write(self, wf: str, step: int, state: dict[str, Any]) -> None:
        directory = self._wf_dir(wf)
        data = _dumps(state)
        tmp = directory / f".{step}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, directory / f"{step:020d}.json")
        _fsync_dir(directory)

    def _read_latest(self, wf: str) -> Any:
        directory = self.workdir / wf
        newest = max(n for n in os.listdir(directory) if n.endswith(".json"))
        return json.loads((directory / newest).read_bytes())

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        await asyncio.to_thread(self._write, wf, step, state)

    async def latest(self, wf: str) -> Any:
        return await asyncio.to_thread(self._read_latest, wf)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _RawAsyncpg(System):
    group = "raw"
    batch: ClassVar[int]
    needs_postgres = True
    workloads = frozenset({"write", "lag", "lookup", "resume"})

    @classmethod
    def unavailable(cls, env: Env) -> str | None:
        return _missing("asyncpg") or super().unavailable(env)

    async def open(self) -> None:
        import asyncpg

        await self._pg_admin(
            f'CREATE SCHEMA "{self.schema}"; CREATE TABLE "{self.schema}".ck (wf TEXT NOT NULL,'
            " step BIGINT NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (wf, step))"
        )
        self.table = f'"{self.schema}".ck'
        self.pool = await asyncpg.create_pool(self.env.pg_dsn, min_size=10, max_size=10)
        self.insert = (
            f"INSERT INTO {self.table} VALUES ($1, $2, $3)"
            " ON CONFLICT (wf, step) DO UPDATE SET data = EXCLUDED.data"
        )
        self.writer = _GroupCommit(self.batch, self._commit) if self.batch > 1 else None

    async def _commit(self, rows: list[Any]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.executemany(self.insert, rows)

    async def save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        row = (wf, step, _dumps(state))
        if self.writer is None:
            await self.pool.execute(self.insert, *row)
        else:
            await self.writer.submit(row)

    async def page(self, wf: str, n: int) -> list[Any]:
        rows = await self.pool.fetch(
            f"SELECT step, data FROM {self.table} WHERE wf = $1 ORDER BY step DESC LIMIT $2",
            wf,
            n,
        )
        return [(r["step"], json.loads(r["data"])) for r in rows]

    async def latest(self, wf: str) -> Any:
        rows = await self.page(wf, 1)
        return rows[0] if rows else None

    async def stored_bytes(self) -> int:
        return await self._pg_schema_bytes()

    async def close(self) -> None:
        try:
            if getattr(self, "writer", None) is not None:
                await self.writer.close()  # type: ignore[union-attr]
            if hasattr(self, "pool"):
                await self.pool.close()
        finally:
            await self._pg_admin(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class RawAsyncpg1(_RawAsyncpg):
    """Plain asyncpg: one INSERT per commit over a pool of 10 connections."""

    name = "raw-pg-1"
    batch = 1
    note = "asyncpg pool(10), 1 row per commit"


class RawAsyncpg100(_RawAsyncpg):
    """Plain asyncpg group commit: up to 100 queued rows per transaction (executemany)."""

    name = "raw-pg-100"
    batch = 100
    note = "asyncpg, up to 100 queued rows per commit"


ALL_SYSTEMS: list[type[System]] = [
    OursMemory,
    OursFile,
    OursSQLite,
    OursPostgres,
    SeedDirect,
    SeedThread,
    LangGraphSQLite,
    LangGraphPostgres,
    RawSQLite1,
    RawSQLite100,
    RawFile,
    RawAsyncpg1,
    RawAsyncpg100,
]
