"""A workflow run SIGKILLed after a random number of checkpoints: a new process finds every
checkpoint the dead one was told was saved, the latest of them or a later one is the store's
latest, and resuming from it gives the output of an uninterrupted run."""

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
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from tests.backend_support import make_storage
from tests.pg_support import DSN

from .workflows import COUNTER, build_counter

CHILD = Path(__file__).with_name("_run_child.py")
ROOT = Path(__file__).resolve().parents[2]
KILLS = 4
EXPECTED = ["total=10 seen=(1, 2, 3, 4)"]


def run_and_kill(backend: str, where: str, prefix: str, after: int) -> list[str]:
    """Run the workflow in a child, SIGKILL it once ``after`` checkpoints are saved."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), backend, where, DSN, prefix],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    saved: list[str] = []
    while len(saved) < after:
        line = child.stdout.readline()
        assert line, "the run ended on its own"
        saved.append(line.strip())
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    return saved


def where_of(backend: str, tmp_path: Path, pg_schema: str) -> str:
    return {
        "sqlite": str(tmp_path / "store.db"),
        "file": str(tmp_path / "store"),
        "postgres": pg_schema,
    }[backend]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "sqlite", "postgres"])
async def test_a_killed_run_resumes_from_its_latest_checkpoint(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    rng = random.Random(11)
    where = where_of(backend, tmp_path, pg_schema)
    for kill in range(KILLS):
        prefix = f"agent-framework/{kill}/"
        after = rng.randint(1, 7)  # the run saves 9 checkpoints; the last has nothing to run
        saved = await anyio.to_thread.run_sync(run_and_kill, backend, where, prefix, after)
        async with make_storage(backend, tmp_path, pg_schema) as storage:
            ours = AioCheckpointStorage(CheckpointManager(storage), prefix=prefix)
            ids = await ours.list_checkpoint_ids(workflow_name=COUNTER)
            assert ids[: len(saved)] == saved
            latest = await ours.get_latest(workflow_name=COUNTER)
            assert latest is not None
            assert latest.checkpoint_id == ids[-1]
            result = await build_counter(ours).run(checkpoint_id=latest.checkpoint_id)
            assert list(result.get_outputs()) == EXPECTED
