"""Shared helpers for the PostgreSQL tests: a real server, one fresh schema per test.

The server is the one at ``AIOCHECKPOINT_PG_DSN`` (default: 127.0.0.1:5432, database
``test``, user ``postgres``). Nothing here skips: if the server is down, tests fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

DSN = os.environ.get("AIOCHECKPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def new_schema_name() -> str:
    """A schema name no other test run uses."""
    return f"aiocp_test_{os.getpid()}_{uuid.uuid4().hex[:12]}"


async def drop_schema(name: str) -> None:
    """Drop a test schema and everything in it."""
    con = await asyncpg.connect(DSN)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await con.close()


async def terminate_backends(admin: asyncpg.Connection, application_name: str) -> int:
    """``pg_terminate_backend`` every server connection of ``application_name``; how many."""
    killed: int = await admin.fetchval(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = $1) t",
        application_name,
    )
    return killed


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    """A unique schema name, dropped (with its tables) after the test."""
    name = new_schema_name()
    yield name
    await drop_schema(name)
