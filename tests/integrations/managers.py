"""Managers over every backend, plain and encrypted, for the framework integrations' tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, Keyring
from tests.backend_support import make_storage
from tests.pg_support import pg_schema

__all__ = ["backend", "keyring", "manager", "pg_schema", "sealed"]

BACKENDS = ["memory", "file", "sqlite", "postgres"]


def keyring() -> Keyring:
    """A fresh keyring of one random key."""
    return Keyring(keys={"k1": os.urandom(32)}, primary="k1")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend's name."""
    kind: str = request.param
    return kind


@pytest.fixture(params=["plain", "sealed"])
def sealed(request: pytest.FixtureRequest) -> bool:
    """Whether the manager encrypts."""
    return bool(request.param == "sealed")


@pytest.fixture
async def manager(
    sealed: bool, backend: str, tmp_path: Path, pg_schema: str
) -> AsyncIterator[CheckpointManager]:
    """A manager over a fresh store of each backend, plain or encrypting."""
    encryption = keyring() if sealed else None
    storage = make_storage(backend, tmp_path, pg_schema)
    async with storage, CheckpointManager(storage, encryption=encryption) as manager:
        yield manager
