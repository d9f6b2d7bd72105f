"""The writer that the crash test SIGKILLs: many concurrent workflows checkpointing forever.

Run one writer directly::

    python crash_child.py URL SEED RUN ACKFILE [OPTIONS_JSON]

It opens the store with ``open_storage(URL, **OPTIONS)``, writes ``READY`` to ACKFILE,
then runs small and ~1 MB workflows concurrently through a CheckpointManager. After each
``create_checkpoint`` returns it appends ``[workflow, step, digest]`` as a JSON line to
ACKFILE (one ``write(2)`` with O_APPEND, so it reaches the kernel before the next write
starts). It never stops on its own.

``python crash_child.py --zygote`` imports everything once, then for each tab-separated
``URL SEED RUN ACKFILE OPTIONS_JSON`` line on stdin forks a writer, prints ``PID <pid>``,
waits for it and prints ``EXIT <wait status>``. Forking a warmed-up process keeps a
hundred kills cheap; every writer is still a real process, killed for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import os
import random
import sys
import traceback
from typing import Any

#: Steps of run ``r`` are ``r * STRIDE + i``, so runs never overwrite each other.
STRIDE = 1_000_000
SMALL = [f"small/{k}" for k in range(10)] + ["small/..", "small/日本語", "small/a b"]
BIG = ["big/0", "big/1"]
#: The big workflows keep this many checkpoints (retention runs during the crashes too).
KEEP = 3
ALL_IDS = frozenset(SMALL + BIG)


def digest(data: Any) -> str:
    """A stable digest of a state's data."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _state(rng: random.Random, step: int, big: bool) -> dict[str, Any]:
    if big:
        return {"step": step, "blob": rng.randbytes(512 * 1024).hex()}
    return {
        "step": step,
        "text": "ü" * rng.randrange(1, 2000),
        "nums": [rng.random() for _ in range(rng.randrange(20))],
        "nested": {"run": step // STRIDE, "flag": rng.random() < 0.5},
    }


async def _write_forever(
    url: str, seed: int, run: int, ackfile: str, options: dict[str, Any]
) -> None:
    from aiocheckpoint import CheckpointManager, open_storage

    fd = os.open(ackfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    storage = open_storage(url, **options)
    plain = CheckpointManager(storage)
    kept = CheckpointManager(storage, max_checkpoints=KEEP)
    os.write(fd, b"READY\n")

    async def loop(wf: str, big: bool) -> None:
        rng = random.Random(f"{seed}/{run}/{wf}")
        manager = kept if big else plain
        step = run * STRIDE
        while True:
            data = _state(rng, step, big)
            await manager.create_checkpoint(wf, step, "crash-child", "completed", data)
            os.write(fd, (json.dumps([wf, step, digest(data)]) + "\n").encode())
            step += 1

    await asyncio.gather(*(loop(wf, False) for wf in SMALL), *(loop(wf, True) for wf in BIG))


def run_writer(url: str, seed: int, run: int, ackfile: str, options: str = "{}") -> int:
    """Run one writer until it is killed; return 3 if it fails on its own."""
    try:
        asyncio.run(_write_forever(url, seed, run, ackfile, json.loads(options)))
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        return 3
    return 0


def zygote() -> None:
    """Fork one writer per command line on stdin; report its pid and wait status."""
    for module in ("file", "sqlite", "postgres"):
        with contextlib.suppress(ImportError):
            importlib.import_module(f"aiocheckpoint.storage.{module}")
    import aiocheckpoint  # noqa: F401 - warm the import before forking

    for line in sys.stdin:
        url, seed, run, ackfile, options = line.rstrip("\n").split("\t")
        pid = os.fork()
        if pid == 0:
            os._exit(run_writer(url, int(seed), int(run), ackfile, options))
        print(f"PID {pid}", flush=True)
        _pid, status = os.waitpid(pid, 0)
        print(f"EXIT {status}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        url, seed, run, ackfile = sys.argv[1:5]
        sys.exit(run_writer(url, int(seed), int(run), ackfile, *sys.argv[5:6]))
