"""Smoke test of the benchmark suite: the scripts run end to end at tiny sizes (no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: One tiny run for all of them: under pytest-xdist the module runs on one worker, queued
#: first (the run takes a minute or more). The other bench scripts are smoke-tested in
#: tests/test_bench_scripts.py, free to run on other workers meanwhile.
pytestmark = [pytest.mark.xdist_group("bench-smoke"), pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_run() -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, records


def test_tiny_run_exits_cleanly(tiny_run: tuple[subprocess.CompletedProcess[str], Any]) -> None:
    """`bench/run.py --tiny` exits 0 and reports no failed measurement."""
    proc, records = tiny_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r for r in records if r["kind"] == "error"] == []


def test_every_available_system_is_measured_in_every_workload(
    tiny_run: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]],
) -> None:
    """Each system not reported unavailable prints a JSON measurement for each of its workloads."""
    sys.path.insert(0, str(ROOT))
    from bench.systems import ALL_SYSTEMS

    _, records = tiny_run
    unavailable = {r["system"] for r in records if r["kind"] == "unavailable"}
    measured = {(r["system"], r["workload"]) for r in records if r["kind"] == "measurement"}
    # The dev extra installs every peer and CI runs PostgreSQL: nothing may drop out unseen.
    assert unavailable == set(), [r for r in records if r["kind"] == "unavailable"]
    for cls in ALL_SYSTEMS:
        if cls.name not in unavailable:
            assert {(cls.name, w) for w in cls.workloads} <= measured, cls.name


def test_measurements_carry_figures_and_ratios_are_computed(
    tiny_run: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]],
) -> None:
    """Write measurements hold a positive rate and latencies, and ours-memory gets ratio lines."""
    proc, records = tiny_run
    writes = [r for r in records if r["kind"] == "measurement" and r["workload"] == "write"]
    assert writes and all(r["per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] >= 0 for r in writes)
    assert records[0]["kind"] == "env" and records[0]["nproc"] >= 1
    others = {r["system"] for r in records if r["kind"] == "measurement" and r["group"] != "ours"}
    if others - {"(idle loop)", "(full copy per step)"}:
        assert any(r["kind"] == "ratio" and r["ours"] == "ours-memory" for r in records)
    assert "### write" in proc.stdout
