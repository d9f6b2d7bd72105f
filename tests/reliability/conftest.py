"""The backend registry of the reliability suite: every test runs on every entry.

Adding a backend is one :class:`Backend` entry in :data:`BACKENDS`. An entry is never
skipped: a backend whose module is not importable on this branch is simply not listed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import CheckpointManager, CheckpointStorage, open_storage

from ._support import TALLY


def _store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@dataclass(frozen=True)
class Backend:
    """One storage backend under test.

    ``url(root)`` names a store kept under ``store_dir(root)`` (child processes open it);
    ``factory(root, **options)`` opens it in this process, by default through
    :func:`aiocheckpoint.open_storage`. ``durable`` entries survive a process crash and run
    the crash and reopen tests; ``crash_kills`` is how many SIGKILLs the crash test deals.
    """

    name: str
    url: Callable[[Path], str]
    durable: bool
    factory: Callable[..., CheckpointStorage] | None = None
    store_dir: Callable[[Path], Path] = field(default=_store_dir)
    crash_kills: int = 100
    temp_globs: tuple[str, ...] = ()
    reads_when_read_only: bool = True

    def open(self, root: Path, **options: Any) -> CheckpointStorage:
        """Open (lazily) the store under ``root``."""
        if self.factory is not None:
            return self.factory(root, **options)
        return open_storage(self.url(root), **options)

    def temp_files(self, root: Path) -> list[str]:
        """In-progress files left in the store under ``root`` (relative paths)."""
        store = self.store_dir(root)
        found = {p for pattern in self.temp_globs for p in store.glob(pattern)}
        return sorted(str(p.relative_to(store)) for p in found)


def _sqlite_factory(root: Path, **options: Any) -> CheckpointStorage:
    _store_dir(root).mkdir(parents=True, exist_ok=True)
    return open_storage(f"sqlite:{_store_dir(root) / 'checkpoints.db'}", **options)


#: Every backend of this branch. After merging a backend's branch, add its entry here.
BACKENDS: tuple[Backend, ...] = (
    Backend("memory", url=lambda root: "memory://", durable=False),
    Backend(
        "file",
        url=lambda root: f"file:{_store_dir(root)}",
        durable=True,
        temp_globs=("**/.tmp-*", "**/.new-*", "**/.del-*"),
    ),
    Backend(
        "sqlite",
        url=lambda root: f"sqlite:{_store_dir(root) / 'checkpoints.db'}",
        durable=True,
        factory=_sqlite_factory,
        reads_when_read_only=False,
    ),
)
DURABLE: tuple[Backend, ...] = tuple(b for b in BACKENDS if b.durable)


@pytest.fixture(params=BACKENDS, ids=lambda b: b.name)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each registered backend in turn."""
    entry: Backend = request.param
    return entry


@pytest.fixture(params=DURABLE, ids=lambda b: b.name)
def durable_backend(request: pytest.FixtureRequest) -> Backend:
    """Each registered durable backend in turn."""
    entry: Backend = request.param
    return entry


@pytest.fixture
async def storage(backend: Backend, tmp_path: Path) -> AsyncIterator[CheckpointStorage]:
    """A fresh, open store of the current backend under ``tmp_path``."""
    store = backend.open(tmp_path)
    yield store
    await store.close()


@pytest.fixture
def manager(storage: CheckpointStorage) -> CheckpointManager:
    """A manager over :func:`storage` (closed with it)."""
    return CheckpointManager(storage)


Reopen = Callable[[], Awaitable[CheckpointStorage]]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the reliability suite did: kills dealt, faults injected, writers cancelled."""
    if TALLY:
        counts = ", ".join(f"{name}: {n}" for name, n in sorted(TALLY.items()))
        terminalreporter.write_line(f"reliability: {counts}")
