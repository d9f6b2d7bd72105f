"""PostgreSQL: deletes racing saves of the same workflow (issue #22, item 14), real server.

Every transaction takes its locks in one order: the store's blob lock, then workflow records,
then checkpoint rows in key order, then blob rows in hash order. One that finds out only
after locking rows that it needs the blob lock tries it, and runs again taking it first when
it is taken. Before, ``delete_checkpoints(wf)`` racing incremental saves of ``wf`` failed
within ~2 s with ``StorageBackendError: deadlock detected``. Each race runs in a database of
its own, so the server's deadlock counter for it counts only this test's transactions.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from aiocheckpoint import CheckpointManager
from aiocheckpoint.format.tree import TreeParams
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from tests.pg_support import DSN
from tests.test_postgres_blobs import check_counts

# Each race runs for RACE_SECONDS, then a database is dropped: the slow tier.
pytestmark = pytest.mark.slow

#: How long each race runs: the deadlock showed within ~2 s before the fix.
RACE_SECONDS = 10.0
#: Small nodes: a few KB of state make trees several levels deep that share sub-trees.
SMALL = TreeParams(inline_limit=128, root_inline_limit=512, chunk_min=64, chunk_avg=256)


@pytest.fixture
async def race_dsn() -> AsyncIterator[str]:
    """The DSN of a fresh database, dropped after the test."""
    name = f"aiocp_race_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield urlunsplit(urlsplit(DSN)._replace(path=f"/{name}"))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def deadlocks_in(dsn: str) -> int:
    """The deadlocks the server detected in ``dsn``'s database, once its sessions have ended."""
    database = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(DSN)
    try:
        # A session reports its statistics when it ends: wait for the stores' to end.
        for _ in range(200):
            active = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
            if not await admin.fetchval(active, database):
                break
            await asyncio.sleep(0.05)
        await admin.execute("SELECT pg_stat_clear_snapshot()")
        count = "SELECT deadlocks FROM pg_stat_database WHERE datname = $1"
        return int(await admin.fetchval(count, database))
    finally:
        await admin.close()


def store(dsn: str) -> PostgresCheckpointStorage:
    return PostgresCheckpointStorage(dsn, max_size=4, blob_params=SMALL)


def large_state(rng: random.Random, docs: dict[str, str], n: int) -> dict[str, Any]:
    """A state well over the inline limit, one document edited per save."""
    key = rng.choice(sorted(docs))
    docs[key] += f" edit {n}"
    return {"docs": dict(docs), "n": n}


def documents(rng: random.Random) -> dict[str, str]:
    return {f"d{i}": "lorem ipsum dolor " * rng.randint(20, 60) for i in range(16)}


async def until(deadline: float, action: Callable[[int], Awaitable[None]]) -> None:
    """Run ``action(0)``, ``action(1)``, ... until the loop's clock passes ``deadline``."""
    loop = asyncio.get_running_loop()
    n = 0
    while loop.time() < deadline:
        await action(n)
        n += 1


def deleter(
    manager: CheckpointManager, rng: random.Random, done: Counter[str]
) -> Callable[[int], Awaitable[None]]:
    async def delete(_: int) -> None:
        await asyncio.sleep(rng.uniform(0, 0.02))
        await manager.delete_checkpoints("wf")
        done["deletes"] += 1

    return delete


async def check_every_checkpoint_loads(manager: CheckpointManager) -> int:
    """Load every stored checkpoint of ``wf``; return how many there are."""
    steps = [c.step for c in await manager.storage.scan("wf")]
    for step in steps:
        checkpoint = await manager.get_checkpoint("wf", step)
        assert checkpoint.step == step
    return len(steps)


async def check_counts_and_deadlocks(dsn: str) -> None:
    """Once the stores are closed: every blob count is exact and the server saw no deadlock."""
    admin = await asyncpg.connect(dsn)
    try:
        await check_counts(admin, "aiocheckpoint")
    finally:
        await admin.close()
    assert await deadlocks_in(dsn) == 0


async def test_deleting_a_workflow_while_incremental_saves_of_it_run_never_deadlocks(
    race_dsn: str,
) -> None:
    """Deletes of a workflow race incremental saves of it from two stores (as two processes),
    one with retention, for 10 s: no call fails, no deadlock reaches the server, every
    remaining checkpoint loads and every blob count is exact."""
    rng = random.Random(14)
    docs = documents(rng)
    done: Counter[str] = Counter()

    def saver(manager: CheckpointManager, parity: int) -> Callable[[int], Awaitable[None]]:
        async def save(n: int) -> None:
            step = 2 * n + parity
            state = large_state(rng, docs, step)
            await manager.create_checkpoint("wf", step, "agent", "completed", state)
            done["saves"] += 1

        return save

    async with store(race_dsn) as first, store(race_dsn) as second:
        plain = CheckpointManager(first)
        keeping = CheckpointManager(second, max_checkpoints=3)
        deadline = asyncio.get_running_loop().time() + RACE_SECONDS
        await asyncio.gather(
            until(deadline, saver(plain, 0)),
            until(deadline, saver(keeping, 1)),
            until(deadline, deleter(plain, rng, done)),
            until(deadline, deleter(keeping, rng, done)),
        )
        assert done["saves"] > 0 and done["deletes"] > 0, done
        await check_every_checkpoint_loads(plain)
    await check_counts_and_deadlocks(race_dsn)


async def test_small_saves_replacing_large_ones_race_deletes_without_a_deadlock(
    race_dsn: str,
) -> None:
    """Large and small states saved over the same steps from two stores with retention (a
    small one replacing or pruning a large one releases blobs after locking rows), and
    deletes of the workflow, for 10 s: no call fails and no deadlock reaches the server."""
    rng = random.Random(22)
    docs = documents(rng)
    done: Counter[str] = Counter()

    def saver(manager: CheckpointManager, large: bool) -> Callable[[int], Awaitable[None]]:
        async def save(n: int) -> None:
            state = large_state(rng, docs, n) if large else {"n": n}
            await manager.create_checkpoint("wf", n // 2, "agent", "completed", state)
            done["saves"] += 1

        return save

    async with store(race_dsn) as first, store(race_dsn) as second:
        large = CheckpointManager(first, max_checkpoints=3)
        small = CheckpointManager(second, max_checkpoints=3)
        deadline = asyncio.get_running_loop().time() + RACE_SECONDS
        await asyncio.gather(
            until(deadline, saver(large, True)),
            until(deadline, saver(small, False)),
            until(deadline, deleter(CheckpointManager(second), rng, done)),
        )
        assert done["saves"] > 0 and done["deletes"] > 0, done
        await check_every_checkpoint_loads(large)
    await check_counts_and_deadlocks(race_dsn)
