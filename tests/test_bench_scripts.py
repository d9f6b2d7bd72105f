"""Smoke test of the benchmark scripts besides ``bench/run.py --tiny``
(tests/test_bench_smoke.py): each runs end to end at tiny sizes (no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: The bench scripts run in the slow tier (README: "the bench scripts"), each a real run
#: of a small size.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


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


def test_str_floor_bench_runs() -> None:
    """`bench/str_floor.py` prints one line per round with its three ways (no timings checked)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "str_floor.py"), "--rounds", "2", "--mb", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["round 1", "round 2"]
    assert all(line.count(" ms") == 3 for line in lines)


def test_resume_peers_bench_runs() -> None:
    """`bench/resume_peers.py` resumes both states with ours, LangGraph's and the floor."""
    pytest.importorskip("langgraph.checkpoint.sqlite.aio")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "resume_peers.py"), "--rounds", "1", "--mb", "0.1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split()[:2] for line in proc.stdout.splitlines() if "lag max" in line]
    kinds = ["ours", "ours-shared", "lg", "floor"]
    assert rows == [[state, kind] for state in ("docs", "short") for kind in kinds]


def test_resume_stages_bench_runs() -> None:
    """`bench/resume_stages.py` times every stage of both states (no timings checked)."""
    pytest.importorskip("langgraph.checkpoint.sqlite.aio")
    pytest.importorskip("ormsgpack")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "resume_stages.py"), "--rounds", "1", "--mb", "0.1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split()[:3] for line in proc.stdout.splitlines() if line.endswith(" ms")]
    stages = [f"{v} {s}" for v in ("plain", "shared") for s in ("resume", "fetch", "decode")]
    for state in ("docs", "short"):
        named = {
            " ".join(row[1:3]) if row[1] in ("plain", "shared") else row[1]
            for row in rows
            if row[0] == state
        }
        assert {*stages, "crc32", "joins", "parse", "mp-parse", "lg", "lg-row", "lg-loads"} <= named
    assert sum("with msgpack leaves and crc32" in line for line in proc.stdout.splitlines()) == 2


def test_leaf_codecs_bench_runs() -> None:
    """`bench/leaf_codecs.py` times both codecs on every shape (no timings checked)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "leaf_codecs.py"), "--repeats", "1", "--mb", "0.1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split()[:2] for line in proc.stdout.splitlines()]
    assert [row[0] for row in rows] == ["docs", "docs", "short", "short", "chat", "chat", "small"]
    assert all("decode msgpack/json" in line for line in proc.stdout.splitlines()[::2])


def test_scale_bench_runs() -> None:
    """`bench/scale.py --quick` builds 2,000 x 10, sweeps to the newest 3, sweeps again, on
    SQLite and PostgreSQL (no timings checked)."""
    lines = _bench_lines("scale.py", "--quick")
    assert [line["backend"] for line in lines] == ["sqlite", "postgres"]
    for line in lines:
        assert (line["checkpoints"], line["deleted"], line["deleted_again"]) == (20_000, 14_000, 0)
        assert line["bytes_before"] > 0 and line["bytes_after"] > 0
        assert line["writer_saves_alone"] > 0 and line["writer_saves_during_sweep"] > 0


def test_scale_bench_fills_in_sql() -> None:
    """`bench/scale.py --fill` builds the same histories straight in SQL, which the sweep
    thins as it thins those written through a manager (no timings checked)."""
    lines = _bench_lines("scale.py", "--fill", "--workflows", "300", "--writer-seconds", "0.2")
    assert [line["backend"] for line in lines] == ["sqlite", "postgres"]
    for line in lines:
        assert line["built_by"] == "sql"
        assert (line["checkpoints"], line["deleted"], line["deleted_again"]) == (3_000, 2_100, 0)


def test_sweep_profile_bench_runs() -> None:
    """`bench/sweep_profile.py` sweeps a store built in SQL alone and says where its CPU went:
    per thread (the loop's among them) and in the read and the slices (no timings checked)."""
    (line,) = _bench_lines("sweep_profile.py", "--workflows", "300")
    assert line["deleted"] == 300 * 7
    assert line["thread_cpu_s"]["MainThread"] > 0
    assert line["stage_calls"]["thin_one"] == 300
    assert line["stage_calls"]["read_histories"] >= 1
    assert len(line["gc_collections"]) == 3


def test_scale_bench_soak_and_queries_run() -> None:
    """`bench/scale.py --soak` prints a size per round (SQLite gives its sweeps' pages back)
    and `--queries` a line of three latencies per size and backend (no timings checked)."""
    soak = _bench_lines("scale.py", "--soak", "2", "--workflows", "200", "--backends", "sqlite")
    assert [line["round"] for line in soak] == [1, 2]
    assert all(line["bytes_reclaimed"] > 0 and line["db_bytes"] > 0 for line in soak)
    lines = _bench_lines("scale.py", "--queries", "100,300", "--calls", "5")
    assert [(line["backend"], line["workflows"]) for line in lines] == [
        ("sqlite", 100),
        ("sqlite", 300),
        ("postgres", 100),
        ("postgres", 300),
    ]
    for line in lines:
        assert {"page_of_50", "get_resume_point", "claim_workflow"} <= line.keys()


def test_status_writer_bench_runs() -> None:
    """`bench/status_writer.py` compares two trees (here the same one) and prints both figures."""
    src = str(ROOT / "src")
    script = str(ROOT / "bench" / "status_writer.py")
    proc = subprocess.run(
        [sys.executable, script, "--base-src", src, "--rounds", "1", "--n", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split()[:2] for line in proc.stdout.splitlines()[2:]]
    assert rows == [["sqlite", "committed"], ["sqlite", "statements"]]


def test_cli_diff_bench_runs(tmp_path: Path) -> None:
    """`bench/cli_diff.py` at 1 MB: one line per store, the same diff printed each run."""
    lines = _bench_lines("cli_diff.py", "--state-mb", "1", "--rounds", "1", "--dir", str(tmp_path))
    assert {(line["version"], line["store"]) for line in lines} == {
        ("branch", "plain"),
        ("branch", "encrypted"),
    }
    assert all(line["median_ms"] > 0 and line["rss_mb"] > 0 for line in lines)
