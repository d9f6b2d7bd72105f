"""Managers over every backend (plain and encrypted, with the workflows' types), for the
Agent Framework tests."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager
from tests.backend_support import make_storage
from tests.integrations.managers import backend, keyring, pg_schema, sealed

__all__ = ["backend", "manager", "pg_schema", "sealed"]

# Agent Framework needs Python 3.11; on 3.10 the extra installs nothing (pyproject.toml).
if sys.version_info < (3, 11):
    collect_ignore_glob = ["test_*.py"]
else:
    from .workflows import registry

    @pytest.fixture
    async def manager(
        sealed: bool, backend: str, tmp_path: Path, pg_schema: str
    ) -> AsyncIterator[CheckpointManager]:
        """A manager over a fresh store of each backend, plain or encrypting, with the
        workflows' registered types."""
        encryption = keyring() if sealed else None
        storage = make_storage(backend, tmp_path, pg_schema)
        async with (
            storage,
            CheckpointManager(storage, encryption=encryption, types=registry()) as manager,
        ):
            yield manager
