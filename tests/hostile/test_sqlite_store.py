"""A SQLite store the reader did not write: hostile names, other users' files, damaged rows.

Issue #22, the SQLite half: items 9 (a ``file:`` name read as a URI), 7 (a database file
planted or opened up by another user), 12 (one record the storage refuses must not hide the
good ones from ``get_resume_point``) and 18 (rows whose hand-damaged constraints let a BLOB
workflow id in). Real files, a real second user (the ``root`` tier's tests ``chown`` to
uid 65534), real ``sqlite3`` edits with the CHECK constraints turned off.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    InvalidArgumentError,
    StorageBackendError,
    open_storage,
)
from aiocheckpoint.errors import StoragePermissionError
from aiocheckpoint.storage.sqlite import ForeignRow, SQLiteCheckpointStorage
from tests import cli_runner

SRC = Path(__file__).resolve().parents[2] / "src"
OTHER_UID = 65534  # nobody: a second user
LIMIT = 4096  # the reader's max_record_bytes in the recovery tests
WF = "wf"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes(directory: Path) -> dict[str, int]:
    """Each entry of ``directory`` and its permission bits."""
    return {p.name: mode(p) for p in directory.iterdir()}


def sql(db: Path, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Run one statement with the CHECK constraints off, as a person with the shell could."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def planted(path: Path, *, uid: int = OTHER_UID, bits: int = 0o666) -> Path:
    """An empty file at ``path`` owned by ``uid`` with mode ``bits``, really."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.chown(path, uid, -1)
    os.chmod(path, bits)
    return path


# --- item 9: names SQLite would read as URIs -----------------------------------------------


async def test_a_file_uri_name_is_refused_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:file:/abs/p.db`` is refused with InvalidArgumentError before anything exists:
    no database at /abs/p.db (SQLite would have opened it as a URI, 0644), no decoy file or
    ``file:`` directory in the working directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    target = tmp_path / "real" / "p.db"
    for make in (
        lambda: open_storage(f"sqlite:file:{target}"),
        lambda: open_storage(f"sqlite:FILE:{target}"),
        lambda: SQLiteCheckpointStorage(f"file:{target}?mode=rwc"),
    ):
        with pytest.raises(InvalidArgumentError, match="file:"):
            storage = make()
            async with CheckpointManager(storage) as manager:  # what the old code did
                await manager.create_checkpoint(WF, 0, "a", "completed", {"secret": 1})
    assert not (tmp_path / "real").exists()
    assert os.listdir(cwd) == []


async def test_a_memory_name_is_a_private_file_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path ``:memory:`` names a file in the working directory, created 0600, whose
    checkpoints a new storage reads back (SQLite alone would give an in-memory database)."""
    monkeypatch.chdir(tmp_path)
    async with CheckpointManager(SQLiteCheckpointStorage(":memory:")) as manager:
        await manager.create_checkpoint(WF, 0, "a", "completed", {"kept": True})
    assert mode(tmp_path / ":memory:") == 0o600
    async with CheckpointManager(open_storage("sqlite::memory:")) as manager:
        latest = await manager.get_latest_checkpoint(WF)
        assert latest is not None and latest.state_snapshot.data == {"kept": True}


async def test_uri_characters_in_a_path_name_that_very_file(tmp_path: Path) -> None:
    """A name with ``?``, ``#``, ``%`` and ``&`` in it is that file, created 0600, and nothing
    else appears beside it (the library percent-escapes the URI it gives SQLite)."""
    db = tmp_path / "a?mode=ro&cache=shared#frag%41 é.db"
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
        await manager.create_checkpoint(WF, 0, "a", "completed", {"n": 1})
        found = modes(tmp_path)
        assert set(found) <= {db.name, f"{db.name}-wal", f"{db.name}-shm"}
        assert set(found.values()) == {0o600}
    assert sql(db, "SELECT count(*) FROM checkpoints") == [(1,)]


# --- item 7: database files of another user, or open to other users ------------------------


@pytest.mark.root  # chowns to another uid
async def test_a_database_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """An empty 0666 file pre-created by another user is refused with StoragePermissionError
    naming it; nothing is written to it (the attacker reads nothing) and no -wal appears.
    ``allow_shared=True``, the documented opt-out, opens it."""
    db = planted(tmp_path / "shared" / "store.db")
    storage = SQLiteCheckpointStorage(db)
    with pytest.raises(StoragePermissionError, match="uid 65534") as info:
        await CheckpointManager(storage).create_checkpoint(WF, 0, "a", "completed", {"s": 1})
    assert info.value.path == str(db)
    assert isinstance(info.value, StorageBackendError)
    await storage.close()
    assert db.stat().st_size == 0
    assert sorted(p.name for p in db.parent.iterdir()) == ["store.db"]
    async with CheckpointManager(open_storage(f"sqlite:{db}", allow_shared=True)) as manager:
        await manager.create_checkpoint(WF, 0, "a", "completed", {"shared": "on purpose"})
    assert db.stat().st_size > 0


async def test_a_group_writable_database_of_its_own_is_refused(tmp_path: Path) -> None:
    """The current user's own database that group or others may write is refused: anyone
    could have written forged records into it."""
    db = tmp_path / "store.db"
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save(WF, 0, b"x")
    for bits in (0o620, 0o602, 0o666):
        os.chmod(db, bits)
        async with SQLiteCheckpointStorage(db) as storage:
            with pytest.raises(StoragePermissionError, match="write"):
                await storage.list_workflows()
    assert mode(db) == 0o666  # refused: left as it was


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
@pytest.mark.root  # chowns to another uid
async def test_a_planted_wal_or_shm_file_is_refused(tmp_path: Path, suffix: str) -> None:
    """Another user's -wal or -shm next to the database (which SQLite would read) is refused,
    naming that file."""
    db = tmp_path / "store.db"
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save(WF, 0, b"x")
    side = planted(Path(f"{db}{suffix}"))
    async with SQLiteCheckpointStorage(db) as storage:
        with pytest.raises(StoragePermissionError) as info:
            await storage.load(WF)
    assert info.value.path == str(side)


async def test_a_readable_database_of_its_own_is_made_private_before_use(
    tmp_path: Path,
) -> None:
    """The user's own 0644 database (made by another tool) is made owner-only before the
    store writes anything, and so are the -wal and -shm SQLite then creates."""
    db = tmp_path / "store.db"
    db.write_bytes(b"")
    os.chmod(db, 0o644)
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save(WF, 0, b"private")
        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert mode(path) == 0o600, path


# --- item 12: one record the storage refuses never hides the good ones ---------------------


async def write_history(db: Path, sizes: dict[int, int]) -> None:
    """Checkpoints of WF at the given steps, each with a string of the given length."""
    async with CheckpointManager(SQLiteCheckpointStorage(db), incremental=False) as manager:
        for step, size in sorted(sizes.items()):
            await manager.create_checkpoint(
                WF, step, "a", "completed", {"s": step, "p": "x" * size}
            )


def flip(db: Path, step: int) -> None:
    """Flip one bit in the middle of a stored record."""
    (data,) = sql(
        db, "SELECT data FROM checkpoints WHERE workflow_id = ? AND step = ?", (WF, step)
    )[0]
    assert isinstance(data, bytes)
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x10
    sql(db, "UPDATE checkpoints SET data = ? WHERE step = ?", (bytes(damaged), step))


async def resume_step(db: Path) -> tuple[int, object]:
    async with CheckpointManager(SQLiteCheckpointStorage(db, max_record_bytes=LIMIT)) as manager:
        point = await manager.get_resume_point(WF)
    assert point is not None
    return point[0], point[1].data["s"]


async def test_resume_passes_over_a_latest_record_over_max_record_bytes(tmp_path: Path) -> None:
    """The latest record is over the reader's max_record_bytes (the storage refuses it
    without fetching it): get_resume_point resumes after the newest record that verifies."""
    db = tmp_path / "store.db"
    await write_history(db, {0: 10, 1: 10, 2: 4 * LIMIT})
    assert await resume_step(db) == (2, 1)


async def test_resume_passes_over_a_bit_flipped_latest_and_an_oversized_record_below_it(
    tmp_path: Path,
) -> None:
    """Latest bit-flipped (the decoder rejects it), the one below over max_record_bytes (the
    storage refuses it, and with it the page the fallback reads): resumes from the next."""
    db = tmp_path / "store.db"
    await write_history(db, {0: 10, 1: 10, 2: 4 * LIMIT, 3: 10})
    flip(db, 3)
    assert await resume_step(db) == (2, 1)


async def test_one_bad_record_deep_in_a_page_hides_no_good_record(tmp_path: Path) -> None:
    """Beyond the first page: 130 steps whose newest 20 are bit-flipped, then one over
    max_record_bytes and one stored as TEXT (a hand edit with CHECK constraints off), in
    the same pages as good records. The fallback passes over each bad record alone."""
    db = tmp_path / "store.db"
    await write_history(db, {step: 4 * LIMIT if step == 108 else 10 for step in range(130)})
    for step in range(110, 130):
        flip(db, step)
    sql(db, "UPDATE checkpoints SET data = 'not a blob' WHERE step = 109")
    assert await resume_step(db) == (108, 107)


async def test_the_storage_names_the_record_it_refuses(tmp_path: Path) -> None:
    """The storage's refusal names the workflow and step of the one record at fault; the
    records below it read normally."""
    db = tmp_path / "store.db"
    await write_history(db, {0: 10, 1: 4 * LIMIT, 2: 10})
    async with SQLiteCheckpointStorage(db, max_record_bytes=LIMIT) as storage:
        with pytest.raises(CheckpointCorruptedError) as info:
            await storage.scan(WF, descending=True)
        assert (info.value.workflow_id, info.value.step) == (WF, 1)
        assert [r.step for r in await storage.scan(WF, before=1)] == [0]


# --- item 18: rows the library could not have written --------------------------------------


FOREIGN_IDS = {
    "blob id": "x'6576696c'",  # b"evil"
    "empty id": "''",
    "NUL in id": "'a' || char(0) || 'b'",
    "300-byte id": "'" + "y" * 300 + "'",
    "invalid UTF-8 id": "CAST(x'ff' AS TEXT)",
}


async def damaged_store(tmp_path: Path, kinds: Iterable[str] = FOREIGN_IDS) -> Path:
    """A store with workflow 'wf' and, edited in by hand, one foreign row per FOREIGN_IDS
    entry of ``kinds`` in both tables, plus records of 'wf' with a TEXT step and a REAL step."""
    db = tmp_path / "store.db"
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
        await manager.create_checkpoint(WF, 0, "a", "completed", {"good": True})
    for value in (FOREIGN_IDS[kind] for kind in kinds):
        sql(db, f"INSERT INTO checkpoints (workflow_id, step, data) VALUES ({value}, 0, x'00')")
        sql(
            db,
            f"INSERT INTO workflows (workflow_id, created_at, updated_at) VALUES ({value}, 0, 0)",
        )
    sql(db, "INSERT INTO checkpoints (workflow_id, step, data) VALUES ('wf', 'later', x'00')")
    sql(db, "INSERT INTO checkpoints (workflow_id, step, data) VALUES ('wf', 7.5, x'00')")
    return db


@pytest.mark.parametrize("kind", sorted(FOREIGN_IDS))
async def test_listings_hand_out_only_valid_str_ids(tmp_path: Path, kind: str) -> None:
    """list_workflows, list_workflow_records and claim_next_workflow never hand out a
    foreign row's id (a BLOB, an invalid str); each lists the one real workflow."""
    db = await damaged_store(tmp_path, [kind])
    async with SQLiteCheckpointStorage(db) as storage:
        assert await storage.list_workflows() == [WF]
        assert [r.workflow_id for r in await storage.list_workflow_records()] == [WF]
        lease = await storage.claim_next_workflow("runner", 60)
        assert lease is not None and lease.workflow_id == WF
        assert await storage.claim_next_workflow("runner-2", 60) is None
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
        assert await manager.list_workflows() == [WF]
        assert await manager.list_workflows("unfinished") == [WF]


async def test_reads_pass_over_steps_that_are_not_integers(tmp_path: Path) -> None:
    """A TEXT or REAL step (which sorts above every integer) is never the latest record and
    never in a scan: the workflow reads and resumes as it was written."""
    db = await damaged_store(tmp_path)
    async with SQLiteCheckpointStorage(db) as storage:
        latest = await storage.load(WF)
        assert latest is not None and latest.step == 0
        assert [r.step for r in await storage.scan(WF)] == [0]
        assert [r.step for r in await storage.scan(WF, descending=True, after=0)] == []
    async with CheckpointManager(SQLiteCheckpointStorage(db)) as manager:
        point = await manager.get_resume_point(WF)
        assert point is not None and point[1].data == {"good": True}


async def test_foreign_rows_are_reported_typed(tmp_path: Path) -> None:
    """foreign_rows() reports every hand-made row, in both tables, as a ForeignRow with its
    table, rowid and reason; a clean store reports none."""
    db = await damaged_store(tmp_path)
    async with SQLiteCheckpointStorage(db) as storage:
        found = await storage.foreign_rows()
    assert all(isinstance(row, ForeignRow) for row in found)
    by_table = {
        table: [r for r in found if r.table == table] for table in ("checkpoints", "workflows")
    }
    assert len(by_table["checkpoints"]) == len(FOREIGN_IDS) + 2
    assert len(by_table["workflows"]) == len(FOREIGN_IDS)
    rowids = {r.rowid for r in by_table["checkpoints"]}
    assert rowids == {
        row[0]
        for row in sql(
            db, "SELECT rowid FROM checkpoints WHERE NOT (workflow_id = 'wf' AND step = 0)"
        )
    }
    assert any("'later'" in r.reason for r in by_table["checkpoints"])
    async with SQLiteCheckpointStorage(tmp_path / "clean.db") as clean:
        await clean.save(WF, 0, b"x")
        assert await clean.foreign_rows() == []


async def test_a_damaged_workflow_record_is_a_typed_error(tmp_path: Path) -> None:
    """A workflow record whose status or times were edited into nonsense raises
    CheckpointCorruptedError from get_workflow, and is skipped by the listing."""
    db = tmp_path / "store.db"
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save(WF, 0, b"x")
        await storage.save("other", 0, b"x")
    sql(db, "UPDATE workflows SET status = 'weird', created_at = 'soon' WHERE workflow_id = 'wf'")
    async with SQLiteCheckpointStorage(db) as storage:
        with pytest.raises(CheckpointCorruptedError) as info:
            await storage.get_workflow(WF)
        assert info.value.workflow_id == WF
        assert [r.workflow_id for r in await storage.list_workflow_records()] == ["other"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("AIOCHECKPOINT_DEBUG", None)
    return cli_runner.run(args, timeout=120, env=env)


async def test_cli_workflows_export_copy_survive_a_blob_workflow_id(tmp_path: Path) -> None:
    """The command line's workflows, export and copy over a store with a BLOB workflow id
    (once a raw TypeError) finish with no traceback and carry only the real workflow; export
    and copy count the damaged rows as problems (exit status 1), workflows notes them."""
    db = await damaged_store(tmp_path, ["blob id"])
    url = f"sqlite:{db}"
    listed = run_cli("workflows", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [w["workflow_id"] for w in json.loads(listed.stdout)["workflows"]] == [WF]
    exported = run_cli("export", url, str(tmp_path / "dump.jsonl"))
    assert exported.returncode == 1, exported.stderr
    copied = run_cli("copy", url, f"sqlite:{tmp_path / 'copy.db'}")
    assert copied.returncode == 1, copied.stderr
    for result in (listed, exported, copied):
        assert "Traceback" not in result.stderr and "TypeError" not in result.stderr
    async with SQLiteCheckpointStorage(tmp_path / "copy.db") as copy:
        assert await copy.list_workflows() == [WF]
        assert await copy.foreign_rows() == []
