"""Smoke test of the benchmark suite: the scripts run end to end at tiny sizes (no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: One tiny run for all of them: under pytest-xdist the module runs on one worker.
pytestmark = pytest.mark.xdist_group("bench-smoke")


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


def _bench_lines(script: str, *args: str) -> list[dict[str, Any]]:
    """The JSON lines a bench script prints (it must exit 0)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_effects_bench_runs() -> None:
    """`bench/effects.py --tiny` prints its three rows per backend and each backend's summary
    (no timings checked)."""
    lines = _bench_lines("effects.py", "--tiny")
    rows = {(line["backend"], line["row"]) for line in lines if "row" in line}
    backends = ("sqlite", "file", "postgres")
    assert rows == {(b, r) for b in backends for r in ("plain", "effects", "journal")}
    assert [line["summary"] for line in lines if "summary" in line] == list(backends)


def test_otel_bench_runs() -> None:
    """`bench/run.py --tiny --otel` prints every mode of every workload and their ratios."""
    lines = _bench_lines("run.py", "--tiny", "--otel")
    rows = {(r["workload"], r["mode"]) for r in lines if r["kind"] == "measurement"}
    assert rows == {(w, m) for w in ("memory", "sqlite-c20", "sqlite-c1", "postgres-c1")
                    for m in ("absent", "noop", "sdk", "sampled", "metrics")}  # fmt: skip
    ratios = [r for r in lines if r["kind"] == "ratio"]
    assert len(ratios) == 4 * 3 * 4 and all(r["ratio"] > 0 for r in ratios)


def test_sweep_bench_runs() -> None:
    """`bench/sweep.py --tiny` prints its three rows and the summary (no timings checked)."""
    lines = _bench_lines("sweep.py", "--tiny")
    rows = {line.get("row") for line in lines[:-1]}
    assert rows == {"sweep-same-store", "sweep-other-store", "alone"}
    assert lines[-1]["summary"] == "sqlite"
    assert lines[-1]["sweep-same-store_workflows_deleted"] == 20


def test_gc_pauses_bench_runs() -> None:
    """`bench/gc_pauses.py` prints one line per run with the collection figures (no timings
    checked); with ``--freeze`` almost nothing is left tracked."""
    args = ("--systems", "ours-memory", "--seconds", "0.2", "--repeats", "1", "--promoted")
    plain, frozen = (
        _bench_lines("gc_pauses.py", *args),
        _bench_lines("gc_pauses.py", *args, "--freeze"),
    )
    assert [line["system"] for line in plain + frozen] == ["ours-memory"] * 2
    for line in plain + frozen:
        assert line["checkpoints"] > 0 and line["promoted_per_save"] >= 0
        assert len(line["full_cpu_ms"]) == round(line["full_per_10k"] * line["checkpoints"] / 1e4)
    assert frozen[0]["frozen"] and frozen[0]["tracked"] < plain[0]["tracked"] / 10
