"""Workflow records and leases on the durable backends (SQLite and PostgreSQL) beyond the
conformance suite: stale holders, fenced group commit, token monotonicity, v1 migrations."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from aiocheckpoint import (
    CheckpointManager,
    InMemoryCheckpointStorage,
    LeaseLostError,
    ResumableWorkflow,
    StorageBackendError,
    WorkflowStatus,
)
from aiocheckpoint.storage.base import WorkflowStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres.schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite.schema import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from tests.pg_support import DSN, pg_schema, terminate_backends

__all__ = ["pg_schema"]

Factory = Callable[..., WorkflowStorage]


@pytest.fixture(params=["sqlite", "postgres"])
async def factory(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[Factory]:
    """Opens storages on one store; each call is a new, independent storage object."""
    opened: list[WorkflowStorage] = []

    def make(*, track: bool = True) -> WorkflowStorage:
        store: WorkflowStorage
        if request.param == "sqlite":
            store = SQLiteCheckpointStorage(tmp_path / "leases.db")
        else:
            store = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=4)
        if track:  # else the caller closes it (on the event loop that used it)
            opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


def in_other_thread(fn: Callable[[], Awaitable[Any]]) -> threading.Thread:
    """Run ``fn`` on its own event loop in a thread (another "runner" while ours is paused)."""
    thread = threading.Thread(target=lambda: asyncio.run(fn()))  # type: ignore[arg-type]
    thread.start()
    return thread


async def test_paused_holder_is_fenced_out_after_takeover(factory: Factory) -> None:
    """A runner paused past its lease's expiry cannot write once another runner took over."""
    ours = CheckpointManager(factory())
    await ours.register_workflow("wf")
    taken = threading.Event()
    taker: dict[str, Any] = {}

    async def take_over() -> None:
        async with CheckpointManager(factory(track=False)) as theirs:
            # Polling the store is the runner idiom: the expiry happens in the database.
            while (lease := await theirs.claim_workflow("runner-b", ttl=30)) is None:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            await theirs.create_checkpoint("wf", 1, "b", "completed", {"by": "b"}, lease=lease)
        taker["lease"] = lease
        taken.set()

    wf = ResumableWorkflow("wf", ours, lease_owner="runner-a", lease_ttl=0.3)
    with pytest.raises(LeaseLostError):
        async with wf:
            async with wf.step(0, agent_id="a"):
                wf.state.set("by", "a")
            async with wf.step(1, agent_id="a"):
                thread = in_other_thread(take_over)
                # A stop-the-world pause: the event loop (and so the renewal task) is frozen
                # while the lease expires and runner-b claims the workflow and writes step 1.
                assert taken.wait(timeout=30)
                wf.state.set("by", "stale a")
    thread.join()
    latest = await ours.get_latest_checkpoint("wf")
    assert latest is not None
    assert (latest.step, latest.state_snapshot.data) == (1, {"by": "b"})
    record = await ours.get_workflow("wf")
    assert record is not None
    assert record.status is WorkflowStatus.UNFINISHED  # a's FAILED mark was fenced out too
    assert record.lease_owner == "runner-b"
    assert record.fencing_token == taker["lease"].token
    await ours.close()


async def test_stale_fence_fails_only_its_caller_in_a_batch(factory: Factory) -> None:
    """Concurrent saves share commits; the stale-fenced ones fail alone, the rest land."""
    storage = factory()
    stale = await storage.acquire_lease("old", "a", 30)
    await storage.release_lease(stale)
    await storage.acquire_lease("old", "b", 30)
    live = await storage.acquire_lease("live", "c", 30)

    async def save(n: int) -> BaseException | None:
        try:
            if n % 3 == 0:
                await storage.save("old", n, b"stale", fence=stale)
            elif n % 3 == 1:
                await storage.save("live", n, b"fenced", fence=live)
            else:
                await storage.save(f"plain-{n}", 0, b"plain")
        except BaseException as exc:
            return exc
        return None

    outcomes = await asyncio.gather(*(save(n) for n in range(60)))
    for n, outcome in enumerate(outcomes):
        if n % 3 == 0:
            assert isinstance(outcome, LeaseLostError)
        else:
            assert outcome is None
    assert not await storage.exists("old")
    assert len(await storage.scan("live")) == 20
    plain = await storage.get_workflow("plain-2")
    assert plain is not None and plain.status is WorkflowStatus.UNFINISHED
    old = await storage.get_workflow("old")
    assert old is not None and old.lease_owner == "b"


async def test_stale_writer_prunes_nothing(factory: Factory) -> None:
    """A refused fenced save with keep_last deletes none of the new holder's checkpoints."""
    storage = factory()
    old = await storage.acquire_lease("wf", "a", 30)
    await storage.release_lease(old)
    new = await storage.acquire_lease("wf", "b", 30)
    for step in range(5):
        await storage.save("wf", step, b"new", fence=new)
    with pytest.raises(LeaseLostError):
        await storage.save("wf", 9, b"stale", keep_last=1, fence=old)
    assert [c.step for c in await storage.scan("wf")] == [0, 1, 2, 3, 4]


async def test_tokens_grow_across_delete_and_recreate(factory: Factory) -> None:
    """A workflow deleted and created again never reissues an old fencing token."""
    storage = factory()
    first = await storage.acquire_lease("wf", "a", 30)
    await storage.save("wf", 0, b"x", fence=first)
    assert await storage.delete("wf")
    assert await storage.get_workflow("wf") is None
    second = await storage.acquire_lease("wf", "a", 30)
    assert second.token > first.token
    with pytest.raises(LeaseLostError):
        await storage.save("wf", 0, b"from the old life", fence=first)


async def test_leases_are_shared_between_storage_objects(factory: Factory) -> None:
    """Two storage objects on one store (two runners) see each other's leases and claims."""
    a, b = factory(), factory()
    for n in range(6):
        await a.set_workflow_status(f"wf-{n}", WorkflowStatus.UNFINISHED)
    claims = await asyncio.gather(
        *(s.claim_next_workflow(f"r{i}", 30) for i, s in enumerate([a, b] * 4))
    )
    got = [c.workflow_id for c in claims if c is not None]
    assert sorted(got) == [f"wf-{n}" for n in range(6)]
    assert claims.count(None) == 2


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_deleting_a_workflow_without_checkpoints_drops_its_record(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    """delete(workflow) removes a registered, leased workflow's record even with no checkpoint."""
    storage: WorkflowStorage
    if backend == "memory":
        storage = InMemoryCheckpointStorage()
    elif backend == "sqlite":
        storage = SQLiteCheckpointStorage(tmp_path / "del.db")
    else:
        storage = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2)
    async with storage:
        await storage.set_workflow_status("wf", WorkflowStatus.UNFINISHED)
        lease = await storage.acquire_lease("wf", "a", 30)
        assert await storage.delete("wf")
        assert await storage.get_workflow("wf") is None
        assert await storage.claim_next_workflow("b", 30) is None
        with pytest.raises(LeaseLostError):
            await storage.renew_lease(lease, 30)
        assert not await storage.delete("wf")


async def test_postgres_lease_calls_survive_terminated_connections(pg_schema: str) -> None:
    """Renew, fenced save, status and release are retried on a fresh connection after
    pg_terminate_backend; a claim either succeeds or fails with StorageBackendError."""
    app = f"aiocp-lease-{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(DSN)
    storage = PostgresCheckpointStorage(
        DSN, schema=pg_schema, min_size=1, max_size=1, server_settings={"application_name": app}
    )

    async def terminate() -> None:
        assert await terminate_backends(admin, app) == 1

    try:
        lease = await storage.acquire_lease("wf", "a", 30)
        await terminate()
        lease = await storage.renew_lease(lease, 30)
        await terminate()
        await storage.save("wf", 0, b"x", fence=lease)
        await terminate()
        await storage.set_workflow_status("wf", WorkflowStatus.UNFINISHED, fence=lease)
        await terminate()
        await storage.release_lease(lease)
        await terminate()
        try:
            claimed = await storage.claim_next_workflow("b", 30)
        except StorageBackendError:
            claimed = await storage.claim_next_workflow("b", 30)
        assert claimed is not None and claimed.token > lease.token
        got = await storage.load("wf", 0)
        assert got is not None and got.data == b"x"
    finally:
        await storage.close()
        await admin.close()


# --- migrations from the version-1 schema ----------------------------------------------------

V1_SQLITE = (
    """
    CREATE TABLE checkpoints (
        id          INTEGER PRIMARY KEY,
        workflow_id TEXT    NOT NULL CHECK (typeof(workflow_id) = 'text'),
        step        INTEGER NOT NULL CHECK (typeof(step) = 'integer' AND step >= 0),
        data        BLOB    NOT NULL CHECK (typeof(data) = 'blob')
    )
    """,
    "CREATE UNIQUE INDEX checkpoints_workflow_step ON checkpoints (workflow_id, step)",
)


async def test_sqlite_v1_store_gets_records_on_open(tmp_path: Path) -> None:
    """A version-1 SQLite store is migrated on open: old workflows become UNFINISHED records."""
    db = tmp_path / "v1.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    for statement in V1_SQLITE:
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO checkpoints (workflow_id, step, data) VALUES (?, ?, ?)",
        [("a", 0, b"a0"), ("a", 1, b"a1"), ("b'); DROP TABLE x; --", 0, b"b0")],
    )
    conn.execute("PRAGMA user_version = 1")
    conn.execute(f"PRAGMA application_id = {0x41434B50}")
    conn.close()
    async with SQLiteCheckpointStorage(db) as storage:
        records = await storage.list_workflow_records(WorkflowStatus.UNFINISHED)
        assert [r.workflow_id for r in records] == ["a", "b'); DROP TABLE x; --"]
        assert all(r.fencing_token == 0 and r.lease_owner is None for r in records)
        got = await storage.load("a")
        assert got is not None and got.data == b"a1"
        lease = await storage.claim_next_workflow("runner", 30)
        assert lease is not None and lease.token == 1
        await storage.save(lease.workflow_id, 5, b"new", fence=lease)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchall() == [(SQLITE_SCHEMA_VERSION,)]
    conn.close()


async def test_postgres_v1_store_gets_records_on_open(pg_schema: str) -> None:
    """A version-1 PostgreSQL store is migrated on open: old workflows get UNFINISHED records."""
    admin = await asyncpg.connect(DSN)
    s = f'"{pg_schema}"'
    try:
        await admin.execute(f"CREATE SCHEMA {s}")
        await admin.execute(f"CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)")
        await admin.execute(f"INSERT INTO {s}.meta VALUES ('schema_version', '1')")
        await admin.execute(
            f"""CREATE TABLE {s}.checkpoints (
                workflow_id text COLLATE "C" NOT NULL
                    CHECK (octet_length(workflow_id) BETWEEN 1 AND 255),
                step bigint NOT NULL CHECK (step >= 0),
                data bytea NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (workflow_id, step))"""
        )
        await admin.executemany(
            f"INSERT INTO {s}.checkpoints (workflow_id, step, data) VALUES ($1, $2, $3)",
            [("a", 0, b"a0"), ("a", 1, b"a1"), ("b", 0, b"b0")],
        )
        async with PostgresCheckpointStorage(DSN, schema=pg_schema) as storage:
            records = await storage.list_workflow_records()
            assert [(r.workflow_id, r.status) for r in records] == [
                ("a", WorkflowStatus.UNFINISHED),
                ("b", WorkflowStatus.UNFINISHED),
            ]
            got = await storage.load("a")
            assert got is not None and got.data == b"a1"
            lease = await storage.claim_next_workflow("runner", 30)
            assert lease is not None
            await storage.save(lease.workflow_id, 5, b"new", fence=lease)
        assert await admin.fetchval(f"SELECT value FROM {s}.meta") == str(PG_SCHEMA_VERSION)
    finally:
        await admin.close()
