"""The PostgreSQL store within the server's limits: a role's connection limit, timeouts.

A real server and a real role with ``CONNECTION LIMIT 3``: the pool (``max_size`` 10) must
live within it (operations wait for a pooled connection instead of failing), and a store
the server gives no connection at all fails with a typed error after a bounded wait. A
``command_timeout`` is the whole time a call waits, retries included, and its error says
what timed out and after how long. Statements are made slow by a real lock held by another
connection; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import pytest

from aiocheckpoint import StorageBackendError, StorageTimeoutError
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage, batching
from tests.pg_support import DSN, drop_schema, pg_schema

__all__ = ["pg_schema"]


@pytest.fixture
async def limited_role() -> AsyncIterator[str]:
    """A login role allowed 3 connections (and to create schemas in the test database)."""
    name = f"aiocp_lim_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(DSN)
    try:
        async with admin.transaction():
            await admin.execute(_GRANTS_ONE_AT_A_TIME)
            await admin.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT 3')
            await admin.execute(f'GRANT CREATE ON DATABASE test TO "{name}"')
        yield name
    finally:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name
        )
        async with admin.transaction():
            await admin.execute(_GRANTS_ONE_AT_A_TIME)
            await admin.execute(f'DROP OWNED BY "{name}" CASCADE')
            await admin.execute(f'DROP ROLE "{name}"')
        await admin.close()


#: A grant on the database (or its revoke) rewrites the database's one catalog row: two
#: test processes doing it at once fail with "tuple concurrently updated".
_GRANTS_ONE_AT_A_TIME = "SELECT pg_advisory_xact_lock(4242001)"


def role_dsn(role: str) -> str:
    """The test server's DSN, connecting as ``role``."""
    return DSN.replace("postgres@", f"{role}@", 1)


def limited(role: str, schema: str, **options: Any) -> PostgresCheckpointStorage:
    """A store of pool ``max_size`` 10 connecting as ``role``."""
    return PostgresCheckpointStorage(role_dsn(role), schema=schema, max_size=10, **options)


async def save_and_load(storage: PostgresCheckpointStorage, tasks: int) -> list[BaseException]:
    """``tasks`` concurrent tasks, each 5 saves and 5 loads: the errors they got."""
    failures: list[BaseException] = []

    async def worker(n: int) -> None:
        for i in range(5):
            try:
                await storage.save(f"wf-{n}", i, b"x" * 100)
                loaded = await storage.load(f"wf-{n}")
                assert loaded is not None and loaded.step == i
            except StorageBackendError as exc:
                failures.append(exc)

    await asyncio.gather(*(worker(n) for n in range(tasks)))
    return failures


async def test_600_operations_within_a_role_limit_of_3_all_succeed(
    limited_role: str, pg_schema: str
) -> None:
    """60 tasks x 10 operations through a pool of 10 on a role allowed 3: no failures."""
    storage = limited(limited_role, pg_schema)
    try:
        assert await save_and_load(storage, 60) == []
        assert len(await storage.list_workflows()) == 60
    finally:
        await storage.close()


async def test_a_given_pool_lives_within_the_role_limit(limited_role: str, pg_schema: str) -> None:
    """A store on the caller's asyncpg pool (max_size 10) on a role allowed 3: no failures."""
    pool = await asyncpg.create_pool(role_dsn(limited_role), min_size=1, max_size=10)
    storage = PostgresCheckpointStorage(pool, schema=pg_schema)
    try:
        assert await save_and_load(storage, 30) == []
        assert len(await storage.list_workflows()) == 30
    finally:
        await storage.close()
        await pool.close()


async def test_no_connection_for_the_role_is_a_typed_error_after_the_bounded_wait(
    limited_role: str, pg_schema: str
) -> None:
    """The role's 3 connections held elsewhere: StorageTimeoutError naming the refusal."""
    held = [await asyncpg.connect(role_dsn(limited_role)) for _ in range(3)]
    storage = limited(limited_role, pg_schema, command_timeout=1.5)
    try:
        with pytest.raises(StorageTimeoutError) as caught:
            await storage.load("wf")
        text = str(caught.value)
        assert "too many connections" in text
        assert "1.5 s" in text
        assert isinstance(caught.value.__cause__, asyncpg.TooManyConnectionsError)
    finally:
        await storage.close()
        for con in held:
            await con.close()


async def test_no_free_connection_once_open_is_a_typed_error_after_the_bounded_wait(
    limited_role: str, pg_schema: str
) -> None:
    """Open with one connection, the role's other 2 taken, that one locked: a typed wait error."""
    storage = limited(limited_role, pg_schema, command_timeout=1.5, min_size=1)
    await storage.save("wf", 0, b"x")
    held = [await asyncpg.connect(role_dsn(limited_role)) for _ in range(2)]
    admin = await asyncpg.connect(DSN)
    try:
        async with admin.transaction():
            await admin.execute(f'LOCK TABLE "{pg_schema}".checkpoints IN ACCESS EXCLUSIVE MODE')
            results = await asyncio.gather(
                *(storage.load("wf") for _ in range(3)), return_exceptions=True
            )
        assert all(isinstance(r, StorageTimeoutError) for r in results), results
        texts = " | ".join(map(str, results))
        assert "no pooled connection came free" in texts
        assert "too many connections" in texts
    finally:
        await admin.close()
        await storage.close()
        for con in held:
            await con.close()


async def _seeded(schema: str) -> None:
    """``schema`` made, and its workflow ``wf`` saved at step 0, by a store without a short
    ``command_timeout``: on a loaded machine making the schema alone can take longer than
    the bound the test is about."""
    async with PostgresCheckpointStorage(DSN, schema=schema) as storage:
        await storage.save("wf", 0, b"x")


async def test_command_timeout_bounds_the_whole_call_and_names_it(pg_schema: str) -> None:
    """A load blocked by a lock: one try within command_timeout, the error says what and when."""
    await _seeded(pg_schema)
    storage = PostgresCheckpointStorage(DSN, schema=pg_schema, command_timeout=1, retries=2)
    admin = await asyncpg.connect(DSN)
    try:
        assert await storage.load("wf") is not None  # the store open before the lock
        async with admin.transaction():
            await admin.execute(f'LOCK TABLE "{pg_schema}".checkpoints IN ACCESS EXCLUSIVE MODE')
            with pytest.raises(StorageTimeoutError) as loading:
                await storage.load("wf")
            with pytest.raises(StorageTimeoutError) as saving:
                await storage.save("wf", 1, b"y")
        for caught, what in ((loading, "load"), (saving, "save")):
            text = str(caught.value)
            assert text.startswith(f"PostgreSQL {what}"), text
            assert "timed out after" in text and "(command_timeout 1 s, 1 attempt)" in text
        assert (await storage.load("wf")).step == 0
    finally:
        await admin.close()
        await storage.close()
        await drop_schema(pg_schema)


async def test_without_command_timeout_a_pool_held_elsewhere_is_a_typed_error(
    pg_schema: str,
) -> None:
    """No command_timeout, and the given pool's only connection held by the application
    (outside the store's own count): a load gets StorageTimeoutError after the connect
    ``timeout`` instead of waiting for ever, and works again once the connection is back."""
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=1)
    storage = PostgresCheckpointStorage(pool, schema=pg_schema, timeout=1)
    try:
        await storage.save("wf", 0, b"x")
        async with pool.acquire():
            with anyio.fail_after(60):  # a guard: unbounded, the wait would never end
                with pytest.raises(StorageTimeoutError) as caught:
                    await storage.load("wf")
        assert "no pooled connection was free" in str(caught.value)
        assert (await storage.load("wf")).step == 0
    finally:
        await storage.close()
        await pool.close()
        await drop_schema(pg_schema)


def late(op: Callable[[Any], Awaitable[Any]], seconds: float) -> Callable[[Any], Awaitable[Any]]:
    """``op``, whose outcome reaches the caller ``seconds`` later (a busy event loop)."""

    async def slow(con: Any) -> Any:
        try:
            return await op(con)
        finally:
            # Blocks the loop on purpose: no timer fires before the outcome is seen.
            time.sleep(seconds)  # noqa: ASYNC251

    return slow


async def test_a_real_error_at_the_deadline_is_reported_as_it_is(pg_schema: str) -> None:
    """A statement's real error (here a unique violation) that reaches the store only after
    command_timeout has passed is that error, a StorageBackendError caused by it, not a
    StorageTimeoutError: the caller must learn what failed."""
    await _seeded(pg_schema)
    storage = PostgresCheckpointStorage(DSN, schema=pg_schema, command_timeout=0.5, retries=2)
    try:
        table = f'"{pg_schema}".checkpoints'

        async def duplicate(con: Any) -> None:
            await con.execute(f"INSERT INTO {table} SELECT * FROM {table}")

        with pytest.raises(StorageBackendError) as caught:
            await storage._connection.run("probe", late(duplicate, 0.6))
        assert not isinstance(caught.value, StorageTimeoutError), caught.value
        assert isinstance(caught.value.__cause__, asyncpg.UniqueViolationError)
    finally:
        await storage.close()
        await drop_schema(pg_schema)


async def test_a_real_error_of_a_batch_write_at_the_deadline_is_reported_as_it_is(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a batched save: the server's error (a division by zero run in the
    batch's transaction) reaches its caller after command_timeout, and is that error."""
    await _seeded(pg_schema)
    storage = PostgresCheckpointStorage(DSN, schema=pg_schema, command_timeout=0.5)
    run = batching._BatchTransaction.run

    async def failing(self: Any, con: Any) -> Any:
        await run(self, con)
        await con.execute("SELECT 1 / 0")

    try:
        assert await storage.load("wf") is not None  # the store open before the slow writes

        def slowly(self: Any, con: Any) -> Awaitable[Any]:
            return late(lambda c: failing(self, c), 0.6)(con)

        monkeypatch.setattr(batching._BatchTransaction, "run", slowly)
        with pytest.raises(StorageBackendError) as caught:
            await storage.save("wf", 1, b"y")
        assert not isinstance(caught.value, StorageTimeoutError), caught.value
        assert isinstance(caught.value.__cause__, asyncpg.DivisionByZeroError), caught.value
    finally:
        monkeypatch.undo()
        await storage.close()
        await drop_schema(pg_schema)


async def test_opening_on_a_pool_held_elsewhere_is_a_typed_error(pg_schema: str) -> None:
    """A given pool whose only connection the application holds: the store's first call
    (which opens it and migrates the schema) gets StorageTimeoutError after the connect
    ``timeout``, not an endless wait; the next call opens it once the connection is back."""
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=1)
    storage = PostgresCheckpointStorage(pool, schema=pg_schema, timeout=1)
    try:
        async with pool.acquire():
            with anyio.fail_after(60):  # a guard: unbounded, the wait would never end
                with pytest.raises(StorageTimeoutError) as caught:
                    await storage.save("wf", 0, b"x")
        assert "cannot open PostgreSQL store" in str(caught.value)
        await storage.save("wf", 0, b"x")
        assert (await storage.load("wf")).step == 0
    finally:
        await storage.close()
        await pool.close()
        await drop_schema(pg_schema)
