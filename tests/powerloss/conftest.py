"""The power-loss suite's LazyFS (built once per session) and its report at the end of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import Result
from .lazyfs import build

#: What every configuration's trials did and found, printed at the end of the run.
RESULTS: list[Result] = []


@pytest.fixture(scope="session")
def lazyfs_binary() -> Path:
    """The LazyFS binary. A failed build fails the tests that need it: they never skip."""
    return build()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print each configuration's cuts, acknowledged and lost checkpoints."""
    for result in RESULTS:
        terminalreporter.write_line(f"power loss: {result.summary()}")
        if result.lazyfs:
            terminalreporter.write_line(f"    LazyFS failures: {result.lazyfs_failures()}")
