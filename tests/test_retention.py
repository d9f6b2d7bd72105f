"""Retention and TTL beyond the conformance suite: intervals, bytes reclaimed, processes, CLI.

The generic behaviour (thinning, TTLs, leases, racing writers, forks) runs on every backend
in :mod:`aiocheckpoint.testing`; this module checks what needs a backend's insides (the
blobs it stores, the bytes on disk), separate processes, the background sweeper and the
command line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from aiocheckpoint import (
    CheckpointManager,
    RetentionPolicy,
    SQLiteCheckpointStorage,
    StorageClosedError,
    UnsupportedOperationError,
    WorkflowStatus,
)
from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.models import Checkpoint
from aiocheckpoint.storage.base import BlobCheckpointStorage, CheckpointStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from tests.backend_support import make_storage, pg_schema
from tests.pg_support import DSN
from tests.test_cli import cli
from tests.test_file_blobs import blob_files

__all__ = ["pg_schema"]

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def big_state(seed: int, docs: int = 40) -> dict[str, Any]:
    """~40 KB that shares nothing with another seed's state."""
    return {"docs": [f"{seed} doc {i} " + f"seed {seed} text " * 60 for i in range(docs)]}


async def steps(storage: CheckpointStorage, workflow_id: str) -> list[int]:
    return [r.step for r in await storage.scan(workflow_id)]


async def test_keep_interval_keeps_the_newest_checkpoint_of_each_interval() -> None:
    """Beyond the newest 2, one checkpoint per hour of checkpoint time stays: the newest."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(
        storage, retention=RetentionPolicy(keep_last=2, keep_interval=timedelta(hours=1))
    )
    template = await manager.create_checkpoint("wf", 0, "a", "running", {"k": 0})
    # Steps 0-9, 20 minutes apart: hours 0 (steps 0-2), 1 (3-5), 2 (6-8) and 3 (9).
    for step in range(10):
        moment = T0 + timedelta(minutes=20 * step)
        record = template.model_copy(update={"step": step, "timestamp": moment})
        await storage.save("wf", step, encode_checkpoint(record))
    report = await manager.sweep()
    assert await steps(storage, "wf") == [2, 5, 7, 8, 9]
    assert report.checkpoints_deleted == 5


async def test_unreadable_records_are_kept_and_counted() -> None:
    """A record whose fields cannot be read is never judged, so never deleted."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage, retention=RetentionPolicy(keep_last=1))
    for step in range(3):
        await manager.create_checkpoint("wf", step, "a", "running", {"k": step})
    await storage.save("wf", 0, b"not a record")
    report = await manager.sweep()
    assert await steps(storage, "wf") == [0, 2]
    assert (report.skipped_corrupted, report.checkpoints_deleted) == (1, 1)


async def test_ttl_on_a_store_without_records_is_unsupported(tmp_path: Path) -> None:
    """The file store keeps no workflow records: a TTL sweep says so and deletes nothing."""
    async with CheckpointManager(
        FileCheckpointStorage(tmp_path / "s"),
        retention=RetentionPolicy(keep_last=1, finished_ttl=timedelta(days=1)),
    ) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", {"k": 1})
        await manager.create_checkpoint("wf", 1, "a", "running", {"k": 1})
        with pytest.raises(UnsupportedOperationError):
            await manager.sweep()
        assert await steps(manager.storage, "wf") == [0, 1]


def tree_hashes(storage: BlobCheckpointStorage, checkpoints: Iterable[Checkpoint]) -> set[bytes]:
    """Every blob hash the checkpoints' trees reference (the split is deterministic)."""
    out: set[bytes] = set()
    for checkpoint in checkpoints:
        out |= set(encode_checkpoint_v2(checkpoint, storage.blob_params)[1].blobs)
    return out


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def test_file_store_gc_after_a_sweep_reclaims_the_space(tmp_path: Path) -> None:
    """Thinning 12 large checkpoints to 2, then GC: the bytes drop, no blob is orphaned."""
    root = tmp_path / "store"
    storage = FileCheckpointStorage(root, blob_grace_seconds=1e-9)
    async with CheckpointManager(storage, retention=RetentionPolicy(keep_last=2)) as manager:
        for step in range(12):
            await manager.create_checkpoint("wf", step, "a", "running", big_state(step))
        before = dir_bytes(root)
        report = await manager.sweep()
        after = dir_bytes(root)
        kept = await manager.list_checkpoints("wf")
        assert [c.step for c in kept] == [10, 11]
        assert report.checkpoints_deleted == 10 and report.blobs_freed > 0
        # 12 states' blobs before, 2 after: ~1/6 of the bytes, plus fixed overhead.
        assert after < before * 0.35, (before, after)
        assert blob_files(root) == {h.hex() for h in tree_hashes(storage, kept)}


async def stored_blob_bytes(kind: str, storage: CheckpointStorage, schema: str) -> dict[bytes, int]:
    """Each stored blob's hash and size, read from the database's blobs table."""
    if kind == "sqlite":
        assert isinstance(storage, SQLiteCheckpointStorage)
        path = str(storage.path)

        def read() -> dict[bytes, int]:
            import sqlite3

            with sqlite3.connect(path) as con:
                return dict(con.execute("SELECT hash, length(data) FROM blobs").fetchall())

        return await anyio.to_thread.run_sync(read)
    con = await asyncpg.connect(DSN)
    try:
        rows = await con.fetch(f'SELECT hash, octet_length(data) FROM "{schema}".blobs')
        return {bytes(r[0]): r[1] for r in rows}
    finally:
        await con.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_ttl_sweep_frees_what_only_the_swept_held(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """Finished workflows go by TTL with the blobs they alone held; a fork keeps its own.

    The blob bytes before and after are those of the store's blobs table; what stays is
    exactly what the remaining checkpoints reference (no orphan).
    """
    storage = make_storage(kind, tmp_path, pg_schema)
    policy = RetentionPolicy(finished_ttl=timedelta(days=7))
    async with CheckpointManager(storage, retention=policy) as manager:
        assert isinstance(storage, BlobCheckpointStorage)
        for n in range(4):
            for step in range(3):
                await manager.create_checkpoint(
                    f"old{n}", step, "a", "running", big_state(10 * n + step)
                )
            await manager.mark_workflow(f"old{n}", WorkflowStatus.FINISHED)
        await manager.fork_workflow("old0", 1, "fork")
        await manager.create_checkpoint("live", 0, "a", "running", big_state(99))
        before = sum((await stored_blob_bytes(kind, storage, pg_schema)).values())
        report = await manager.sweep(now=datetime.now(timezone.utc) + timedelta(days=8))
        stored = await stored_blob_bytes(kind, storage, pg_schema)
        after = sum(stored.values())
        assert report.workflows_deleted == {"finished": 4}
        assert await manager.list_workflows() == ["fork", "live"]
        kept = [c for w in ("fork", "live") for c in await manager.list_checkpoints(w)]
        assert [c.state_snapshot.data for c in kept[:2]] == [big_state(0), big_state(1)]
        assert set(stored) == tree_hashes(storage, kept)
        # 12 states before (plus the fork's 2, shared), 3 after.
        assert after < before * 0.35, (before, after)


SWEEP_CHILD = """
import asyncio, json, sys
from datetime import datetime, timedelta, timezone
from aiocheckpoint import CheckpointManager, RetentionPolicy, open_storage

async def main():
    policy = RetentionPolicy(finished_ttl=timedelta(hours=1), batch_size=5)
    async with CheckpointManager(open_storage(sys.argv[1]), retention=policy) as manager:
        later = datetime.now(timezone.utc) + timedelta(hours=2)
        print(json.dumps((await manager.sweep(now=later)).as_dict()))

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_two_processes_sweeping_delete_each_workflow_once(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """Two sweeper processes on one store: every expired workflow is deleted, once."""
    storage = make_storage(kind, tmp_path, pg_schema)
    url = f"sqlite:{tmp_path / 'store.db'}" if kind == "sqlite" else f"{DSN}?schema={pg_schema}"
    async with CheckpointManager(storage) as manager:
        for n in range(40):
            await manager.create_checkpoint(f"wf{n:02}", 0, "a", "completed", {"n": n})
            await manager.mark_workflow(f"wf{n:02}", WorkflowStatus.FINISHED)
        await manager.create_checkpoint("live", 0, "a", "running", {"n": -1})
    outs: list[str] = []

    async def sweeper() -> None:
        done = await anyio.run_process([sys.executable, "-c", SWEEP_CHILD, url])
        outs.append(done.stdout.decode())

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            group.start_soon(sweeper)
            group.start_soon(sweeper)
    deleted = [json.loads(out)["workflows_deleted"].get("finished", 0) for out in outs]
    assert sum(deleted) == 40
    async with CheckpointManager(make_storage(kind, tmp_path, pg_schema)) as manager:
        assert await manager.list_workflows() == ["live"]


async def test_background_sweeping_thins_and_stops_on_close() -> None:
    """A manager's background sweeper thins as writes come in, and stops when it closes."""
    manager = CheckpointManager(retention=RetentionPolicy(keep_last=2, keep_every=100))
    with anyio.fail_after(20):
        async with manager.sweeping(every=timedelta(milliseconds=20)):
            for step in range(6):
                await manager.create_checkpoint("wf", step, "a", "running", {"n": step})
            for _ in range(500):  # the sweeper runs every 20 ms
                if await steps(manager.storage, "wf") == [0, 4, 5]:
                    break
                await anyio.sleep(0.02)
            assert await steps(manager.storage, "wf") == [0, 4, 5]
            await manager.close()
            await anyio.sleep(0.1)  # the sweeper stopped; the block itself goes on
            reached = True
    assert reached
    with pytest.raises(StorageClosedError):
        await manager.sweep()


async def test_sweeping_refuses_bad_intervals_and_policyless_managers() -> None:
    """sweeping() needs a policy and a positive interval."""
    from aiocheckpoint import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        async with CheckpointManager().sweeping():
            pass
    managed = CheckpointManager(retention=RetentionPolicy(keep_last=1))
    with pytest.raises(InvalidArgumentError):
        async with managed.sweeping(every=timedelta(0)):
            pass


async def test_cli_sweep_dry_run_then_for_real(tmp_path: Path) -> None:
    """``aiocheckpoint sweep``: a dry run reports and keeps; the real one deletes."""
    url = f"sqlite:{tmp_path / 'store.db'}"
    async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "store.db")) as manager:
        for step in range(10):
            await manager.create_checkpoint("wf", step, "a", "running", {"n": step})
    dry = cli("sweep", url, "--keep-last", "3", "--keep-every", "5", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    assert dry.json()["checkpoints_deleted"] == 5  # type: ignore[index]
    text = cli("sweep", url, "--keep-last", "3", "--keep-every", "5")
    assert text.code == 0, text.err
    assert text.out.startswith("deleted 0 workflows (none) and 5 checkpoints")
    async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "store.db")) as manager:
        assert await steps(manager.storage, "wf") == [0, 5, 7, 8, 9]


async def test_cli_sweep_reports_the_effect_records_it_dropped(tmp_path: Path) -> None:
    """The summary line and the JSON count the orphan effect records a thinning dropped."""
    url = f"sqlite:{tmp_path / 'store.db'}"
    storage = SQLiteCheckpointStorage(tmp_path / "store.db")
    async with CheckpointManager(storage) as manager:
        for step in range(2, 6):
            await manager.create_checkpoint("wf", step, "a", "running", {"n": step})
        await storage.put_effect("wf", 1, "send", b"r", in_doubt=False)  # no checkpoint
        await storage.put_effect("wf", 6, "send", b"r", in_doubt=True)  # the running step
    dry = cli("sweep", url, "--keep-last", "2", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    assert dry.json()["effects_deleted"] == 0  # type: ignore[index]
    text = cli("sweep", url, "--keep-last", "2")
    assert text.code == 0, text.err
    assert "2 checkpoints" in text.out and "; dropped 1 effect records" in text.out
    async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "store.db")) as manager:
        assert await manager.storage.load_effects("wf", 1) == []  # type: ignore[attr-defined]
        assert len(await manager.storage.load_effects("wf", 6)) == 1  # type: ignore[attr-defined]


async def test_cli_sweep_refuses_a_sweep_without_rules_and_bad_durations(
    tmp_path: Path,
) -> None:
    """No rule, or a duration that is not one, is a usage error of one line."""
    url = f"sqlite:{tmp_path / 'store.db'}"
    async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "store.db")) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", {"n": 0})
    for args in ((), ("--finished-ttl", "30 days"), ("--keep-every", "2")):
        result = cli("sweep", url, *args)
        assert result.code == 2, (args, result.err)
        result.error_line()


async def test_a_failing_background_sweep_is_logged_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep that fails (a TTL on a store without records) logs a warning, then tries again."""
    policy = RetentionPolicy(finished_ttl=timedelta(days=1))
    async with CheckpointManager(FileCheckpointStorage(tmp_path / "s"), retention=policy) as m:
        with anyio.fail_after(20):
            async with m.sweeping(every=timedelta(milliseconds=10)):
                for _ in range(500):
                    if len(caplog.records) >= 2:
                        break
                    await anyio.sleep(0.02)
    failures = [r for r in caplog.records if "background sweep failed" in r.getMessage()]
    assert len(failures) >= 2 and all(r.exc_info is None for r in failures)


async def test_a_record_the_storage_refuses_is_kept_and_thinning_goes_on(tmp_path: Path) -> None:
    """A record over the store's size limit is kept; the steps around it are still judged."""
    path = tmp_path / "store.db"
    async with CheckpointManager(SQLiteCheckpointStorage(path), incremental=False) as manager:
        for step in range(8):
            big = step == 3
            await manager.create_checkpoint("wf", step, "a", "running", {"x": "y" * (5000 * big)})
    policy = RetentionPolicy(keep_last=2, keep_terminal=False, batch_size=2)
    storage = SQLiteCheckpointStorage(path, max_record_bytes=2000)
    async with CheckpointManager(storage, retention=policy) as manager:
        report = await manager.sweep()
    assert (report.checkpoints_deleted, report.skipped_corrupted) == (5, 1)
    async with SQLiteCheckpointStorage(path) as reopened:
        assert await steps(reopened, "wf") == [3, 6, 7]
