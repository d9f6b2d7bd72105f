"""Real crashes: SIGKILL a writing child process many times; several processes writing at once.

``AIOCHECKPOINT_CRASH_KILLS`` sets the number of kills (default 30).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import anyio
import pytest

import aiocheckpoint
from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.file import FileCheckpointStorage
from tests._zygote import Zygote

CHILD = Path(__file__).with_name("_file_writer_child.py")
KILLS = int(os.environ.get("AIOCHECKPOINT_CRASH_KILLS", "30"))
SMALL = ("small-0", "small-1", "small-2", "a/b", "Ünïcode ✓", "shared")
BIG = ("big-0", "big-1")
BIG_KEEP = 3
#: What the writers import, once, in the zygote they are forked from (tests/_zygote.py).
PRELOAD = ("anyio", "aiocheckpoint", "aiocheckpoint.storage.file")

Acks = dict[str, set[int]]


def spawn(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(aiocheckpoint.__file__).parents[1])
    return subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, env=env)


def parse_acks(output: bytes, into: Acks) -> int:
    """Record each complete ``<hex id> <step>`` line; return how many there were."""
    lines = output.split(b"\n")[:-1]  # a line cut by the kill has no newline: not acked
    for line in lines:
        wf_hex, step = line.decode().split()
        into[bytes.fromhex(wf_hex).decode()].add(int(step))
    return len(lines)


def temp_named(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(".")]


async def verify(base: Path, acks: Acks, fresh: Acks) -> None:
    """Check what a crash must never lose, through a brand-new storage object."""
    manager = CheckpointManager(FileCheckpointStorage(base))
    async with manager:
        listed = await manager.list_workflows()
        assert temp_named(listed) == []
        for wf, steps in acks.items():
            assert wf in listed
            latest = await manager.get_latest_checkpoint(wf)
            assert latest is not None and latest.step >= max(steps), wf
            assert await manager.get_resume_point(wf) is not None
            stored = await manager.list_checkpoints(wf)  # decodes and verifies each
            present = {c.step for c in stored}
            assert latest.step == max(present)
            if wf in BIG:
                assert max(steps) in present
                assert len(present) <= BIG_KEEP + 1  # a kill may land before the prune
            else:
                # Old steps of small workflows are rechecked at every kill; the new ones
                # were acknowledged by the run that was just killed.
                assert steps <= present, sorted(steps - present)[:5]
                for step in fresh.get(wf, ()):
                    cp = await manager.get_checkpoint(wf, step)
                    assert cp.state_snapshot.data["n"] == step


def kill_once(
    zygote: Zygote, base: Path, rng: random.Random, acks: Acks, mode: str = "crash"
) -> Acks:
    proc = zygote.spawn(str(base), mode)
    with proc.stdout:
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.05, 0.8))
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()
    assert proc.wait() == -signal.SIGKILL
    fresh: Acks = defaultdict(set)
    parse_acks(rest, fresh)
    for wf, steps in fresh.items():
        acks[wf] |= steps
    return fresh


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_checkpoint(tmp_path: Path) -> None:
    """After each of many SIGKILLs, every acknowledged step is present and verifies."""
    base = tmp_path / "store"
    rng = random.Random(int(os.environ.get("AIOCHECKPOINT_CRASH_SEED", "1234")))
    acks: Acks = defaultdict(set)
    with Zygote(CHILD, *PRELOAD) as zygote:
        for _ in range(KILLS):
            fresh = kill_once(zygote, base, rng, acks)
            anyio.run(verify, base, acks, fresh)
    assert set(acks) == set(SMALL) | set(BIG)
    assert sum(len(s) for s in acks.values()) > KILLS  # the children made real progress

    async def sweep_and_count() -> list[str]:
        async with FileCheckpointStorage(base) as store:
            for wf in acks:
                await store.save(wf, 2**62, b"final")  # a new writer removes dead temp files
        return [p.name for p in base.rglob(".tmp-*")]

    assert anyio.run(sweep_and_count) == []


@pytest.mark.slow
def test_sigkill_during_group_commits_loses_nothing(tmp_path: Path) -> None:
    """Forty workflows saving at once (group commits): after each SIGKILL every
    acknowledged step is present and verifies, and no temporary file is listed."""
    base = tmp_path / "store"
    rng = random.Random(int(os.environ.get("AIOCHECKPOINT_CRASH_SEED", "4321")))
    acks: Acks = defaultdict(set)
    with Zygote(CHILD, *PRELOAD) as zygote:
        for _ in range(max(5, KILLS // 2)):
            fresh = kill_once(zygote, base, rng, acks, "group")
            anyio.run(verify, base, acks, fresh)
    assert len(acks) == 40
    assert sum(len(s) for s in acks.values()) > 40 * KILLS // 2  # groups made real progress


def test_several_processes_write_one_store(tmp_path: Path) -> None:
    """Three processes writing the same workflows at once lose nothing and prune correctly."""
    base = tmp_path / "store"
    count, steps = 3, 40
    procs = [spawn(str(base), "writers", str(i), str(count), str(steps)) for i in range(count)]
    acks: Acks = defaultdict(set)
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert parse_acks(out.split(b"\n", 1)[1], acks) == 5 * steps

    async def check() -> None:
        async with CheckpointManager(FileCheckpointStorage(base)) as manager:
            everything = list(range(count * steps))
            for wf in ("same-0", "same-1", "same/2"):
                stored = await manager.list_checkpoints(wf)
                assert [c.step for c in stored] == everything
                latest = await manager.get_latest_checkpoint(wf)
                assert latest is not None and latest.step == everything[-1]
            kept = await manager.list_checkpoints("kept")
            assert [c.step for c in kept] == everything[-5:]
            for i in range(count):
                own = await manager.list_checkpoints(f"own-{i}")
                assert [c.step for c in own] == list(range(i, count * steps, count))
            listed = await manager.list_workflows()
            assert listed == sorted(
                ["kept", "same-0", "same-1", "same/2"] + [f"own-{i}" for i in range(count)]
            )

    anyio.run(check)
    assert list(base.rglob(".tmp-*")) == []


@pytest.mark.parametrize("wf", ["small-0"])
def test_ack_parsing_ignores_cut_lines(wf: str) -> None:
    """A line cut off by the kill (no newline) does not count as acknowledged."""
    acks: Acks = defaultdict(set)
    hexid = wf.encode().hex().encode()
    assert parse_acks(hexid + b" 1\n" + hexid + b" 2", acks) == 1
    assert acks == {wf: {1}}
