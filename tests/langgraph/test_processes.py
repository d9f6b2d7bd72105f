"""LangGraph threads across processes: a SIGKILLed run resumed by a new process, and two
processes racing for one thread with ``single_writer``."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from aiocheckpoint.integrations.langgraph import AioCheckpointSaver
from tests.langgraph.conftest import backend_url
from tests.langgraph.graphs import loop_graph, loop_input, values_view
from tests.pg_support import drop_schema, new_schema_name

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
CONFIG: Any = {"configurable": {"thread_id": "crashy"}, "recursion_limit": 1000}


def spawn(url: str, *extra: str, pause: float = 0.0) -> subprocess.Popen[str]:
    args = ["run", url, "crashy", str(STEPS), str(pause), *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.langgraph._lg_child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def wait_for(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    for got in proc.stdout:
        if got.strip() == line:
            return
    raise AssertionError(f"the child ended without printing {line!r}")


async def store_url(kind: str, root: Path) -> AsyncIterator[str]:
    schema = new_schema_name()
    yield backend_url(kind, root, schema)
    if kind == "postgres":
        await drop_schema(schema)


@pytest.fixture(params=["file", "sqlite", "postgres"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async for made in store_url(request.param, tmp_path):
        yield made


@pytest.fixture(params=["sqlite", "postgres"])  # the stores with leases that processes share
async def leased_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async for made in store_url(request.param, tmp_path):
        yield made


async def reference_history() -> tuple[Any, list[Any]]:
    graph = loop_graph(InMemorySaver(), steps=STEPS)
    final = await graph.ainvoke(loop_input(), CONFIG)
    steps = [s.metadata["step"] async for s in graph.aget_state_history(CONFIG)]
    return values_view(final), steps


async def stored_history(url: str) -> tuple[Any, list[Any], list[bool]]:
    async with AioCheckpointSaver.from_url(url) as saver:
        graph = loop_graph(saver, steps=STEPS)
        history = [s async for s in graph.aget_state_history(CONFIG)]
    chained = [a.parent_config == b.config for a, b in itertools.pairwise(history)]
    return values_view(history[0].values), [s.metadata["step"] for s in history], chained


async def stored_count(url: str) -> int | None:
    """The ``count`` of the thread's latest stored checkpoint (None: it has none)."""
    async with AioCheckpointSaver.from_url(url) as saver:
        found = await saver.aget_tuple(CONFIG)
    return None if found is None else int(found.checkpoint["channel_values"]["count"])


async def wait_stored(url: str, count: int, timeout: float = 60.0) -> None:
    """Return once the thread's latest stored checkpoint has reached ``count``."""
    deadline = time.monotonic() + timeout
    while (await stored_count(url) or 0) < count:
        assert time.monotonic() < deadline, f"no checkpoint of count {count} was stored"
        await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_sigkilled_run_is_resumed_by_a_new_process(url: str) -> None:
    victim = spawn(url, pause=0.5)
    wait_for(victim, "step 5")  # in the middle of the sixth step
    # LangGraph saves a step's checkpoint while the next step runs (durability="async"),
    # so on a loaded machine the last ones may not be stored yet: wait for the fifth.
    await wait_stored(url, 4)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    saved = await stored_count(url)
    assert saved is not None and 4 <= saved < STEPS
    heir = spawn(url)
    out, _ = heir.communicate(timeout=120)
    assert heir.returncode == 0
    assert f"done {STEPS}" in out
    # The heir goes on from the latest stored step: the one read after the kill, or the
    # next when a commit the victim had sent still landed (PostgreSQL finishes a COMMIT it
    # received, whatever became of the client).
    assert out.splitlines()[0] in (f"step {saved}", f"step {saved + 1}")
    expected_values, expected_steps = await reference_history()
    values, steps, chained = await stored_history(url)
    assert values == expected_values
    assert steps == expected_steps
    assert all(chained)


@pytest.mark.slow
async def test_single_writer_second_process_gets_lease_held(
    leased_url: str, tmp_path: Path
) -> None:
    url, gate = leased_url, tmp_path / "gate"
    first = spawn(url, "single", str(gate))
    wait_for(first, "step 2")  # the first holds the thread's lease and waits at the gate
    second = spawn(url, "single")
    second_out, _ = second.communicate(timeout=120)
    gate.touch()
    first_out, _ = first.communicate(timeout=120)
    assert second.returncode == 3 and "held" in second_out, (first_out, second_out)
    assert first.returncode == 0 and f"done {STEPS}" in first_out
    expected_values, expected_steps = await reference_history()
    values, steps, chained = await stored_history(url)
    assert values == expected_values
    assert steps == expected_steps  # one run's history: nothing interleaved
    assert all(chained)
