"""Crash and multi-process tests for SQLiteCheckpointStorage, with real processes and SIGKILL.

``AIOCHECKPOINT_CRASH_KILLS`` sets the number of kills (default 30);
``AIOCHECKPOINT_CRASH_SEED`` fixes the random kill times.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

import aiocheckpoint
from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests._zygote import Child, Zygote

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

CHILD = Path(__file__).with_name("sqlite_child.py")
SRC = Path(aiocheckpoint.__file__).resolve().parents[1]
KILLS = int(os.environ.get("AIOCHECKPOINT_CRASH_KILLS", "30"))
SEED = int(os.environ.get("AIOCHECKPOINT_CRASH_SEED", str(random.randrange(2**32))))
#: What the crash-mode writers import, once, in the zygote they are forked from.
PRELOAD = ("asyncio", "aiocheckpoint", "aiocheckpoint.storage.sqlite")


def spawn(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )


class Lines:
    """Drains a child's stdout in a thread so the child never blocks on a full pipe."""

    def __init__(self, proc: subprocess.Popen[str] | Child) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen[str] | Child) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line == "ready\n":
                self.ready.set()
            self.lines.append(line)
        self.ready.set()


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchall()[0][0])
    finally:
        conn.close()


async def verify(db: Path, new: list[tuple[str, int]], acked: dict[str, set[int]]) -> None:
    """Every newly acknowledged small step is present and verifies. A big workflow (kept
    with max_checkpoints=2) holds its latest acknowledged step, or two newer steps that were
    committed but killed before they were acknowledged; all its records verify."""
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
        for wf, step in new:
            if wf.startswith("small-"):
                cp = await manager.get_checkpoint(wf, step)
                assert (cp.state_snapshot.data["wf"], cp.state_snapshot.data["step"]) == (wf, step)
        for wf in acked:
            if wf.startswith("big-"):
                stored = await manager.list_checkpoints(wf)  # decodes and verifies each
                steps = [c.step for c in stored]
                last = max(acked[wf])
                assert last in steps or (len(steps) == 2 and min(steps) > last), (wf, steps)
                for cp in stored:
                    assert cp.state_snapshot.data["step"] == cp.step
                    assert len(cp.state_snapshot.data["blob"]) == 1024 * 1024


def kill_once(zygote: Zygote, db: Path, rng: random.Random) -> list[tuple[str, int]]:
    """SIGKILL a crash-mode writer at a random moment; the steps it acknowledged."""
    proc = zygote.spawn("crash", str(db), text=True)
    with proc.stdout:
        out = Lines(proc)
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.0, 0.6))  # may land during the start-up or the open
        else:
            out.ready.wait(60)
            time.sleep(rng.uniform(0.01, 0.5))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        out.thread.join(10)
    return [
        (parts[1], int(parts[2]))
        for parts in (line.split() for line in out.lines)
        if parts and parts[0] == "ack"
    ]


@pytest.mark.slow
def test_sigkill_never_loses_an_acknowledged_checkpoint(tmp_path: Path) -> None:
    """Across many SIGKILLs at random moments, every acknowledged checkpoint survives and
    verifies, and the database passes integrity_check after each kill."""
    db = tmp_path / "crash.db"
    rng = random.Random(SEED)
    acked: dict[str, set[int]] = defaultdict(set)
    rounds_with_acks = 0
    with Zygote(CHILD, *PRELOAD) as zygote:
        for kill in range(KILLS):
            new = kill_once(zygote, db, rng)
            for wf, step in new:
                acked[wf].add(step)
            rounds_with_acks += bool(new)
            assert integrity(db) == "ok", f"kill {kill} (seed {SEED})"
            asyncio.run(verify(db, new, acked))
    assert rounds_with_acks >= KILLS // 2, f"the child rarely got to write (seed {SEED})"

    async def everything() -> None:
        async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
            for wf, steps in acked.items():
                if wf.startswith("small-"):
                    stored = {c.step for c in await manager.list_checkpoints(wf)}
                    assert steps <= stored, f"{wf} lost {sorted(steps - stored)[:5]}"

    asyncio.run(everything())
    total = sum(len(steps) for steps in acked.values())
    print(f"{KILLS} kills, {total} acknowledged checkpoints verified (seed {SEED})")


def test_two_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    """Two processes writing the same workflows of one database file both land every write."""
    db = tmp_path / "shared.db"
    count = 1000
    procs = [
        spawn("writer", str(db), str(ident), str(count), stdin=subprocess.PIPE) for ident in (0, 1)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    for proc in procs:  # both start writing at the same moment
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert all(out.strip() == "done" for out in outs)

    async def check() -> None:
        async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
            for n in range(10):
                got = await manager.list_checkpoints(f"wf-{n}")
                assert [c.step for c in got] == list(range(2 * (count // 10)))
                assert {c.agent_id for c in got} == {"p0", "p1"}

    asyncio.run(check())
    assert integrity(db) == "ok"
