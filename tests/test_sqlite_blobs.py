"""Incremental (blob) checkpoints in SQLiteCheckpointStorage: schema upgrade, reference counts
under failure, corruption, SIGKILL and several writing processes (real files, real processes).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aiocheckpoint
from aiocheckpoint import (
    AgentStatus,
    Checkpoint,
    CheckpointCorruptedError,
    CheckpointManager,
    InvalidArgumentError,
    LeaseLostError,
    StateSnapshot,
)
from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.format.header import record_format_version
from aiocheckpoint.format.tree import node_children
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite.blobs import read_blobs
from aiocheckpoint.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from tests import cli_runner
from tests._sqlite_blob_check import check_refcounts
from tests._sqlite_blob_check import sql as _sql

CHILD = Path(__file__).with_name("_blob_child.py")
SRC = Path(aiocheckpoint.__file__).resolve().parents[1]
KILLS = int(os.environ.get("AIOCHECKPOINT_CRASH_KILLS", "12"))


def big_state(counter: int, docs: int = 60) -> dict[str, Any]:
    return {
        "counter": counter,
        "docs": [{"id": i, "body": f"doc {i} " + "lorem ipsum " * 80} for i in range(docs)],
    }


async def test_store_of_the_previous_schema_opens_migrates_and_reads(tmp_path: Path) -> None:
    """A version-2 database (before blobs) opens, migrates to the blob schema, reads its old
    records, and then stores large states incrementally next to them.
    """
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    assert migrate(conn, MIGRATIONS[:2]) == 2
    written = {}
    for step in range(3):
        cp = Checkpoint(
            workflow_id="wf",
            step=step,
            agent_id="a",
            status=AgentStatus.RUNNING,
            state_snapshot=StateSnapshot(data=big_state(step, docs=5)),
        )
        written[step] = cp
        conn.execute(
            "INSERT INTO checkpoints (workflow_id, step, data) VALUES (?, ?, ?)",
            ("wf", step, encode_checkpoint(cp)),
        )
    conn.close()
    assert _sql(path, "PRAGMA user_version") == [(2,)]

    async with CheckpointManager(SQLiteCheckpointStorage(path), max_checkpoints=3) as manager:
        assert manager.incremental
        for step, cp in written.items():
            assert await manager.get_checkpoint("wf", step) == cp
        await manager.create_checkpoint("wf", 3, "a", "running", big_state(3))
        stored = await manager.storage.load("wf", 3)
        assert stored is not None and record_format_version(stored.data) == 2
        # retention removed step 0, a version-1 record that holds no blob references
        assert [c.step for c in await manager.list_checkpoints("wf")] == [1, 2, 3]
    assert _sql(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    states = check_refcounts(path)
    assert states["wf", 3] == big_state(3)
    assert _sql(path, "SELECT count(*) FROM blobs")[0][0] > 0


async def _two_checkpoints(path: Path) -> CheckpointManager:
    manager = CheckpointManager(SQLiteCheckpointStorage(path))
    await manager.create_checkpoint("wf", 0, "a", "completed", big_state(0, docs=20))
    await manager.create_checkpoint(
        "wf", 1, "a", "running", big_state(1, docs=20) | {"x": "mine " * 600}
    )
    return manager


async def _blob_only_in_step_1(manager: CheckpointManager) -> bytes:
    blobs = []
    for step in (0, 1):
        cp = await manager.get_checkpoint("wf", step)
        storage = manager.storage
        assert isinstance(storage, SQLiteCheckpointStorage)
        blobs.append(set(encode_checkpoint_v2(cp, storage.blob_params)[1].children))
    only = sorted(blobs[1] - blobs[0])
    assert only
    return only[0]


@pytest.mark.parametrize("damage", ["missing", "flipped", "text"])
async def test_damaged_or_missing_blob_is_corruption_and_resume_falls_back(
    tmp_path: Path, damage: str
) -> None:
    """A missing or altered blob row makes its checkpoint raise CheckpointCorruptedError naming
    the workflow and step; resume falls back to the previous one; the damaged checkpoint can
    still be deleted, which leaves exactly the other checkpoint's blobs.
    """
    path = tmp_path / "c.db"
    manager = await _two_checkpoints(path)
    h = await _blob_only_in_step_1(manager)
    if damage == "missing":
        _sql(path, "DELETE FROM blobs WHERE hash = ?", (h,))
    elif damage == "text":  # || makes TEXT of a BLOB: the row no longer holds bytes
        _sql(path, "UPDATE blobs SET data = data || 'x' WHERE hash = ?", (h,))
    else:
        (data,) = _sql(path, "SELECT data FROM blobs WHERE hash = ?", (h,))[0]
        damaged = bytearray(data)
        damaged[-2] ^= 0x20
        _sql(path, "UPDATE blobs SET data = ? WHERE hash = ?", (bytes(damaged), h))
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_latest_checkpoint("wf")
    assert (info.value.workflow_id, info.value.step) == ("wf", 1)
    resume = await manager.get_resume_point("wf")
    assert resume is not None and resume[0] == 1 and resume[1].data == big_state(0, docs=20)
    assert await manager.delete_checkpoints("wf", 1)
    assert _sql(path, "SELECT count(*) FROM blobs WHERE hash = ?", (h,)) == [(0,)]
    assert check_refcounts(path) == {("wf", 0): big_state(0, docs=20)}  # counts exact again
    await manager.close()


async def test_stale_known_and_stale_fence_fail_only_their_caller(tmp_path: Path) -> None:
    """In one group commit: a split that lacks a blob the store does not have (a stale
    ``known``) raises InvalidArgumentError and a save under a stale lease raises
    LeaseLostError; both write nothing, and the other saves of the batch land.
    """
    path = tmp_path / "k.db"
    storage = SQLiteCheckpointStorage(path)
    manager = CheckpointManager(storage)
    base = await manager.create_checkpoint("a", 0, "x", "running", big_state(0))
    stale = await storage.acquire_lease("fenced", "me", 60)
    await storage.acquire_lease("fenced", "me", 60)  # a new token: `stale` is no longer current
    unstored = big_state(99) | {"x": [f"never stored {i} " * 200 for i in range(3)]}
    new = base.model_copy(update={"step": 1, "state_snapshot": StateSnapshot(data=unstored)})
    _record, full = encode_checkpoint_v2(new, storage.blob_params)
    record, partial = encode_checkpoint_v2(new, storage.blob_params, known=list(full.blobs))
    good = [
        encode_checkpoint_v2(base.model_copy(update={"workflow_id": wf}), storage.blob_params)
        for wf in ("b", "c")
    ]
    results = await asyncio.gather(
        storage.save_tree("b", 0, *good[0]),
        storage.save_tree("a", 1, record, partial),
        storage.save_tree("fenced", 0, *good[1], fence=stale),
        storage.save_tree("c", 0, *good[1]),
        return_exceptions=True,
    )
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], InvalidArgumentError) and "known" in str(results[1])
    assert isinstance(results[2], LeaseLostError)
    assert not await storage.exists("a", 1) and not await storage.exists("fenced")
    states = check_refcounts(path)
    assert set(states) == {("a", 0), ("b", 0), ("c", 0)}
    # A split whose record does not match it is refused before anything is queued.
    with pytest.raises(InvalidArgumentError):
        await storage.save_tree("a", 2, good[0][0], partial)
    await manager.close()


async def test_plain_save_of_a_version_2_record_holds_its_blobs(tmp_path: Path) -> None:
    """A version-2 record written with plain ``save`` (its blobs stored by another step)
    counts the blobs it names, so deleting that other step keeps it readable.
    """
    path = tmp_path / "p.db"
    storage = SQLiteCheckpointStorage(path)
    async with CheckpointManager(storage) as manager:
        first = await manager.create_checkpoint("wf", 0, "a", "running", big_state(5))
        record, _split = encode_checkpoint_v2(
            first.model_copy(update={"step": 1}), storage.blob_params
        )
        await storage.save("wf", 1, record)
        assert await manager.delete_checkpoints("wf", 0)
        assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == big_state(5)
        check_refcounts(path)


async def test_a_batch_of_plain_saves_replacing_trees_releases_their_blobs(
    tmp_path: Path,
) -> None:
    """Plain saves that replace version-2 records, in one batch with saves of new steps,
    release exactly the blobs those held: the writer drains the releases whenever an
    upsert's trigger queued one (and skips the drain only when none did)."""
    path = tmp_path / "r.db"
    storage = SQLiteCheckpointStorage(path)
    async with CheckpointManager(storage) as manager:
        for n in range(3):
            await manager.create_checkpoint(f"wf-{n}", 0, "a", "running", big_state(n))
        assert _sql(path, "SELECT count(*) FROM blobs")[0][0] > 0
        small = {"small": True}
        saves = [manager.create_checkpoint(f"new-{n}", 0, "a", "running", small) for n in range(20)]
        saves += [manager.create_checkpoint(f"wf-{n}", 0, "a", "running", small) for n in range(3)]
        before = storage._writer.commits
        await asyncio.gather(*saves)
        assert storage._writer.commits == before + 1
        assert _sql(path, "SELECT count(*) FROM blobs") == [(0,)]
        assert _sql(path, "SELECT count(*) FROM blob_releases") == [(0,)]
        check_refcounts(path)


async def test_rows_deleted_behind_the_store_release_their_blobs(tmp_path: Path) -> None:
    """A record deleted in the sqlite3 shell queues its references (a trigger);
    collect_garbage (or the next write) frees the blobs no record uses any more.
    """
    path = tmp_path / "g.db"
    storage = SQLiteCheckpointStorage(path)
    async with CheckpointManager(storage) as manager:
        await manager.create_checkpoint("a", 0, "x", "running", big_state(1))
        await manager.create_checkpoint("b", 0, "x", "running", {"own": ["b" * 100] * 200})
        assert await storage.collect_garbage() == 0
        _sql(path, "DELETE FROM checkpoints WHERE workflow_id = 'b'")
        assert await storage.collect_garbage() > 0
        assert await storage.collect_garbage() == 0
        assert set(check_refcounts(path)) == {("a", 0)}
        # a count damaged by hand is put right by a full recount, which frees nothing here
        _sql(
            path,
            "UPDATE blobs SET refs = refs + 5 WHERE rowid IN (SELECT rowid FROM blobs LIMIT 3)",
        )
        assert await storage.collect_garbage(full=True) == 0
        assert set(check_refcounts(path)) == {("a", 0)}


def _has_schema(path: Path) -> bool:
    return path.exists() and bool(
        _sql(path, "SELECT 1 FROM sqlite_master WHERE name = 'blob_releases'")
    )


def spawn(*args: str) -> subprocess.Popen[bytes]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, env=env)


async def _first_ack(proc: subprocess.Popen[bytes]) -> bytes:
    """The writer's first acknowledgement line. The first writer of the kill loop is killed
    only after it, so that a loaded machine (a slow start) still leaves a step to check."""
    assert proc.stdout is not None
    return await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 300)


@pytest.mark.slow
async def test_sigkilled_writer_never_leaves_a_record_without_blobs(tmp_path: Path) -> None:
    """SIGKILL at random moments of big saves with retention: after each kill every record
    decodes, every count is exact, nothing leaks, and every acknowledged step that retention
    keeps is there.
    """
    path = tmp_path / "crash.db"
    rng = random.Random(11)
    last_acked = -1
    for kill in range(KILLS):
        wf = f"wf-{kill}"
        proc = spawn(str(path), wf, str(kill), "1000000", "5", "0", "0")
        first = await _first_ack(proc) if kill == 0 else b""
        await asyncio.sleep(0.4 + rng.random() * 1.8)  # start-up alone takes ~1 s under load
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        acked = [int(line) for line in (first + out).split(b"\n")[:-1]]
        if not acked and not _has_schema(path):
            continue  # killed while still starting up: nothing to check yet
        states = check_refcounts(path)  # every record decodes; counts exact; nothing leaked
        if acked:
            last_acked = acked[-1]
            # the newest acknowledged step survived the kill (retention keeps the newest 5)
            assert (wf, last_acked) in states
        assert len([key for key in states if key[0] == wf]) <= 5
        for (_wf, step), state in states.items():
            assert state["step"] == step
    assert last_acked >= 0


async def test_writers_in_several_processes_with_retention(tmp_path: Path) -> None:
    """Three processes write sharing states into one database with retention and collect
    garbage meanwhile; at the end every count is exact and every kept checkpoint decodes.
    """
    path = tmp_path / "shared.db"
    procs = [spawn(str(path), f"wf-{n}", str(n), "25", "3", "7", "0") for n in range(3)]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0
        assert out.split(b"\n")[-2] == b"24"
    states = check_refcounts(path)
    assert sorted(states) == [(f"wf-{n}", s) for n in range(3) for s in (22, 23, 24)]
    # the documents shared by the three workflows are stored once: counts above 1 exist
    assert _sql(path, "SELECT max(refs) FROM blobs")[0][0] > 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "AIOCHECKPOINT_DEBUG")}
    env["PYTHONPATH"] = str(SRC)
    return cli_runner.run(args, stdin=subprocess.DEVNULL, timeout=120, env=env)


async def test_cli_verifies_copies_exports_and_prunes_incremental_sqlite(tmp_path: Path) -> None:
    """verify, copy (to a file store and to another SQLite file), export/import and prune
    handle a SQLite store whose large states are blobs; prune keeps the counts exact, and a
    damaged blob is reported by verify.
    """
    src = tmp_path / "src.db"
    async with CheckpointManager(SQLiteCheckpointStorage(src)) as manager:
        for step in range(4):
            await manager.create_checkpoint("big", step, "a", "completed", big_state(step))
        await manager.create_checkpoint("small", 0, "a", "completed", {"k": 1})
    assert _sql(src, "SELECT count(*) FROM blobs")[0][0] > 0
    verify = _cli("--json", "verify", f"sqlite:{src}")
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["checkpoints"] == 5
    for dst in (f"file:{tmp_path / 'copy'}", f"sqlite:{tmp_path / 'copy.db'}"):
        copied = _cli("copy", f"sqlite:{src}", dst)
        assert copied.returncode == 0, copied.stderr
        async with CheckpointManager(aiocheckpoint.open_storage(dst)) as manager:
            got = await manager.get_checkpoint("big", 3)
            assert got.state_snapshot.data == big_state(3)
    exported = _cli("export", f"sqlite:{src}", str(tmp_path / "dump.jsonl"))
    assert exported.returncode == 0, exported.stderr
    imported = _cli("import", str(tmp_path / "dump.jsonl"), f"sqlite:{tmp_path / 'imp.db'}")
    assert imported.returncode == 0, imported.stderr
    async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "imp.db")) as manager:
        assert (await manager.get_checkpoint("big", 2)).state_snapshot.data == big_state(2)
    pruned = _cli("prune", f"sqlite:{src}", "--keep", "1")
    assert pruned.returncode == 0, pruned.stderr
    assert set(check_refcounts(src)) == {("big", 3), ("small", 0)}
    # delete a blob that has children (an index node), as a damaged disk or a person would
    h = next(
        h
        for h, data in _sql(src, "SELECT hash, data FROM blobs WHERE refs = 1")
        if node_children(data)
    )
    _sql(src, "DELETE FROM blobs WHERE hash = ?", (h,))
    verify = _cli("--json", "verify", f"sqlite:{src}")
    assert verify.returncode != 0
    assert [c["step"] for c in json.loads(verify.stdout)["corrupted"]] == [3]
    removed = _cli("rm", f"sqlite:{src}", "big", "--yes")
    assert removed.returncode == 0, removed.stderr
    # the deleted blob's children were counted by it alone: only a full recount frees them
    leaked = _sql(src, "SELECT count(*) FROM blobs")[0][0]
    assert leaked > 0
    async with SQLiteCheckpointStorage(src) as storage:
        assert await storage.collect_garbage() == 0
        assert await storage.collect_garbage(full=True) == leaked
        assert await storage.collect_garbage(full=True) == 0
    assert check_refcounts(src) == {("small", 0): {"k": 1}}
    assert _sql(src, "SELECT count(*) FROM blobs") == [(0,)]


async def test_read_blobs_gives_large_blobs_whole_and_leaves_out_those_over_the_limit(
    tmp_path: Path,
) -> None:
    """read_blobs answers the hashes it has: small blobs from its query, a blob of 1 MB or
    more read a slice at a time but whole, a blob over ``max_bytes`` left out like an
    unknown hash; and the store resumes the state those blobs hold.
    """
    path = tmp_path / "c.db"
    state = {"docs": big_state(0, docs=40)["docs"], "long": "z" * 3_000_000}
    async with CheckpointManager(SQLiteCheckpointStorage(path)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", state)
        resume = await manager.get_resume_point("wf")
    assert resume is not None and resume[1].data == state
    stored = dict(_sql(path, "SELECT hash, data FROM blobs"))
    large = [h for h, data in stored.items() if len(data) >= 1024 * 1024]
    assert len(large) == 1 and len(stored) > 2
    unknown = b"\x00" * 16
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert read_blobs(conn, [*stored, unknown], 2**40) == stored
        small_only = read_blobs(conn, list(stored), 1024 * 1024 - 1)
        assert small_only == {h: d for h, d in stored.items() if h not in large}
        assert read_blobs(conn, list(stored), 1) == {}
        conn.execute("BEGIN")  # inside the caller's transaction too
        assert read_blobs(conn, large, len(stored[large[0]])) == {large[0]: stored[large[0]]}
        conn.execute("COMMIT")
    finally:
        conn.close()
