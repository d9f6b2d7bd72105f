"""A writer SIGKILLed at random points, holding the session's lease or not: every batch it
was told was stored is there, whole and in order, no half batch is, and a new writer (in
the parent) appends after it once the dead writer's lease has expired."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from aiocheckpoint import CheckpointManager
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN

CHILD = Path(__file__).with_name("_crash_child.py")
ROOT = Path(__file__).resolve().parents[2]
KILLS = 5


def run_and_kill(backend: str, where: str, rng: random.Random) -> int:
    """Start a writer, SIGKILL it after a random number of confirmed batches; the last one."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), backend, where, DSN],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    target, confirmed = rng.randint(1, 15), -1
    while confirmed < target:
        line = child.stdout.readline()
        assert line, "the writer died on its own"
        confirmed = int(line)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    return confirmed


def check(contents: list[str], confirmed: list[int]) -> None:
    """Whole batches (a then b); each killed writer's numbered 0, 1, ... with none missing
    and at least the confirmed ones, then the parent's batch ``p``."""
    assert len(contents) % 2 == 0
    pairs = [(contents[i], contents[i + 1]) for i in range(0, len(contents), 2)]
    for first, second in pairs:
        assert first.split(":")[0] == second.split(":")[0]
        assert (first.split(":")[1], second.split(":")[1]) == ("a", "b")
    numbers = [first.split(":")[0] for first, _ in pairs]
    runs: list[list[int]] = [[]]
    for number in numbers:
        if number == "p":
            runs.append([])
        else:
            runs[-1].append(int(number))
    assert runs.pop() == []  # the parent's batch is the last
    assert len(runs) == len(confirmed)
    for run, last in zip(runs, confirmed, strict=True):
        assert run == list(range(len(run)))
        assert len(run) >= last + 1


async def crash_loop(backend: str, where: str, manager: CheckpointManager) -> None:
    rng = random.Random(7)
    confirmed: list[int] = []
    for _ in range(KILLS):
        confirmed.append(await anyio.to_thread.run_sync(run_and_kill, backend, where, rng))
        session = AioCheckpointSession("s", manager, lock_wait=30.0)
        batch = [{"role": "user", "content": "p:a"}, {"role": "user", "content": "p:b"}]
        await session.add_items(batch)  # type: ignore[arg-type]
        items = await session.get_items()
        check([item["content"] for item in items], confirmed)  # type: ignore[typeddict-item]


@pytest.mark.slow
async def test_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with SQLiteCheckpointStorage(db) as storage, CheckpointManager(storage) as manager:
        await crash_loop("sqlite", str(db), manager)


@pytest.mark.slow
async def test_postgres(pg_schema: str) -> None:
    storage = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=1)
    async with storage, CheckpointManager(storage) as manager:
        await crash_loop("postgres", pg_schema, manager)
