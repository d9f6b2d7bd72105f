"""The backend registry of the reliability suite: every test runs on every entry.

Adding a backend is one :class:`Backend` entry in :data:`BACKENDS`. An entry is never
skipped: a backend whose module is not importable on this branch is simply not listed.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import CheckpointManager, CheckpointStorage, open_storage
from tests import _summary

from ._support import TALLY


def _store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def _no_options(root: Path) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Backend:
    """One storage backend under test.

    ``url(root)`` and ``options(root)`` name a store kept under ``store_dir(root)``; child
    processes open it with ``open_storage(url, **options)``. ``factory(root, **options)``
    opens it in this process, by default the same way. ``local`` entries keep all their
    data under ``store_dir`` (the real-disk fault tests need that). ``durable`` entries
    survive a process crash and run the crash and reopen tests; ``crash_kills`` is how
    many SIGKILLs the crash test deals. ``temp_globs`` match the backend's in-progress
    files (relative to the store dir): none may remain after a cancelled or crashed write
    once the store is closed or reopened. ``reads_when_read_only`` is False for a backend
    that cannot even read from a read-only mount (SQLite in WAL mode needs to create its
    ``-shm`` file); its writes must still fail with a typed error there.
    """

    name: str
    url: Callable[[Path], str]
    durable: bool
    factory: Callable[..., CheckpointStorage] | None = None
    options: Callable[[Path], dict[str, Any]] = field(default=_no_options)
    local: bool = True
    store_dir: Callable[[Path], Path] = field(default=_store_dir)
    crash_kills: int = 100
    temp_globs: tuple[str, ...] = ()
    reads_when_read_only: bool = True

    def open(self, root: Path, **options: Any) -> CheckpointStorage:
        """Open (lazily) the store under ``root``."""
        if self.factory is not None:
            return self.factory(root, **options)
        return open_storage(self.url(root), **{**self.options(root), **options})

    def temp_files(self, root: Path) -> list[str]:
        """In-progress files left in the store under ``root`` (relative paths)."""
        store = self.store_dir(root)
        found = {p for pattern in self.temp_globs for p in store.glob(pattern)}
        return sorted(str(p.relative_to(store)) for p in found)


def _sqlite_factory(root: Path, **options: Any) -> CheckpointStorage:
    _store_dir(root).mkdir(parents=True, exist_ok=True)
    return open_storage(f"sqlite:{_store_dir(root) / 'checkpoints.db'}", **options)


PG_DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PG_SCHEMA_PREFIX = "aiocp_rel_"


#: The schemas this process named, dropped when the session ends (only these: another test
#: run may be using the same database at the same time).
_PG_SCHEMAS: set[str] = set()


def _pg_options(root: Path) -> dict[str, Any]:
    # One schema per store location, so every test gets an empty store.
    schema = PG_SCHEMA_PREFIX + hashlib.sha256(str(root).encode()).hexdigest()[:24]
    _PG_SCHEMAS.add(schema)
    return {"schema": schema}


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
    Backend("postgres", url=lambda root: PG_DSN, durable=True, local=False, options=_pg_options),
)
DURABLE: tuple[Backend, ...] = tuple(b for b in BACKENDS if b.durable)
LOCAL_DURABLE: tuple[Backend, ...] = tuple(b for b in DURABLE if b.local)


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


@pytest.fixture(params=LOCAL_DURABLE, ids=lambda b: b.name)
def disk_backend(request: pytest.FixtureRequest) -> Backend:
    """Each registered durable backend that keeps its data on the local disk."""
    entry: Backend = request.param
    return entry


async def _drop_pg_schemas() -> None:
    import asyncpg

    con = await asyncpg.connect(PG_DSN)
    try:
        for name in sorted(_PG_SCHEMAS):
            await con.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await con.close()


@pytest.fixture(scope="session", autouse=True)
def _postgres_schemas() -> Iterator[None]:
    """Drop the per-test PostgreSQL schemas of this suite when the session ends."""
    yield
    if _PG_SCHEMAS:
        asyncio.run(_drop_pg_schemas())


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Publish what the suite did: kills dealt, faults injected, writers cancelled."""
    _summary.publish(session.config, counts={"reliability": TALLY})
