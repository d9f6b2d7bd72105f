"""The power-loss suite's LazyFS (built once per session) and its report at the end of the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import _summary

from .harness import AUDITED, Result
from .lazyfs import build

#: What every configuration's trials did and found, printed at the end of the run.
RESULTS: list[Result] = []


@pytest.fixture(scope="session")
def lazyfs_binary() -> Path:
    """The LazyFS binary. A failed build fails the tests that need it: they never skip."""
    return build()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Publish each configuration's cuts, acknowledged and lost checkpoints (tests/_summary.py)."""
    lines = []
    for result in RESULTS:
        lines.append(f"power loss: {result.summary()}")
        if result.lazyfs:
            lines.append(f"    LazyFS failures: {result.lazyfs_failures()}")
        # What the writer's audit caught LazyFS doing (rare), with its evidence in full.
        lines += [f"    {why}" for why in result.lazyfs if why.startswith(AUDITED)]
    _summary.publish(session.config, lines)
