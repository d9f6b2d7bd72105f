"""Logging: one ``aiocheckpoint.*`` hierarchy, quiet in normal operation, no expected tracebacks."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

import aiocheckpoint
from aiocheckpoint import CheckpointManager, LeaseLostError, ResumableWorkflow
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.sqlite.connections import BusyRetry
from tests.backend_support import any_storage, pg_schema

__all__ = ["any_storage", "pg_schema"]


def test_every_module_logger_is_named_after_its_module() -> None:
    found = {}
    for module in pkgutil.walk_packages(aiocheckpoint.__path__, "aiocheckpoint."):
        loaded = importlib.import_module(module.name)
        logger = getattr(loaded, "logger", None)
        if isinstance(logger, logging.Logger):
            found[module.name] = logger.name
    assert len(found) >= 10
    assert found == {name: name for name in found}
    assert all(name.startswith("aiocheckpoint.") for name in found)


async def test_a_normal_run_logs_nothing_at_warning_or_above(
    any_storage: CheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiocheckpoint")
    manager = CheckpointManager(any_storage, max_checkpoints=2)
    owner = "runner" if manager.supports_workflow_records() else None
    for run in range(2):  # the second run resumes
        async with ResumableWorkflow("wf", manager, lease_owner=owner) as wf:
            for step in range(3 * run, 3 * run + 3):
                async with wf.step(step, agent_id="agent"):
                    wf.state.set("big", [step] * 5000)  # incremental where supported
                    await wf.effect(None, anyio.sleep, 0)
    assert (await manager.get_latest_checkpoint("wf")) is not None
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []


async def test_an_effect_failing_after_its_lease_was_lost_logs_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The effect's failure cannot be recorded (fenced out): one WARNING line in all."""
    manager = CheckpointManager()
    stale = await manager.acquire_lease("wf", "runner-a", ttl=0.1)

    async def call_after_takeover() -> None:
        await anyio.sleep(0.2)
        await manager.acquire_lease("wf", "runner-b", ttl=30)
        raise ValueError("the remote call failed")

    caplog.set_level(logging.DEBUG, logger="aiocheckpoint")
    with pytest.raises((ValueError, LeaseLostError)):
        async with ResumableWorkflow("wf", manager, lease=stale, lease_ttl=600) as wf:
            async with wf.step(0, agent_id="a"):
                await wf.effect("call", call_after_takeover)
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == 1
    assert "lease lost" in records[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)
    assert [e.in_doubt for e in await manager.get_effects("wf", 0)] == [True]


def test_a_busy_sqlite_database_is_retried_with_debug_lines_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another connection holds the write lock for a moment: the retry waits it out."""
    caplog.set_level(logging.DEBUG, logger="aiocheckpoint")
    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    writer = sqlite3.connect(path, isolation_level=None, timeout=0)
    release = threading.Timer(0.05, holder.execute, ["COMMIT"])
    release.start()
    try:
        BusyRetry(20)(lambda: writer.execute("INSERT INTO t VALUES (1)"))
    finally:
        release.join()
        holder.close()
    assert writer.execute("SELECT count(*) FROM t").fetchone() == (1,)
    writer.close()
    retries = [r for r in caplog.records if "busy" in r.getMessage()]
    assert retries
    assert {r.name for r in retries} == {"aiocheckpoint.storage.sqlite.connections"}
    assert {r.levelno for r in retries} == {logging.DEBUG}
    assert all(r.exc_info is None for r in retries)
