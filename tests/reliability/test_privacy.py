"""Privacy: everything a local durable backend creates is readable by its owner only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager

from .conftest import Backend


@pytest.mark.parametrize("umask", [0o022, 0o000])
async def test_store_files_are_private_whatever_the_umask(
    disk_backend: Backend, tmp_path: Path, umask: int
) -> None:
    """Files and directories the store creates grant no group or other permission, even with a
    permissive umask.
    """
    old = os.umask(umask)
    try:
        async with disk_backend.open(tmp_path) as storage:
            manager = CheckpointManager(storage, max_checkpoints=2)
            for step in range(3):
                await manager.create_checkpoint("secret/wf", step, "a", "completed", {"k": "v"})
            store = disk_backend.store_dir(tmp_path)
            created = list(store.rglob("*"))
            if not disk_backend.factory:  # the store directory itself is the backend's own
                created.append(store)
            assert created
            loose = {
                str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
                for p in created
                if stat.S_IMODE(p.stat().st_mode) & 0o077
            }
            assert loose == {}
    finally:
        os.umask(old)
