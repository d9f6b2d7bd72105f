"""Savers over every aiocheckpoint backend, for the LangGraph tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import InMemoryCheckpointStorage
from aiocheckpoint.integrations.langgraph import AioCheckpointSaver
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN, drop_schema, new_schema_name

BACKENDS = ["memory", "file", "sqlite", "postgres"]

SaverFactory = Callable[..., Any]


def open_backend(kind: str, root: Path, schema: str) -> Any:
    """A fresh store of ``kind`` (the same store again for the same ``root``/``schema``)."""
    if kind == "memory":
        return InMemoryCheckpointStorage()
    if kind == "file":
        return FileCheckpointStorage(root / "store")
    if kind == "sqlite":
        return SQLiteCheckpointStorage(root / "lg.db")
    return PostgresCheckpointStorage(DSN, schema=schema, max_size=4)


def backend_url(kind: str, root: Path, schema: str) -> str:
    """The URL of the store :func:`open_backend` opens."""
    return {
        "memory": "memory://",
        "file": f"file://{root / 'store'}",
        "sqlite": f"sqlite://{root / 'lg.db'}",
        "postgres": f"{DSN}?schema={schema}",
    }[kind]


@pytest.fixture(params=BACKENDS)
async def saver_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SaverFactory]:
    """Opens savers over one fresh store of each backend; all closed after the test."""
    kind: str = request.param
    schema = new_schema_name()
    opened: list[AioCheckpointSaver] = []

    @asynccontextmanager
    async def factory(**options: Any) -> AsyncIterator[AioCheckpointSaver]:
        storage = open_backend(kind, tmp_path, schema)
        saver = AioCheckpointSaver(storage, close_storage=True, **options)
        opened.append(saver)
        async with saver:
            yield saver

    yield factory
    if kind == "postgres":
        await drop_schema(schema)
