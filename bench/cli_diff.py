"""``aiocheckpoint diff`` of a large state's one-key edit: wall time and peak memory.

    python bench/cli_diff.py [--state-mb 50] [--rounds 5] [--dir DIR] [--base SRC]

Writes (once, reused with ``--dir``) two SQLite stores holding workflow ``big-state``: a
state of ``state-mb`` MB (strings of 1,000 characters) at step 0 and the same state with
one key changed at step 1, one store plain and one encrypted (its keys file beside it).
Then runs ``aiocheckpoint diff URL big-state 0 1`` in a child process, ``rounds`` times per
store: the child imports the command line, then times the command (wall time, excluding
the interpreter's start and imports) and traces its allocations (the peak of Python's
heap, tracemalloc, in one more run of each, as tracing slows allocations); the child's
peak resident memory (``VmHWM``, which ``exec`` resets, unlike ``ru_maxrss``) is given too,
with what it was once the imports were done. With ``--base SRC`` (the ``src`` directory of
another checkout, put first on ``PYTHONPATH``) the same commands of that
version run too, alternating with this one round by round, so both see the same machine
load; the output of the two must match byte for byte. Prints one JSON line per (version,
store): medians, worst, the load.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiocheckpoint import CheckpointManager, Keyring, ResumableWorkflow, open_storage

KEY = bytes(range(32))
#: The child: imports the command line, then runs the command timed and traced; its
#: figures are the last line of its stderr.
DRIVER = """
import json, os, sys, time, tracemalloc
def hwm():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
from aiocheckpoint.cli import main
start = hwm()
if os.environ.get("BENCH_TRACE"):
    tracemalloc.start()
began = time.perf_counter()
code = main(sys.argv[1:])
took = time.perf_counter() - began
peak = tracemalloc.get_traced_memory()[1]
sys.stdout.flush()
print(json.dumps({"code": code, "ms": took * 1000, "peak": peak, "start_rss": start,
                  "rss": hwm()}), file=sys.stderr)
"""


async def build(url: str, megabytes: int, keys: Keyring | None) -> None:
    """Workflow ``big-state``: ``megabytes`` MB at step 0, one key changed at step 1."""
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:
        if await manager.has_checkpoint("big-state", 1):
            return
        async with ResumableWorkflow("big-state", manager) as wf:
            async with wf.step(0, agent_id="a"):
                for n in range(megabytes * 1000):
                    wf.state.set(f"k{n:06}", "x" * 1000)
            async with wf.step(1, agent_id="a"):
                wf.state.set(f"k{megabytes * 500:06}", "y")


def once(argv: list[str], src: str | None, trace: bool) -> tuple[dict[str, float], bytes]:
    """One run of the command: its figures (ms, traced peak, RSS) and its stdout."""
    env = dict(os.environ)
    if trace:
        env["BENCH_TRACE"] = "1"
    if src is not None:
        env["PYTHONPATH"] = src
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            [sys.executable, "-c", DRIVER, *argv], stdout=subprocess.PIPE, stderr=err, env=env
        )
        assert child.stdout is not None
        out = child.stdout.read()
        child.stdout.close()
        child.wait()
        err.seek(0)
        lines = err.read().decode().splitlines()
    if child.returncode != 0 or not lines:
        raise SystemExit(f"{argv} failed: {lines[-5:]}")
    got = json.loads(lines[-1])
    if got["code"] != 0:
        raise SystemExit(f"{argv} exited {got['code']}: {lines[-5:]}")
    figures = {
        "ms": got["ms"],
        "traced_mb": got["peak"] / 2**20,
        "rss_mb": got["rss"] / 1024,
        "rss_after_import_mb": got["start_rss"] / 1024,
    }
    return figures, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mb", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", help="reuse (or build once) the stores in this directory")
    parser.add_argument("--base", help="the src directory of the version to compare with")
    args = parser.parse_args()
    where = Path(args.dir or tempfile.mkdtemp())
    where.mkdir(parents=True, exist_ok=True)
    keys_path = where / "keys.json"
    keys_path.write_text(
        json.dumps({"primary": "k1", "keys": {"k1": base64.b64encode(KEY).decode()}})
    )
    keys_path.chmod(0o600)
    plain, sealed = f"sqlite:///{where / 'plain.db'}", f"sqlite:///{where / 'sealed.db'}"
    asyncio.run(build(plain, args.state_mb, None))
    asyncio.run(build(sealed, args.state_mb, Keyring(keys={"k1": KEY}, primary="k1")))
    stores = {
        "plain": ["diff", plain, "big-state", "0", "1"],
        "encrypted": ["diff", sealed, "big-state", "0", "1", "--keys", str(keys_path)],
    }
    versions: dict[str, str | None] = {"branch": None}
    if args.base:
        versions = {"base": str(Path(args.base).resolve()), **versions}
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    outputs: dict[str, set[bytes]] = {}
    for _ in range(args.rounds):
        for store, argv in stores.items():
            for version, src in versions.items():
                figures, out = once(argv, src, trace=False)
                runs.setdefault((version, store), []).append(figures)
                outputs.setdefault(store, set()).add(out)
    traced = {
        (version, store): once(argv, src, trace=True)[0]["traced_mb"]
        for store, argv in stores.items()
        for version, src in versions.items()
    }
    for store, seen in outputs.items():
        assert len(seen) == 1, f"{store}: the versions print different diffs"
    for (version, store), samples in runs.items():

        def median(name: str, samples: list[dict[str, float]] = samples) -> float:
            return round(statistics.median(s[name] for s in samples), 1)

        emit(
            version=version,
            store=store,
            state_mb=args.state_mb,
            rounds=args.rounds,
            median_ms=median("ms"),
            worst_ms=round(max(s["ms"] for s in samples), 1),
            traced_peak_mb=round(traced[version, store], 1),
            rss_mb=median("rss_mb"),
            rss_after_import_mb=median("rss_after_import_mb"),
        )


def emit(**fields: Any) -> None:
    fields["load"] = round(os.getloadavg()[0], 2)
    print(json.dumps(fields), flush=True)


if __name__ == "__main__":
    main()
