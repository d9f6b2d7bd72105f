"""One storage of each backend, for tests that run on all of them (or those with records)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN, pg_schema

__all__ = [
    "RecordsOnly",
    "any_storage",
    "blob_storage",
    "leasing_storage",
    "make_storage",
    "pg_schema",
]

ALL = ["memory", "file", "sqlite", "postgres"]
#: The backends that keep workflow records and leases.
WITH_RECORDS = ["memory", "sqlite", "postgres"]
#: The backends that keep content-addressed blobs in files or tables (the memory store
#: keeps them too, in dicts: ``blob_storage`` gives all four).
WITH_BLOBS = ["file", "sqlite", "postgres"]


def make_storage(kind: str, tmp_path: Path, pg_schema: str, **options: Any) -> CheckpointStorage:
    """A new storage object of backend ``kind``; every call for a kind opens the same store."""
    if kind == "memory":
        return InMemoryCheckpointStorage(**options)
    if kind == "file":
        return FileCheckpointStorage(tmp_path / "store", **options)
    if kind == "sqlite":
        return SQLiteCheckpointStorage(tmp_path / "store.db", **options)
    return PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=2, **options)


def storage_fixture(kinds: list[str]) -> Any:
    """A pytest fixture giving an open storage of each backend in ``kinds``."""

    @pytest.fixture(params=kinds)
    async def fixture(
        request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
    ) -> AsyncIterator[CheckpointStorage]:
        async with make_storage(request.param, tmp_path, pg_schema) as store:
            yield store

    return fixture


any_storage = storage_fixture(ALL)
leasing_storage = storage_fixture(WITH_RECORDS)
blob_storage = storage_fixture(["memory", *WITH_BLOBS])


class RecordsOnly:
    """A :class:`CheckpointStorage` that keeps no blobs: the memory store's records alone."""

    def __init__(self) -> None:
        self._store = InMemoryCheckpointStorage()
        self.save = self._store.save
        self.load = self._store.load
        self.scan = self._store.scan
        self.exists = self._store.exists
        self.delete = self._store.delete
        self.list_workflows = self._store.list_workflows
        self.close = self._store.close

    async def __aenter__(self) -> RecordsOnly:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
