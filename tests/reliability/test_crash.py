"""Process crashes: SIGKILL a writing child at random moments; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

import aiocheckpoint
from aiocheckpoint import CheckpointManager

from ._support import TALLY, decode_stored, scaled
from .conftest import Backend
from .crash_child import ALL_IDS, BIG, KEEP, STRIDE, digest

CHILD = Path(__file__).with_name("crash_child.py")
Acks = dict[str, dict[int, str]]


class Zygote:
    """The warmed-up parent of the writers (see crash_child.py)."""

    def __init__(self) -> None:
        src = str(Path(aiocheckpoint.__file__).parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def _line(self, prefix: str) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(prefix + " "), f"zygote said {line!r}"
        return int(line.split()[1])

    def start(self, url: str, options: dict[str, Any], seed: int, run: int, ackfile: Path) -> int:
        """Fork a writer; return its pid."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{url}\t{seed}\t{run}\t{ackfile}\t{json.dumps(options)}\n")
        self.proc.stdin.flush()
        return self._line("PID")

    def wait(self) -> int:
        """The wait status of the last writer."""
        return self._line("EXIT")

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_ready(ackfile: Path, timeout: float = 60.0) -> None:
    """Until the writer is ready and has acknowledged its first checkpoint (on a loaded
    machine that can take seconds, and the kills must interrupt acknowledged work)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ackfile.exists() and ackfile.read_bytes().startswith(b"READY\n") and _acked(ackfile):
            return
        time.sleep(0.002)
    raise AssertionError("the writer never acknowledged a checkpoint")


def _acked(ackfile: Path) -> bool:
    return ackfile.read_bytes().count(b"\n") > 1


def _read_acks(ackfile: Path) -> Acks:
    acks: Acks = defaultdict(dict)
    for line in ackfile.read_text().split("\n")[1:]:
        try:
            wf, step, dig = json.loads(line)
        except ValueError:
            continue  # the last line may be cut by the kill; it is simply not checked
        acks[wf][step] = dig
    return acks


def _must_be_present(acks: Acks, with_big: bool) -> dict[tuple[str, int], str]:
    """Acknowledged checkpoints that must exist: all small ones, the newest KEEP-1 big ones.

    Within one run, one more big write may have landed unacknowledged and pruned the oldest
    of KEEP; across runs, later runs legitimately prune big ones, so they are left out.
    """
    out = {}
    for wf, steps in acks.items():
        if wf in BIG and not with_big:
            continue
        chosen = sorted(steps)[-(KEEP - 1) :] if wf in BIG else list(steps)
        out.update({(wf, s): steps[s] for s in chosen})
    return out


async def _verify(
    backend: Backend, root: Path, acks: Acks, since_step: int, with_big: bool = True
) -> int:
    """Open the store afresh; check every required ack and every visible record since a step."""
    async with backend.open(root) as storage:
        manager = CheckpointManager(storage)
        workflows = await manager.list_workflows()
        assert set(workflows) <= ALL_IDS
        for wf in workflows:
            assert await manager.get_latest_checkpoint(wf) is not None
            for stored in await storage.scan(wf, after=since_step - 1 if since_step else None):
                await decode_stored(storage, stored.data, wf, stored.step)
        required = _must_be_present(acks, with_big)
        for (wf, step), dig in required.items():
            checkpoint = await manager.get_checkpoint(wf, step)
            assert digest(checkpoint.state_snapshot.data) == dig, (wf, step)
        return len(required)


def _merge(into: Acks, more: Acks) -> None:
    for wf, steps in more.items():
        into.setdefault(wf, {}).update(steps)


@pytest.mark.slow
def test_sigkill_never_loses_an_acknowledged_checkpoint(
    durable_backend: Backend, tmp_path: Path
) -> None:
    """A child writing many concurrent small and 1 MB workflows is SIGKILLed at random moments,
    over and over; after every kill each acknowledged checkpoint is present and verifies, the
    store opens and every visible record decodes.
    """
    kills = int(os.environ.get("AIOCHECKPOINT_CRASH_KILLS", "0")) or scaled(
        durable_backend.crash_kills, durable_backend.crash_kills * 10
    )
    rng = random.Random(20261129)
    root = tmp_path
    asyncio.run(_verify(durable_backend, root, {}, 0))  # creates what the URL needs
    url, options = durable_backend.url(root), durable_backend.options(root)
    everything: Acks = {}
    checked = 0
    with Zygote() as zygote:
        for run in range(kills):
            ackfile = tmp_path / f"acks-{run}.jsonl"
            pid = zygote.start(url, options, 7, run, ackfile)
            if rng.random() < 0.1:
                time.sleep(rng.uniform(0, 0.02))  # sometimes during start-up and recovery
            else:
                _wait_ready(ackfile)
                time.sleep(rng.uniform(0.05, 0.5))
            os.kill(pid, signal.SIGKILL)
            status = zygote.wait()
            assert os.WIFSIGNALED(status), f"writer {run} exited by itself ({status}): see stderr"
            assert os.WTERMSIG(status) == signal.SIGKILL
            TALLY[f"SIGKILLs ({durable_backend.name})"] += 1
            acks = _read_acks(ackfile) if ackfile.exists() else {}
            checked += asyncio.run(_verify(durable_backend, root, acks, run * STRIDE))
            TALLY["acknowledged checkpoints verified after a kill"] = TALLY[
                "acknowledged checkpoints verified after a kill"
            ] + sum(len(v) for v in acks.values())
            _merge(everything, acks)
    assert checked > kills  # the kills really interrupted writers that had acknowledged work
    asyncio.run(_verify(durable_backend, root, everything, 0, with_big=False))
    asyncio.run(_write_once_more(durable_backend, root))
    assert durable_backend.temp_files(root) == []


async def _write_once_more(backend: Backend, root: Path) -> None:
    """After the last crash the store takes new writes in every workflow, and reads them back."""
    async with backend.open(root) as storage:
        manager = CheckpointManager(storage)
        for wf in await manager.list_workflows():
            await manager.create_checkpoint(wf, 10**12, "parent", "completed", {"after": wf})
            assert (await manager.get_latest_checkpoint(wf)).state_snapshot.data == {"after": wf}  # type: ignore[union-attr]
