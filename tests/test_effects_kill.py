"""SIGKILL at random points of steps that make 3-5 effects, hundreds of times per backend.

The parent (this module, everything imported) forks a child per run; the child resumes the
workflows and SIGKILLs itself at a random point (tests/_effect_kill.py lists them: each
effect record's write, before and after; inside each call; before each checkpoint; and, in
half the children, a timer's random moment, inside a storage write too). After
``KILLS`` killed children and a final clean pass, every workflow is finished and:

* no effect ran twice unless it is idempotent (the fsynced call log counts the calls: an
  effect whose result was recorded is never called again, and one that ran without a
  recorded result was reported in doubt and settled, never silently re-run);
* an idempotent effect's calls all carry the same idempotency key;
* every recorded result is the one the call returned.

``AIOCHECKPOINT_EFFECT_KILLS`` sets the number of kills per backend (default 200).
"""

from __future__ import annotations

import asyncio
import os
import signal
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, CheckpointStorage, EffectState
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests import _effect_kill as kill
from tests.pg_support import DSN, drop_schema, new_schema_name

KILLS = int(os.environ.get("AIOCHECKPOINT_EFFECT_KILLS", "200"))
#: The chance of dying at each kill point: a child gets through a step or two.
P_KILL = 0.04
#: The timer kill falls in a child's first this many seconds (it runs ~0.1-0.3 s).
TIMER_S = 0.3

Open = Callable[[], CheckpointStorage]


@pytest.fixture(params=["file", "sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """Opens a new storage object on one durable store (in the child that calls it)."""
    schema = new_schema_name()
    opener: Open
    if request.param == "file":
        opener = lambda: FileCheckpointStorage(tmp_path / "store")  # noqa: E731
    elif request.param == "sqlite":
        opener = lambda: SQLiteCheckpointStorage(tmp_path / "fx.db")  # noqa: E731
    else:
        opener = lambda: PostgresCheckpointStorage(DSN, schema=schema, max_size=2)  # noqa: E731
    yield opener
    if request.param == "postgres":
        asyncio.run(drop_schema(schema))


def fork(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child (exit 0, or 1 with a traceback); return its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            work()
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def run_child(open_store: Open, log: Path, seed: int, p: float) -> int:
    """Fork a child that runs the workflows; return its wait status."""
    pid = fork(lambda: kill.child(open_store, log, seed, p, TIMER_S))
    return os.waitpid(pid, 0)[1]


@pytest.mark.slow
def test_sigkill_at_random_points(open_store: Open, tmp_path: Path) -> None:
    """Killed hundreds of times, no effect runs twice and every workflow finishes."""
    log = tmp_path / "calls.log"
    killed = 0
    for seed in range(KILLS):
        status = run_child(open_store, log, seed, P_KILL)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        killed += 1
    assert run_child(open_store, log, -1, 0.0) == 0  # the final pass finishes them all
    workflows = asyncio.run(check(open_store, kill.CallLog(log).lines()))
    assert killed == KILLS and workflows >= 2


async def check(open_store: Open, calls: list[list[str]]) -> int:
    """Verify the logged calls against the journals; return how many workflows ran."""
    counted = Counter((wf, int(step), int(label)) for wf, step, label, _, _ in calls)
    keys: dict[tuple[str, int, int], set[str]] = {}
    for wf, step, label, ikey, _ in calls:
        keys.setdefault((wf, int(step), int(label)), set()).add(ikey)
    async with CheckpointManager(open_store()) as manager:
        workflows = await manager.list_workflows()
        for wf in workflows:
            point = await manager.get_resume_point(wf)
            assert point is not None and point[0] == kill.STEPS, wf
            for step in range(kill.STEPS):
                await check_step(manager, wf, step, counted, keys)
        assert await manager.list_in_doubt_workflows() == []
    return len(workflows)


async def check_step(
    manager: CheckpointManager,
    wf: str,
    step: int,
    calls: Counter[tuple[str, int, int]],
    keys: dict[tuple[str, int, int], set[str]],
) -> None:
    """Each effect of the step: done, with its result; called once (or one key, if idempotent)."""
    records = {kill.label_of(r.key): r for r in await manager.get_effects(wf, step)}
    last = kill.effects_in(step) - 1
    assert sorted(records) == list(range(kill.effects_in(step)))
    for label, record in records.items():
        assert record.state is EffectState.DONE
        assert record.result == kill.expected(wf, step, label)
        where = (wf, step, label)
        if label == last:
            assert calls[where] >= 1 and keys[where] == {record.idempotency_key}
        else:
            assert calls[where] == 1, (where, calls[where])


TTL = 0.5
WORKFLOWS = 6
RUNNERS = 3


@pytest.fixture(params=["sqlite", "postgres"])
def open_leased(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """Opens a new storage object on one store with leases."""
    schema = new_schema_name()
    opener: Open
    if request.param == "sqlite":
        opener = lambda: SQLiteCheckpointStorage(tmp_path / "fx.db")  # noqa: E731
    else:
        opener = lambda: PostgresCheckpointStorage(DSN, schema=schema, max_size=2)  # noqa: E731
    yield opener
    if request.param == "postgres":
        asyncio.run(drop_schema(schema))


def fork_runner(open_store: Open, log: Path, seed: int) -> int:
    """Fork a runner of the pool; return its pid."""
    return fork(lambda: kill.pool_child(open_store, log, seed, TTL))


async def unfinished(open_store: Open) -> list[str]:
    """The workflows whose records say unfinished."""
    async with CheckpointManager(open_store()) as manager:
        return await manager.list_workflows(status="unfinished")


@pytest.mark.slow
def test_runner_pool_with_killed_and_stalled_runners(open_leased: Open, tmp_path: Path) -> None:
    """Runners die and stall past their leases; a stale runner never starts an effect."""
    log = tmp_path / "calls.log"

    async def register() -> None:
        async with CheckpointManager(open_leased()) as manager:
            for n in range(WORKFLOWS):
                await manager.register_workflow(f"wf-{n}")

    asyncio.run(register())
    seed, deaths = 0, 0
    running: set[int] = set()
    while (left := asyncio.run(unfinished(open_leased))) or running:
        while left and len(running) < RUNNERS:
            running.add(fork_runner(open_leased, log, seed))
            seed += 1
        pid, status = os.wait()
        running.discard(pid)
        assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0, status
        deaths += os.WIFSIGNALED(status)
    lines = kill.CallLog(log).lines()
    check_fencing(lines)
    calls = [line for line in lines if line[0] not in ("claim", "lost")]
    assert asyncio.run(check(open_leased, calls)) == WORKFLOWS and deaths > 0
    # Takeovers happened (a workflow claimed again), and stale runners were refused.
    claims = Counter(line[1] for line in lines if line[0] == "claim")
    assert max(claims.values()) > 1
    assert any(line[0] == "lost" for line in lines), "no stale runner was ever fenced off"


def check_fencing(lines: list[list[str]]) -> None:
    """No call is logged under a token after a newer claim of its workflow was logged."""
    newest: dict[str, int] = {}
    for line in lines:
        if line[0] == "lost":
            continue
        if line[0] == "claim":
            newest[line[1]] = max(newest.get(line[1], 0), int(line[2]))
            continue
        wf, token = line[0], int(line[4])
        assert token >= newest.get(wf, 0), f"a stale runner (token {token}) called {line}"
