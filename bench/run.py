"""Run the benchmark suite: every workload on every available system, in one process.

    python bench/run.py [--quick | --tiny] [--only NAME ...] [--markdown FILE]
    python bench/run.py [--quick | --tiny] --otel    # OpenTelemetry's overhead (bench/otel.py)

Prints one JSON line per measurement (medians of the repeats), one per ratio of each of our
backends against each peer and raw limit, then markdown tables. ``--only`` takes workload
names (write, lag, lookup, growth, resume) and system names (ours-sqlite, lg-sqlite, ...),
comma-separated or repeated; workloads and systems filter independently.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import platform
import shlex
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if (ROOT / "src").is_dir() and str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))  # measure this checkout, not an installed copy

from bench import report  # noqa: E402
from bench.systems import ALL_SYSTEMS, WORKLOADS, Env, System  # noqa: E402
from bench.workloads import (  # noqa: E402
    Sizes,
    growth_reference,
    run_growth,
    run_idle_lag,
    run_lag,
    run_lookup,
    run_resume,
    run_write,
)

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

Job = Callable[[], Awaitable[dict[str, Any] | list[dict[str, Any]]]]


def emit(record: dict[str, Any]) -> None:
    """Print one JSON line now, so a long run shows progress."""
    print(json.dumps(record, sort_keys=False), flush=True)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        key: statistics.median(r[key] for r in runs)
        if isinstance(runs[0][key], (int, float))
        else runs[0][key]
        for key in runs[0]
    }


async def measure(
    workload: str, param: str, system: type[System] | str, group: str, job: Job, timeout: float
) -> dict[str, Any] | None:
    """Run ``job`` and emit the medians of the runs it returns (or the error)."""
    name = system if isinstance(system, str) else system.name
    base = {"workload": workload, "param": param, "system": name, "group": group}
    started = time.perf_counter()
    try:
        gc.collect()
        result = await asyncio.wait_for(job(), timeout)
        runs = result if isinstance(result, list) else [result]
    except Exception as exc:
        emit({"kind": "error", **base, "error": f"{type(exc).__name__}: {exc}"[:500]})
        return None
    record = {"kind": "measurement", **base, "repeats": len(runs), **_median(runs)}
    record["wall_s"] = round(time.perf_counter() - started, 2)
    emit(record)
    return record


def plan(
    sizes: Sizes, systems: list[type[System]], workloads: set[str], env: Env
) -> list[tuple[str, str, type[System] | str, str, Job]]:
    """Every (workload, parameter, system) measurement to run, in order."""
    jobs: list[tuple[str, str, type[System] | str, str, Job]] = []

    def add(workload: str, param: str, run: Callable[..., Any], *args: Any) -> None:
        for cls in ALL_SYSTEMS:
            if workload in workloads and workload in cls.workloads and cls in systems:
                jobs.append((workload, param, cls, cls.group,
                             functools.partial(run, cls, env, sizes, *args)))  # fmt: skip

    def reference(workload: str, param: str, name: str, job: Job) -> None:
        if workload in workloads:
            jobs.append((workload, param, name, "reference", job))

    for c in sizes.concurrency:
        add("write", f"C={c}", run_write, c)
    reference("lag", "idle", "(idle loop)", functools.partial(run_idle_lag, sizes))
    add("lag", "small-c100", run_lag, "small-c100")
    big = f"{sizes.lag_writers}x{sizes.big_state_bytes / 1e6:g}MB"
    add("lag", big, run_lag, big)
    add("lookup", f"history={sizes.history}", run_lookup)
    for scenario in ("doc-1mb", "chat"):
        reference("growth", scenario, "(full copy per step)",
                  functools.partial(_reference, sizes, scenario))  # fmt: skip
        add("growth", scenario, run_growth, scenario)
    add("resume", f"{sizes.resume_state_bytes / 1e6:g}MB", run_resume)
    return jobs


async def _reference(sizes: Sizes, scenario: str) -> dict[str, Any]:
    return growth_reference(sizes, scenario)


async def probe_postgres(dsn: str) -> tuple[str | None, dict[str, str]]:
    """Whether PostgreSQL answers, and its durability settings."""
    try:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncio.wait_for(asyncpg.connect(dsn), 5)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", {}
    try:
        settings = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("server_version", "fsync", "synchronous_commit", "full_page_writes")
        }
    finally:
        await conn.close()
    return None, settings


def machine() -> dict[str, Any]:
    """nproc and the CPU model, for the docs table."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="under 2 minutes on 2 cores")
    size.add_argument("--tiny", action="store_true", help="seconds; checks the scripts run")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="workload or system name(s), comma-separated; repeatable")  # fmt: skip
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    parser.add_argument("--dsn", default=os.environ.get("AIOCHECKPOINT_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--dir", type=Path, help="where stores are created (default: a temp dir)")
    parser.add_argument(
        "--otel", action="store_true", help="only the OpenTelemetry overhead rows (bench/otel.py)"
    )
    parser.add_argument("--render", type=Path, metavar="JSONL",
                        help="print a saved run's tables; measure nothing")  # fmt: skip
    return parser.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    """Run the suite; return the process exit code."""
    args = parse_args(argv)
    if args.render:
        print(render(args.render))
        return 0
    if args.otel:  # its modes need fresh interpreters: bench/otel.py spawns them
        from bench import otel

        size = ["--tiny"] if args.tiny else ["--rounds", "3"] if args.quick else []
        return await asyncio.to_thread(otel.main, size)
    sizes = Sizes.tiny() if args.tiny else Sizes.quick() if args.quick else Sizes.full()
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    names = {n.strip() for item in args.only for n in item.split(",") if n.strip()}
    known = WORKLOADS | {cls.name for cls in ALL_SYSTEMS}
    if names - known:
        print(f"unknown --only name(s): {sorted(names - known)}; known: {sorted(known)}")
        return 2
    workloads = (names & WORKLOADS) or set(WORKLOADS)
    wanted = {cls for cls in ALL_SYSTEMS if cls.name in names} or set(ALL_SYSTEMS)

    pg_error, pg_settings = await probe_postgres(args.dsn)
    root = Path(tempfile.mkdtemp(prefix="aiocheckpoint-bench-", dir=args.dir))
    env = Env(root=root, pg_dsn=args.dsn, pg_error=pg_error)
    command = "python bench/run.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    header = {
        "kind": "env", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": mode, "command": command.strip(), **machine(), "postgres": pg_settings,
        "data_dir": str(root), "sizes": sizes.__dict__,
    }  # fmt: skip
    emit(header)

    available: list[type[System]] = []
    unavailable: dict[str, str] = {}
    for cls in ALL_SYSTEMS:
        if cls not in wanted:
            continue
        reason = cls.unavailable(env)
        if reason is None:
            available.append(cls)
        else:
            unavailable[cls.name] = reason
            emit({"kind": "unavailable", "system": cls.name, "group": cls.group, "reason": reason})

    timeout = {"tiny": 60.0, "quick": 120.0, "full": 600.0}[mode]
    results: list[dict[str, Any]] = []
    errors = 0
    try:
        for workload, param, system, group, job in plan(sizes, available, workloads, env):
            record = await measure(workload, param, system, group, job, timeout)
            if record is None:
                errors += 1
            else:
                results.append(record)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)

    ratios = report.ratios(results)
    for ratio in ratios:
        emit(ratio)
    notes = {cls.name: cls.note for cls in ALL_SYSTEMS if cls.note}
    markdown = report.markdown(header, results, ratios, unavailable, notes)
    print()
    print(markdown)
    if args.markdown:
        args.markdown.write_text(markdown)
    return 1 if errors else 0


def render(path: Path) -> str:
    """The markdown tables of a run saved as its printed output."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    header = next(r for r in records if r["kind"] == "env")
    results = [r for r in records if r["kind"] == "measurement"]
    unavailable = {r["system"]: r["reason"] for r in records if r["kind"] == "unavailable"}
    notes = {cls.name: cls.note for cls in ALL_SYSTEMS if cls.note}
    return report.markdown(header, results, report.ratios(results), unavailable, notes)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
