"""Power cuts at random moments (LazyFS): no acknowledged checkpoint is lost or corrupted.

The ``-effects`` configurations also record an effect per step (acknowledged before the
step's checkpoint): no acknowledged effect record is lost either (targets.py).

Each configuration runs a writer process (one task cycling a small, a small-with-retention
and a large incremental workflow, or 50 concurrent tasks with a workflow each), cuts the
power under it at random moments and checks after every cut that the store opens, that
every acknowledged checkpoint retention allows is there and verifies, that no workflow's
latest is behind its last acknowledged step and that every visible record is whole (see
harness.py). ``AIOCHECKPOINT_POWERLOSS_CUTS=N`` sets every configuration's cut count;
``AIOCHECKPOINT_SOAK=1`` multiplies it by ten; ``AIOCHECKPOINT_POWERLOSS_JOBS`` (2) is how
many configurations run side by side.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .conftest import RESULTS
from .harness import Config, Result, Trials

TARGET = "tests.powerloss.targets:Aiocheckpoint"
#: Each step also records an effect, acknowledged before its checkpoint (docs/effects.md).
EFFECTS = "tests.powerloss.targets:AiocheckpointEffects"
#: Garbage collection every 0.2 s (and the writer calls it every 0.1 s); blobs older than
#: 2 s are fair game, so the blobs that retention frees in one run go in the next ones.
FILE_OPTIONS: dict[str, Any] = {"gc_interval": 0.2, "blob_grace_seconds": 2.0}


def _cuts(default: int) -> int:
    named = os.environ.get("AIOCHECKPOINT_POWERLOSS_CUTS")
    if named:
        return int(named)
    return default * 10 if os.environ.get("AIOCHECKPOINT_SOAK") == "1" else default


def _file(name: str, tasks: int, use_syncfs: bool, cuts: int, target: str = TARGET) -> Config:
    storage = {**FILE_OPTIONS, "use_syncfs": use_syncfs}
    return Config(name, target, {"backend": "file", "storage": storage}, tasks, _cuts(cuts))


def _sqlite(name: str, tasks: int, cuts: int, target: str = TARGET) -> Config:
    return Config(name, target, {"backend": "sqlite"}, tasks, _cuts(cuts))


#: The longest first: they start first, and each test waits only for its own.
CONFIGS: dict[str, Config] = {
    "sqlite-50": _sqlite("sqlite, 50 writers", 50, 100),
    "file-50-nosyncfs": _file("file, 50 writers, use_syncfs=False", 50, False, 70),
    "file-50": _file("file, 50 writers, group commit on", 50, True, 70),
    "sqlite-1": _sqlite("sqlite, 1 writer", 1, 100),
    "file-1-nosyncfs": _file("file, 1 writer, use_syncfs=False", 1, False, 70),
    "file-1": _file("file, 1 writer, group commit on", 1, True, 70),
    # Effect records in the same group commits as checkpoints: acknowledged ones survive.
    "file-50-effects": _file("file, 50 writers, effects, group commit", 50, True, 30, EFFECTS),
    "file-50-effects-nosyncfs": _file(
        "file, 50 writers, effects, use_syncfs=False", 50, False, 20, EFFECTS
    ),
    "sqlite-50-effects": _sqlite("sqlite, 50 writers, effects", 50, 20, EFFECTS),
}
#: Configurations run side by side (each has its own LazyFS): a trial mostly waits.
JOBS = int(os.environ.get("AIOCHECKPOINT_POWERLOSS_JOBS", "2"))
#: The trials of every configuration start together (see ``trials``): under pytest-xdist
#: they all run on one worker, queued first.
pytestmark = [pytest.mark.xdist_group("powerloss"), pytest.mark.root]


def _selected(session: pytest.Session) -> list[str]:
    """The configurations whose tests this session runs, in the order of CONFIGS."""
    keys = {
        item.callspec.params["key"]
        for item in session.items
        if isinstance(item, pytest.Function) and item.originalname == _TEST
    }
    return [key for key in CONFIGS if key in keys]


@pytest.fixture(scope="session")
def trials(
    request: pytest.FixtureRequest, lazyfs_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Result]]]:
    """Every selected configuration's trials, started at once, ``JOBS`` at a time."""
    with ThreadPoolExecutor(JOBS, thread_name_prefix="powerloss") as pool:
        futures = {
            key: pool.submit(
                Trials(CONFIGS[key], lazyfs_binary, tmp_path_factory.mktemp(key), 20261201).run,
                stop_at_failure=True,
            )
            for key in _selected(request.session)
        }
        yield futures
        for future in futures.values():
            future.cancel()


_TEST = "test_power_cuts_lose_no_acknowledged_checkpoint"


@pytest.mark.parametrize("key", list(CONFIGS))
def test_power_cuts_lose_no_acknowledged_checkpoint(
    key: str, trials: dict[str, Future[Result]]
) -> None:
    """After every cut: the store opens, every acknowledged checkpoint retention allows is
    present and verifies, latest is not behind, and nothing visible is half-written."""
    config, result = CONFIGS[key], trials[key].result()
    RESULTS.append(result)
    assert result.failures == 0, "\n".join([result.summary(), *result.examples()])
    assert result.cuts >= config.cuts
    # The cuts interrupted writers that had acknowledged work, and the checks looked at it.
    assert result.acknowledged > result.cuts
    assert result.checked > result.cuts
