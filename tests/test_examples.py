import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


def test_there_are_examples() -> None:
    """The examples folder is not empty (so the parametrized test below really runs)."""
    assert any(p.name == "quickstart.py" for p in EXAMPLES)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: Path) -> None:
    """Every example script runs to completion with exit status 0."""
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), "examples print what they do"


def test_quickstart_resumes_without_repeating_steps() -> None:
    """The quickstart's second run resumes at step 2 and each agent's tool runs exactly once."""
    script = Path(__file__).parent.parent / "examples" / "quickstart.py"
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert (
        "first run: interrupted before step 2; tool calls so far: ['planner', 'researcher']" in out
    )
    assert "resuming at step 2" in out
    assert "all tool calls: ['planner', 'researcher', 'analyst', 'writer']" in out
