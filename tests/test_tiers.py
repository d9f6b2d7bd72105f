"""The test tiers of tests/conftest.py: a plain ``pytest`` runs the fast tier and says what it
left out, ``-m`` picks a tier, a named file runs in full, and a test cannot sit in two tiers
or need root outside the root tier. Each case runs a real pytest over a small suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SUITE = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.root
def test_root():
    pass
"""

INI = """
[pytest]
asyncio_default_fixture_loop_scope = function
markers =
    slow: s
    root: r
"""

OTHER = """
import pytest

def test_fast_too():
    pass

@pytest.mark.slow
def test_slow_too():
    pass
"""


def run(tmp_path: Path, *args: str, **files: str) -> subprocess.CompletedProcess[str]:
    """pytest with the suite's hooks (tests/conftest.py) over ``files`` in ``tmp_path``."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "pytest.ini").write_text(INI)
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
            "PYTHONPATH": str(ROOT),
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def outcome(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line of pytest's report, e.g. ``2 passed, 3 deselected in 0.01s``."""
    return proc.stdout.strip().splitlines()[-1].split(" in ")[0]


def test_a_plain_run_is_the_fast_tier_and_names_the_others(tmp_path: Path) -> None:
    proc = run(tmp_path, test_a=SUITE, test_b=OTHER)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcome(proc) == "2 passed, 3 deselected"
    assert "2 slow tests: .venv/bin/python -m pytest -q -n 4 -m slow" in proc.stdout
    assert "1 root tests: sudo .venv/bin/python -m pytest -q -n 4 -m root" in proc.stdout


def test_m_picks_a_tier(tmp_path: Path) -> None:
    proc = run(tmp_path, "-m", "slow", test_a=SUITE, test_b=OTHER)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcome(proc) == "2 passed, 3 deselected"
    assert "not run here" not in proc.stdout


def test_a_named_file_runs_in_full_and_root_tests_fail_without_root(tmp_path: Path) -> None:
    proc = run(tmp_path, "test_a.py", "-rE", test_a=SUITE, test_b=OTHER)
    if os.geteuid() == 0:
        assert (proc.returncode, outcome(proc)) == (0, "3 passed"), proc.stdout
    else:
        assert (proc.returncode, outcome(proc)) == (1, "2 passed, 1 error"), proc.stdout
        assert "test_a.py::test_root needs root (the root tier: sudo " in proc.stdout


@pytest.mark.parametrize(
    ("test", "error"),
    [
        (
            "@pytest.mark.slow\n@pytest.mark.root\ndef test_both():\n    pass\n",
            "test_c.py::test_both is marked slow and root: pick one tier",
        ),
        (
            "@pytest.fixture\ndef tiny_disk():\n    pass\n\ndef test_disk(tiny_disk):\n    pass\n",
            "test_c.py::test_disk uses tiny_disk: mark it root",
        ),
    ],
    ids=["two tiers", "a root fixture"],
)
def test_a_test_in_two_tiers_or_needing_root_outside_root_is_refused(
    tmp_path: Path, test: str, error: str
) -> None:
    proc = run(tmp_path, test_c=f"import pytest\n\n{test}")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert error in proc.stderr


def test_the_bytecode_prefix_starts_with_the_installed_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/_pycache.py: a fresh prefix holds the installed packages' compiled bytecode where
    Python looks for it under that prefix, and the seeding happens once."""
    import py_compile

    from tests import _pycache

    installed, prefix = tmp_path / "site-packages", tmp_path / "prefix"
    source = installed / "pkg" / "mod.py"
    source.parent.mkdir(parents=True)
    source.write_text("VALUE = 1\n")
    tag = sys.implementation.cache_tag
    compiled = source.parent / "__pycache__" / f"mod.{tag}.pyc"
    py_compile.compile(str(source), cfile=str(compiled))
    monkeypatch.setattr(_pycache, "_installed_dirs", lambda: {installed})

    _pycache.seed(prefix)
    script = f"import importlib.util; print(importlib.util.cache_from_source({str(source)!r}))"
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)}
    where = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(where).is_relative_to(prefix)
    assert Path(where).read_bytes() == compiled.read_bytes()
    Path(where).unlink()
    _pycache.seed(prefix)
    assert not Path(where).exists()
