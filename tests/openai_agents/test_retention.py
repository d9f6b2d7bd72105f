"""Retention through a session: ``max_checkpoints`` keeps the newest batches, and a policy's
``finished_ttl`` deletes a session nobody wrote for that long (its record is finished)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, RetentionPolicy
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession
from tests.backend_support import make_storage


def msg(n: int) -> dict[str, str]:
    return {"role": "user", "content": f"m{n}"}


@pytest.mark.parametrize("backend", ["memory", "file", "sqlite", "postgres"])
async def test_max_checkpoints_keeps_the_newest_batches(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    storage = make_storage(backend, tmp_path, pg_schema)
    async with CheckpointManager(storage, max_checkpoints=3) as manager:
        session = AioCheckpointSession("s", manager)
        for n in range(0, 10, 2):
            await session.add_items([msg(n), msg(n + 1)])  # type: ignore[list-item]
        assert await session.get_items() == [msg(n) for n in range(4, 10)]
        assert await session.pop_item() == msg(9)
        assert await session.get_items(limit=2) == [msg(7), msg(8)]


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_finished_ttl_deletes_an_idle_session(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    policy = RetentionPolicy(finished_ttl=timedelta(days=1))
    storage = make_storage(backend, tmp_path, pg_schema)
    async with CheckpointManager(storage, retention=policy) as manager:
        idle, busy = AioCheckpointSession("idle", manager), AioCheckpointSession("busy", manager)
        await idle.add_items([msg(0)])  # type: ignore[list-item]
        await busy.add_items([msg(1)])  # type: ignore[list-item]
        await manager.sweep()  # written just now: both kept
        assert await idle.get_items() == [msg(0)]
        later = datetime.now(timezone.utc) + timedelta(days=2)
        report = await manager.sweep(now=later)
        assert report.workflows_deleted == {"finished": 2}
        assert await idle.get_items() == []
        await idle.add_items([msg(2)])  # type: ignore[list-item]
        assert await idle.get_items() == [msg(2)]
        record = await manager.get_workflow(idle.workflow_id)
        assert record is not None
        assert record.status == "finished"
