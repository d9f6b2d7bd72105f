"""PostgreSQL backend behaviour beyond the conformance suite, against the real server."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    InvalidArgumentError,
    LeaseLostError,
    StorageBackendError,
    StorageSchemaError,
)
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres import schema as _pg_schema
from aiocheckpoint.storage.postgres.sql import Sql
from tests.pg_support import DSN, pg_schema, terminate_backends

__all__ = ["pg_schema"]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def admin() -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection for inspecting and disturbing the server."""
    con = await asyncpg.connect(DSN)
    yield con
    await con.close()


def app_name() -> str:
    return f"aiocp-{uuid.uuid4().hex[:10]}"


def store(schema: str, **options: Any) -> PostgresCheckpointStorage:
    options.setdefault("max_size", 4)
    return PostgresCheckpointStorage(DSN, schema=schema, **options)


async def run_python(code: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        textwrap.dedent(code),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# --- optional dependency ----------------------------------------------------------------


async def test_missing_asyncpg_names_the_extra() -> None:
    """Without asyncpg the module imports; first use raises StorageBackendError naming the extra."""
    code, out, err = await run_python(
        """
        import asyncio, sys
        sys.modules["asyncpg"] = None  # makes `import asyncpg` raise ImportError
        from aiocheckpoint import StorageBackendError, open_storage
        from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
        storage = open_storage("postgresql://postgres@127.0.0.1:5432/test")
        assert isinstance(storage, PostgresCheckpointStorage)
        async def main():
            try:
                await storage.load("wf")
            except StorageBackendError as exc:
                print("ERROR:", exc, "| cause:", type(exc.__cause__).__name__)
        asyncio.run(main())
        """
    )
    assert code == 0, err
    assert "ERROR:" in out and "pip install 'aiocheckpoint[postgres]'" in out
    assert "cause: ModuleNotFoundError" in out


async def test_import_and_construction_do_not_import_asyncpg() -> None:
    """Importing the package and building a storage leaves asyncpg unimported."""
    code, out, err = await run_python(
        """
        import sys
        import aiocheckpoint
        from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
        PostgresCheckpointStorage("postgresql://postgres@127.0.0.1:1/none")
        print("asyncpg loaded:", "asyncpg" in sys.modules)
        """
    )
    assert code == 0, err
    assert "asyncpg loaded: False" in out


# --- construction and opening -----------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "a-b", 'x"; DROP SCHEMA public; --', "1abc", "pg_catalog", "a" * 64, "sch ema", "é"],
)
def test_bad_schema_names_are_refused(name: str) -> None:
    """Schema names that are not plain identifiers raise InvalidArgumentError at construction."""
    with pytest.raises(InvalidArgumentError):
        PostgresCheckpointStorage(DSN, schema=name)


def test_bad_arguments_are_refused() -> None:
    """A non-DSN, non-pool location and out-of-range sizes raise InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError):
        PostgresCheckpointStorage(42)
    with pytest.raises(InvalidArgumentError):
        PostgresCheckpointStorage(DSN, max_size=0)
    with pytest.raises(InvalidArgumentError):
        PostgresCheckpointStorage(DSN, max_record_bytes=-1)


async def test_open_is_lazy_and_creates_the_schema(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """Nothing is created until the first call; then the schema and its version exist."""
    storage = store(pg_schema)
    query = "SELECT count(*) FROM pg_namespace WHERE nspname = $1"
    assert await admin.fetchval(query, pg_schema) == 0
    try:
        assert not await storage.exists("wf")
        assert await admin.fetchval(query, pg_schema) == 1
        version = await admin.fetchval(
            f'SELECT value FROM "{pg_schema}".meta WHERE key = $1', "schema_version"
        )
        assert version == str(_pg_schema.SCHEMA_VERSION)
    finally:
        await storage.close()


async def test_mixed_case_schema_name_is_quoted(pg_schema: str, admin: asyncpg.Connection) -> None:
    """A mixed-case schema name is used exactly as given, not folded to lower case."""
    name = pg_schema.replace("aiocp_test", "AiocpMixed")
    try:
        async with store(name) as storage:
            await storage.save("wf", 1, b"x")
        assert await admin.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname=$1", name)
        assert await admin.fetchval(f'SELECT count(*) FROM "{name}".checkpoints') == 1
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


async def test_concurrent_first_calls_open_once(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty calls racing on a fresh storage create one pool and all succeed."""
    created = []
    real = asyncpg.create_pool

    def counting(*args: Any, **kwargs: Any) -> Any:
        created.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(asyncpg, "create_pool", counting)
    async with store(pg_schema) as storage:
        results = await asyncio.gather(*(storage.exists(f"wf{n}") for n in range(50)))
        assert results == [False] * 50
    assert len(created) == 1


async def test_server_down_is_a_backend_error() -> None:
    """An unreachable server raises StorageBackendError with the driver error chained."""
    storage = PostgresCheckpointStorage("postgresql://postgres@127.0.0.1:1/test")
    with pytest.raises(StorageBackendError) as info:
        await storage.save("wf", 0, b"x")
    assert isinstance(info.value.__cause__, (OSError, asyncpg.PostgresError))
    await storage.close()


async def test_pool_passed_in_is_used_and_not_closed(pg_schema: str) -> None:
    """A caller's pool serves the storage and stays open after the storage closes."""
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=2)
    try:
        async with PostgresCheckpointStorage(pool, schema=pg_schema) as storage:
            await storage.save("wf", 3, b"via pool")
        assert await pool.fetchval(
            f'SELECT data FROM "{pg_schema}".checkpoints WHERE workflow_id = $1', "wf"
        ) == (b"via pool")
    finally:
        await pool.close()


async def test_owned_pool_is_closed(pg_schema: str, admin: asyncpg.Connection) -> None:
    """close() closes the pool the storage created: its server connections go away."""
    app = app_name()
    storage = store(pg_schema, server_settings={"application_name": app})
    await storage.save("wf", 0, b"x")
    count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
    assert await admin.fetchval(count, app) >= 1
    await storage.close()
    for _ in range(200):  # backends exit asynchronously after the client's Terminate
        if await admin.fetchval(count, app) == 0:
            break
        await asyncio.sleep(0.025)
    assert await admin.fetchval(count, app) == 0


# --- schema versions and migrations -----------------------------------------------------


async def test_newer_schema_version_is_refused(pg_schema: str, admin: asyncpg.Connection) -> None:
    """A store stamped with a newer version raises StorageSchemaError and is left unchanged."""
    async with store(pg_schema) as storage:
        await storage.save("wf", 0, b"x")
    await admin.execute(
        f"UPDATE \"{pg_schema}\".meta SET value = '999' WHERE key = 'schema_version'"
    )
    storage = store(pg_schema)
    with pytest.raises(StorageSchemaError, match="999"):
        await storage.load("wf")
    await storage.close()
    assert await admin.fetchval(f'SELECT value FROM "{pg_schema}".meta') == "999"
    assert await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".checkpoints') == 1


async def test_foreign_tables_are_refused(pg_schema: str, admin: asyncpg.Connection) -> None:
    """A schema holding someone else's tables raises StorageSchemaError and is not touched."""
    await admin.execute(f'CREATE SCHEMA "{pg_schema}"')
    await admin.execute(f'CREATE TABLE "{pg_schema}".checkpoints (x int)')
    storage = store(pg_schema)
    with pytest.raises(StorageSchemaError):
        await storage.save("wf", 0, b"x")
    await storage.close()
    columns = await admin.fetchval(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema=$1", pg_schema
    )
    assert columns == 1


async def test_new_migration_runs_once_under_concurrent_openers(
    pg_schema: str, admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight storages opening an old store at once apply a new migration exactly once."""
    current = _pg_schema.SCHEMA_VERSION
    async with store(pg_schema) as storage:
        await storage.save("wf", 1, b"from v1")
    v2 = (
        "CREATE TABLE {s}.extra (n int)",  # fails if run twice: proves the lock serialises
        "INSERT INTO {s}.extra VALUES (1)",
    )
    monkeypatch.setattr(_pg_schema, "MIGRATIONS", (*_pg_schema.MIGRATIONS, v2))
    monkeypatch.setattr(_pg_schema, "SCHEMA_VERSION", len(_pg_schema.MIGRATIONS))
    storages = [store(pg_schema, max_size=1, min_size=0) for _ in range(8)]
    try:
        loaded = await asyncio.gather(*(s.load("wf") for s in storages))
    finally:
        for s in storages:
            await s.close()
    assert all(r is not None and r.data == b"from v1" for r in loaded)
    assert await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".extra') == 1
    assert await admin.fetchval(f'SELECT value FROM "{pg_schema}".meta') == str(current + 1)


# --- queries ----------------------------------------------------------------------------

INJECTION_IDS = [
    "'; DROP TABLE x; --",
    "'; DROP TABLE checkpoints; --",
    '" OR 1=1 --',
    "$1",
    "%s",
    "\\x00ff",
    "a'); DELETE FROM checkpoints WHERE ('1'='1",
    "*/ SELECT pg_sleep(10) /*",
]


async def test_sql_injection_like_ids_are_just_ids(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """Ids made of SQL syntax are stored, found and deleted as plain text; nothing else moves."""
    async with store(pg_schema) as storage:
        await storage.save("bystander", 0, b"safe")
        for n, wf in enumerate(INJECTION_IDS):
            await storage.save(wf, n, wf.encode(), keep_last=1)
        assert await storage.list_workflows() == sorted([*INJECTION_IDS, "bystander"])
        for n, wf in enumerate(INJECTION_IDS):
            got = await storage.load(wf)
            assert got is not None and (got.step, got.data) == (n, wf.encode())
            assert [r.step for r in await storage.scan(wf)] == [n]
            assert await storage.exists(wf, n)
        assert await storage.delete(INJECTION_IDS[0])
        assert await storage.load("bystander") is not None
    rows = await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".checkpoints')
    assert rows == len(INJECTION_IDS)


async def test_queries_use_the_primary_key_index(pg_schema: str, admin: asyncpg.Connection) -> None:
    """Latest, step, exists and paged scans plan as index scans on a 20,000-row table."""
    async with store(pg_schema) as storage:
        await storage.exists("warm-up")
    table = f'"{pg_schema}".checkpoints'
    await admin.execute(
        f"INSERT INTO {table} (workflow_id, step, data) "
        "SELECT 'wf' || (i % 1000), i, '\\x00'::bytea FROM generate_series(0, 19999) i"
    )
    await admin.execute(f"ANALYZE {table}")
    sql = Sql.for_schema(f'"{pg_schema}"')
    for query, args in [
        (sql.latest, ("wf7", 100)),
        (sql.at_step, ("wf7", 7, 100)),
        (sql.exists_any, ("wf7",)),
        (sql.exists_step, ("wf7", 7)),
        (sql.scan_asc, ("wf7", 100, 2**63 - 1, 10, 100)),
        (sql.scan_desc, ("wf7", -1, 4000, 10, 100)),
    ]:
        plan = "\n".join(r[0] for r in await admin.fetch(f"EXPLAIN {query}", *args))
        assert "Index" in plan and "Seq Scan" not in plan, plan


async def test_oversized_records_are_refused(pg_schema: str) -> None:
    """Saving over max_record_bytes is refused; reading a stored oversized row is corruption."""
    async with store(pg_schema, max_record_bytes=1000) as small:
        with pytest.raises(InvalidArgumentError):
            await small.save("wf", 0, b"x" * 1001)
        assert not await small.exists("wf")
        await small.save("wf", 0, b"x" * 1000)
    async with store(pg_schema) as big:
        await big.save("wf", 1, b"y" * 5000)
    async with store(pg_schema, max_record_bytes=1000) as small:
        for read in (small.load("wf"), small.load("wf", 1), small.scan("wf")):
            with pytest.raises(CheckpointCorruptedError, match="5000 bytes"):
                await read
        got = await small.load("wf", 0)
        assert got is not None and len(got.data) == 1000
        assert await small.exists("wf", 1)


# --- batching ---------------------------------------------------------------------------


async def test_500_concurrent_saves_share_transactions(pg_schema: str) -> None:
    """500 concurrent saves all land, in fewer transactions than rows."""
    async with store(pg_schema) as storage:
        await asyncio.gather(
            *(storage.save(f"wf-{n % 50}", n, f"row {n}".encode()) for n in range(500))
        )
        assert storage.stats.rows == 500
        assert storage.stats.batches < 500
        for w in range(50):
            rows = await storage.scan(f"wf-{w}")
            assert [(r.step, r.data) for r in rows] == [
                (n, f"row {n}".encode()) for n in range(w, 500, 50)
            ]


async def test_concurrent_retention_is_exact(pg_schema: str) -> None:
    """500 concurrent saves with keep_last=3 leave exactly the 3 highest steps per workflow."""
    async with store(pg_schema, write_concurrency=4) as storage:
        tasks = [storage.save(f"wf-{n % 50}", n // 50, b"r", keep_last=3) for n in range(500)]
        await asyncio.gather(*tasks)
        for w in range(50):
            assert [r.step for r in await storage.scan(f"wf-{w}")] == [7, 8, 9]


async def test_batch_error_fails_only_the_guilty_caller(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A row the server rejects fails its own save only; the rest of its batch commits."""
    async with store(pg_schema, write_concurrency=1) as storage:
        await storage.exists("open")
        await admin.execute(
            f'ALTER TABLE "{pg_schema}".checkpoints '
            "ADD CONSTRAINT no_poison CHECK (data <> 'poison'::bytea)"
        )
        datas = [b"poison" if n == 17 else f"ok {n}".encode() for n in range(40)]
        results = await asyncio.gather(
            *(storage.save(f"wf-{n}", n, d) for n, d in enumerate(datas)), return_exceptions=True
        )
        assert isinstance(results[17], StorageBackendError)
        assert isinstance(results[17].__cause__, asyncpg.CheckViolationError)
        assert [r for n, r in enumerate(results) if n != 17] == [None] * 39
        assert storage.stats.split_batches == 1  # they were sent together, then split
        assert sorted(await storage.list_workflows()) == sorted(
            f"wf-{n}" for n in range(40) if n != 17
        )


async def test_effect_records_share_the_checkpoints_transactions(pg_schema: str) -> None:
    """Effect records and checkpoints queued together commit in one batch (one transaction);
    a stale lease's effect record in it is refused alone."""
    async with store(pg_schema, write_concurrency=1) as storage:
        await storage.exists("open")
        old = await storage.acquire_lease("fenced", "a", 0.05)
        await asyncio.sleep(0.1)
        new = await storage.acquire_lease("fenced", "b", 30)
        before = storage.stats.batches
        results = await asyncio.gather(
            *(storage.save(f"wf-{n}", 1, b"ckpt") for n in range(20)),
            *(storage.put_effect(f"wf-{n}", 1, "k", b"fx", in_doubt=True) for n in range(20)),
            storage.put_effect("fenced", 0, "k", b"stale", in_doubt=True, fence=old),
            storage.put_effect("fenced", 0, "j", b"fresh", in_doubt=True, fence=new),
            return_exceptions=True,
        )
        assert storage.stats.batches == before + 1
        assert isinstance(results[40], LeaseLostError) and "effect record" in str(results[40])
        assert [r for n, r in enumerate(results) if n != 40] == [None] * 41
        for n in range(20):
            assert [e.data for e in await storage.load_effects(f"wf-{n}", 1)] == [b"fx"]
        assert [e.key for e in await storage.load_effects("fenced", 0)] == ["j"]


async def test_a_bad_effect_record_fails_only_its_caller(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """An effect record the server rejects fails its own put; its batch's checkpoints land."""
    async with store(pg_schema, write_concurrency=1) as storage:
        await storage.exists("open")
        await admin.execute(
            f'ALTER TABLE "{pg_schema}".effects '
            "ADD CONSTRAINT no_poison CHECK (data <> 'poison'::bytea)"
        )
        results = await asyncio.gather(
            *(storage.save(f"wf-{n}", 0, b"ok") for n in range(10)),
            storage.put_effect("wf-3", 0, "k", b"poison", in_doubt=True),
            storage.put_effect("wf-4", 0, "k", b"fine", in_doubt=True),
            return_exceptions=True,
        )
        assert isinstance(results[10], StorageBackendError)
        assert isinstance(results[10].__cause__, asyncpg.CheckViolationError)
        assert [r for n, r in enumerate(results) if n != 10] == [None] * 11
        assert len(await storage.list_workflows()) == 10
        assert await storage.in_doubt_workflows() == ["wf-4"]


async def test_cancelled_while_queued_is_dropped_in_flight_completes(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A save cancelled in the queue never lands; one cancelled in flight lands whole."""
    app = app_name()
    storage = store(pg_schema, write_concurrency=1, server_settings={"application_name": app})
    await storage.exists("open")
    blocker = await asyncpg.connect(DSN)
    try:
        tx = blocker.transaction()
        await tx.start()  # an uncommitted row with the same key makes our insert wait
        await blocker.execute(
            f'INSERT INTO "{pg_schema}".checkpoints (workflow_id, step, data) '
            "VALUES ('wf', 0, 'theirs')"
        )
        in_flight = asyncio.create_task(storage.save("wf", 0, b"mine"))
        waiting = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = $1 AND wait_event_type = 'Lock'"
        )
        for _ in range(1000):  # until our insert is waiting on the blocker's row lock
            if await admin.fetchval(waiting, app):
                break
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(storage.save("other", 1, b"queued"))
        await asyncio.sleep(0)
        queued.cancel()
        in_flight.cancel()
        await tx.commit()
        for task in (queued, in_flight):
            with pytest.raises(asyncio.CancelledError):
                await task
        await storage.close()  # waits for the in-flight batch
    finally:
        await blocker.close()
    async with store(pg_schema) as again:
        got = await again.load("wf", 0)
        assert got is not None and got.data == b"mine"
        assert not await again.exists("other")


async def test_close_waits_for_queued_writes(pg_schema: str) -> None:
    """close() returns only after every queued save has committed."""
    storage = store(pg_schema)
    await storage.exists("open")
    tasks = [asyncio.create_task(storage.save("wf", n, b"v")) for n in range(300)]
    await asyncio.sleep(0)
    await storage.close()
    assert all(t.done() and t.exception() is None for t in tasks)
    async with store(pg_schema) as again:
        assert len(await again.scan("wf")) == 300


# --- connection loss and other processes ------------------------------------------------


async def test_terminated_backends_lose_no_acknowledged_write(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """With backends killed mid-run, every acknowledged save is stored; failures are typed."""
    app = app_name()
    storage = store(pg_schema, max_size=6, server_settings={"application_name": app})
    acked: list[tuple[str, int, bytes]] = []
    failures: list[BaseException] = []
    kills = 0

    async def writer(w: int) -> None:
        for step in range(40):
            data = f"{w}:{step}".encode() * 20
            try:
                await storage.save(f"wf-{w}", step, data)
                acked.append((f"wf-{w}", step, data))
                await storage.load(f"wf-{w}")
            except StorageBackendError as exc:
                failures.append(exc)

    async def killer() -> None:
        nonlocal kills
        for _ in range(15):
            await asyncio.sleep(0.02)
            kills += await terminate_backends(admin, app)

    try:
        await storage.exists("open")
        await asyncio.gather(killer(), *(writer(w) for w in range(20)))
    finally:
        await storage.close()
    assert kills > 0 and acked
    assert all(isinstance(f, StorageBackendError) for f in failures)
    async with store(pg_schema) as again:
        for wf, step, data in acked:
            got = await again.load(wf, step)
            assert got is not None and got.data == data, (wf, step)


WRITER_SCRIPT = """
import asyncio, sys
from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage

async def main(dsn, schema, who):
    storage = PostgresCheckpointStorage(dsn, schema=schema, max_size=3)
    async with CheckpointManager(storage) as manager:
        await asyncio.gather(*(
            manager.create_checkpoint(wf, step, who, "completed", {"who": who, "step": step})
            for wf, step in [(f"{who}-{n % 10}", n) for n in range(150)]
            + [("shared", int(who[1:]) * 1000 + n) for n in range(50)]
        ))
    print("done", who)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_two_processes_write_at_once(pg_schema: str) -> None:
    """Two processes writing (one workflow shared) at once: every checkpoint of both lands."""
    results = await asyncio.gather(
        run_python(WRITER_SCRIPT, DSN, pg_schema, "p1"),
        run_python(WRITER_SCRIPT, DSN, pg_schema, "p2"),
    )
    for code, out, err in results:
        assert code == 0, err
        assert out.startswith("done")
    async with CheckpointManager(store(pg_schema)) as manager:
        for who in ("p1", "p2"):
            for w in range(10):
                steps = [c.step for c in await manager.list_checkpoints(f"{who}-{w}")]
                assert steps == list(range(w, 150, 10))
        shared = await manager.list_checkpoints("shared")
        assert [c.step for c in shared] == [*range(1000, 1050), *range(2000, 2050)]
        assert {c.agent_id for c in shared} == {"p1", "p2"}


async def test_back_to_back_saves_never_strand_a_write(pg_schema: str) -> None:
    """A save queued just as the last writer finishes still gets written (no lost wake-up)."""
    async with store(pg_schema, write_concurrency=1) as storage:
        await storage.exists("open")

        async def steps(w: int) -> None:
            for step in range(100):
                await storage.save(f"wf{w}", step, b"v")

        await asyncio.wait_for(asyncio.gather(*(steps(w) for w in range(2))), timeout=30)
        assert [len(await storage.scan(f"wf{w}")) for w in range(2)] == [100, 100]


async def test_owned_pool_commits_synchronously(pg_schema: str) -> None:
    """The storage's own connections force synchronous_commit=on, keeping caller settings."""
    app = app_name()
    async with store(pg_schema, server_settings={"application_name": app}) as storage:
        await storage.save("wf", 0, b"x")
        pool = await storage._connection.pool()
        assert await pool.fetchval("SHOW synchronous_commit") == "on"
        assert await pool.fetchval("SHOW application_name") == app


async def test_up_to_date_store_opens_without_ddl_rights(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A role that may only read and write the tables (no CREATE anywhere) opens a current store."""
    async with store(pg_schema) as storage:
        await storage.save("wf", 0, b"made by the owner")
    role = f"aiocp_rw_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        await admin.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO "{role}"')
        await admin.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{pg_schema}" '
            f'TO "{role}"'
        )
        dsn = DSN.replace("postgresql://postgres@", f"postgresql://{role}@")
        async with PostgresCheckpointStorage(dsn, schema=pg_schema, max_size=2) as limited:
            await limited.save("wf", 1, b"made by the limited role")
            assert [r.data for r in await limited.scan("wf")] == [
                b"made by the owner",
                b"made by the limited role",
            ]
    finally:
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
