"""SQLiteCheckpointStorage beyond the conformance suite: durability settings, schema versions,
group commit, cancellation, locking between connections, limits and error mapping."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    InMemoryCheckpointStorage,
    InvalidArgumentError,
    StorageBackendError,
    StorageClosedError,
    StorageSchemaError,
    open_storage,
)
from aiocheckpoint.storage.queries import StepInfo
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.storage.sqlite import records as sqlrecords
from aiocheckpoint.storage.sqlite import sql as sqldb
from aiocheckpoint.storage.sqlite.schema import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
    Migration,
)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[SQLiteCheckpointStorage]:
    storage = SQLiteCheckpointStorage(db, busy_timeout=30.0)
    yield storage
    await storage.close()


def exists(path: Path) -> bool:
    return path.exists()


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def pragma(db: Path, name: str) -> object:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f"PRAGMA {name}").fetchall()[0][0]
    finally:
        conn.close()


@contextmanager
def write_lock(db: Path) -> Iterator[sqlite3.Connection]:
    """Hold the database's write lock from another connection (as another process would)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


async def until(condition: object) -> None:
    for _ in range(10_000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


def writer_blocked(storage: SQLiteCheckpointStorage) -> bool:
    """The writer thread has taken every queued write and is committing (or waiting to)."""
    return storage._busy and not storage._pending


# --- lifecycle and files --------------------------------------------------------------


async def test_open_is_lazy(db: Path) -> None:
    """Constructing the storage touches nothing; the first operation creates the database."""
    storage = SQLiteCheckpointStorage(db)
    assert not exists(db)
    assert await storage.list_workflows() == []
    assert exists(db)
    await storage.close()


async def test_creates_missing_parent_directories(tmp_path: Path) -> None:
    """A path in a directory that does not exist yet works: the directories are created."""
    path = tmp_path / "a" / "b" / "store.db"
    async with SQLiteCheckpointStorage(path) as storage:
        await storage.save("wf", 0, b"x")
    assert path.exists()


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
async def test_files_are_owner_only(store: SQLiteCheckpointStorage, db: Path) -> None:
    """The database and its -wal and -shm files are created with mode 0600."""
    await store.save("wf", 0, b"x")
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


async def test_wal_and_synchronous_full(store: SQLiteCheckpointStorage, db: Path) -> None:
    """The database is in WAL mode and the writer commits with synchronous=FULL."""
    await store.save("wf", 0, b"x")
    assert pragma(db, "journal_mode") == "wal"
    conn = store._writer.conn
    assert conn is not None
    assert conn.execute("PRAGMA synchronous").fetchall() == [(2,)]  # 2 == FULL


async def test_close_commits_queued_writes(db: Path) -> None:
    """close() waits for every queued write; a new instance then reads all of them."""
    storage = SQLiteCheckpointStorage(db)
    tasks = [asyncio.create_task(storage.save("wf", n, b"%d" % n)) for n in range(50)]
    await asyncio.sleep(0)  # the saves are queued, none committed yet
    await storage.close()
    assert all(t.done() and t.exception() is None for t in tasks)
    async with SQLiteCheckpointStorage(db) as again:
        assert [r.step for r in await again.scan("wf")] == list(range(50))


async def test_close_during_lazy_open_commits_queued_writes(db: Path) -> None:
    """Writes queued while the first open is still running are committed by close()."""
    storage = SQLiteCheckpointStorage(db)
    tasks = [asyncio.create_task(storage.save(f"wf-{n}", 0, b"x")) for n in range(5)]
    await asyncio.sleep(0)
    assert not storage._opened  # the open is in flight in the writer thread
    await storage.close()
    assert all(t.done() and t.exception() is None for t in tasks)
    async with SQLiteCheckpointStorage(db) as again:
        assert len(await again.list_workflows()) == 5


async def test_reads_racing_close_finish_or_report_closed(db: Path) -> None:
    """Reads in flight when close() runs either complete or raise StorageClosedError; none
    hangs and close() returns."""
    storage = SQLiteCheckpointStorage(db)
    await storage.save("wf", 0, b"x")
    reads = [asyncio.create_task(storage.load("wf")) for _ in range(40)]
    await asyncio.sleep(0)
    await storage.close()
    results = await asyncio.gather(*reads, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            assert isinstance(result, StorageClosedError), result
        else:
            assert result is not None and result.data == b"x"


async def test_open_storage_url(db: Path) -> None:
    """open_storage('sqlite:///abs/path') builds this backend on that file."""
    storage = open_storage(f"sqlite://{db}", busy_timeout=2.0)
    assert isinstance(storage, SQLiteCheckpointStorage) and storage.path == db
    async with storage:
        await storage.save("wf", 1, b"v")
    assert exists(db)


async def test_closed_before_first_use(db: Path) -> None:
    """A storage closed before it was ever used refuses use and never creates the file."""
    storage = SQLiteCheckpointStorage(db)
    await storage.close()
    with pytest.raises(StorageClosedError):
        await storage.save("wf", 0, b"x")
    assert not exists(db)


# --- schema versions ---------------------------------------------------------------------


async def test_schema_version_recorded(store: SQLiteCheckpointStorage, db: Path) -> None:
    """A new database records the current schema version and the aiocheckpoint app id."""
    await store.open()
    assert pragma(db, "user_version") == SCHEMA_VERSION
    assert pragma(db, "application_id") == APPLICATION_ID


async def test_empty_file_is_migrated(db: Path) -> None:
    """A zero-byte file (a version-0 database) is migrated to the current schema on open."""
    write(db, b"")
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save("wf", 0, b"x")
    assert pragma(db, "user_version") == SCHEMA_VERSION


async def test_newer_schema_is_refused_and_left_alone(db: Path) -> None:
    """A database of a newer schema version raises StorageSchemaError and is not modified."""
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save("wf", 0, b"x")
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    storage = SQLiteCheckpointStorage(db)
    with pytest.raises(StorageSchemaError, match="newer"):
        await storage.load("wf")
    with pytest.raises(StorageSchemaError):
        await storage.save("wf", 1, b"y")
    await storage.close()
    assert pragma(db, "user_version") == SCHEMA_VERSION + 1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT step FROM checkpoints").fetchall() == [(0,)]
    conn.close()


@pytest.mark.parametrize(
    "setup",
    [
        "CREATE TABLE checkpoints (thread_id TEXT, checkpoint BLOB)",  # someone else's table
        f"PRAGMA application_id = {APPLICATION_ID + 1}",
    ],
)
async def test_foreign_database_is_refused(db: Path, setup: str) -> None:
    """A database of another application raises StorageSchemaError instead of being altered."""
    conn = sqlite3.connect(db)
    conn.execute(setup)
    conn.commit()
    conn.close()
    async with SQLiteCheckpointStorage(db) as storage:
        with pytest.raises(StorageSchemaError, match="not an aiocheckpoint database"):
            await storage.list_workflows()
    assert pragma(db, "user_version") == 0


async def test_pending_migrations_run_on_open(db: Path) -> None:
    """Opening a database with a newer migration list runs the new migration and keeps the
    data."""
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save("wf", 3, b"old")
    v2 = Migration(
        SCHEMA_VERSION + 1,
        "synthetic: an extra table",
        ("CREATE TABLE extra (workflow_id TEXT PRIMARY KEY, status TEXT)",),
    )
    storage = SQLiteCheckpointStorage(db)
    storage._writer.migrations = (*MIGRATIONS, v2)
    async with storage:
        got = await storage.load("wf")
        assert got is not None and got.data == b"old"
    assert pragma(db, "user_version") == SCHEMA_VERSION + 1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM extra").fetchall() == [(0,)]
    conn.close()


async def test_failed_migration_changes_nothing(db: Path) -> None:
    """A migration that fails part way is rolled back whole: the version and tables stay."""
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save("wf", 0, b"x")
    broken = Migration(
        SCHEMA_VERSION + 1,
        "synthetic: fails in its second statement",
        ("CREATE TABLE extra (x INTEGER)", "THIS IS NOT SQL"),
    )
    storage = SQLiteCheckpointStorage(db)
    storage._writer.migrations = (*MIGRATIONS, broken)
    with pytest.raises(StorageBackendError) as info:
        await storage.open()
    assert isinstance(info.value.__cause__, sqlite3.Error)
    await storage.close()
    assert pragma(db, "user_version") == SCHEMA_VERSION
    conn = sqlite3.connect(db)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert "extra" not in tables


# --- indexes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        (sqldb._LATEST, (10, "wf")),
        (sqldb._ONE, (10, "wf", 1)),
        (sqldb._SCAN.format(order="ASC"), (10, "wf", -1, 99, 10)),
        (sqldb._SCAN.format(order="DESC"), (10, "wf", -1, 99, 10)),
        (sqldb._EXISTS_ANY, ("wf",)),
        (sqldb._EXISTS_STEP, ("wf", 1)),
        (sqldb._PRUNE, ("wf", "wf", 2)),
        (sqldb._DELETE_STEP, ("wf", 1)),
        (sqldb._DELETE_WORKFLOW, ("wf",)),
        (sqldb._WORKFLOWS, ()),
    ],
)
async def test_queries_are_index_lookups(
    store: SQLiteCheckpointStorage, db: Path, sql: str, params: tuple[object, ...]
) -> None:
    """Every read and prune query searches the (workflow_id, step) index and never scans the
    table or sorts, so its cost does not grow with history length or workflow count."""
    await store.open()
    conn = sqlite3.connect(db)
    plan = " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    conn.close()
    steps = [step for step in plan.split(" | ") if "checkpoints" in step and "ids" not in step]
    assert steps, plan
    for step in steps:
        assert step.startswith("SEARCH checkpoints USING"), plan
        assert "INDEX checkpoints_workflow_step" in step, plan
    assert "TEMP B-TREE" not in plan, plan


# --- group commit and errors ------------------------------------------------------------


async def test_500_tasks_writing_at_once(store: SQLiteCheckpointStorage) -> None:
    """Five hundred concurrent tasks all land, verifiably, in far fewer transactions."""
    manager = CheckpointManager(store)

    async def work(n: int) -> None:
        for step in range(2):
            await manager.create_checkpoint(f"wf-{n}", step, "a", "completed", {"n": n})

    await asyncio.gather(*(work(n) for n in range(500)))
    assert len(await store.list_workflows()) == 500
    for n in range(0, 500, 7):
        cp = await manager.get_checkpoint(f"wf-{n}", 1)
        assert cp.state_snapshot.data == {"n": n}
    assert store._writer.commits < 1000 / 5  # writes shared transactions


async def _check_150_records(store: SQLiteCheckpointStorage) -> None:
    """Workflows ``wf-0``..``wf-149`` at step ``n % 3`` by ``agent-n``; ``wf-7`` at its
    newer step 9 by ``newest`` (saved after an older step in the same batch)."""
    for n in range(150):
        record = await store.get_workflow(f"wf-{n}")
        assert record is not None
        if n != 7:
            assert (record.latest_step, record.latest_agent_id) == (n % 3, f"agent-{n}")
    seven = await store.get_workflow("wf-7")
    assert seven is not None
    assert (seven.latest_step, seven.latest_agent_id) == (9, "newest")


async def test_one_batch_of_saves_keeps_every_workflow_record_exact(
    store: SQLiteCheckpointStorage,
) -> None:
    """Each of 150 workflows saved at once gets its exact record, and a workflow saved twice,
    newer step first, keeps the newer step's agent as its latest: whatever batches the saves
    fall in (how many depends on the machine's timing; the batched statements themselves
    are tested below)."""
    await store.open()
    manager = CheckpointManager(store)
    saves = [
        manager.create_checkpoint(f"wf-{n}", n % 3, f"agent-{n}", "running", {"n": n})
        for n in range(150)
    ]
    saves.append(manager.create_checkpoint("wf-7", 9, "newest", "completed", {}))
    saves.append(manager.create_checkpoint("wf-7", 4, "older", "failed", {}))
    await asyncio.gather(*saves)
    await _check_150_records(store)
    seven = await store.get_workflow("wf-7")
    assert seven is not None and seven.latest_agent_status == "completed"


async def test_one_call_of_note_saves_writes_every_record_of_a_batch(
    store: SQLiteCheckpointStorage, db: Path
) -> None:
    """The multi-row statements of one batch (150 saves: chunks of 64, padded): every record
    is exact, and a workflow saved twice, newer step first, keeps the newer step."""
    await store.open()
    saves: list[tuple[str, int, StepInfo | None]] = [
        (f"wf-{n}", n % 3, StepInfo(f"agent-{n}", "running")) for n in range(150)
    ]
    saves += [("wf-7", 9, StepInfo("newest", "completed")), ("wf-7", 4, StepInfo("older", "x"))]
    saves.append(("plain", 0, None))
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        sqlrecords.note_saves(conn, 1.0, saves)
        conn.execute("COMMIT")
    finally:
        conn.close()
    await _check_150_records(store)
    assert await store.get_workflow("plain") is not None


def test_a_batch_statement_pads_to_a_multiple_of_8_past_8_rows() -> None:
    """Padding rows cost as much as real ones: past 8 rows a chunk is padded to the next
    multiple of 8 (a batch of 100 saves ran 128 rows with powers of two, now 104), and the
    distinct statements stay few enough for the connection's statement cache."""
    sizes = [sqlrecords.padded_rows(count) for count in range(1, sqlrecords.ROWS_PER_STATEMENT + 1)]
    assert sizes[:8] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert all(count <= rows <= count + 7 for count, rows in enumerate(sizes, 1))
    assert sqlrecords.padded_rows(36) == 40
    assert len(set(sizes)) == 19


@pytest.mark.parametrize("count", [9, 13, 36, 63, 64, 65, 100, 128, 129, 300])
async def test_padded_statements_write_exactly_the_records_saved(
    store: SQLiteCheckpointStorage, db: Path, count: int
) -> None:
    """Saves whose chunk is padded (the last one repeated) leave one exact record each, with
    and without a step's info: the repeated row changes nothing."""
    await store.open()
    noted: list[tuple[str, int, StepInfo | None]] = [
        (f"wf-{n}", n, StepInfo(f"agent-{n}", "running")) for n in range(count)
    ]
    plain: list[tuple[str, int, StepInfo | None]] = [(f"p-{n}", n, None) for n in range(count)]
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        sqlrecords.note_saves(conn, 1.0, noted + plain)
        conn.execute("COMMIT")
        rows = conn.execute(
            "SELECT workflow_id, latest_step, latest_agent_id FROM workflows"
        ).fetchall()
    finally:
        conn.close()
    expected = {(f"wf-{n}", n, f"agent-{n}") for n in range(count)}
    expected |= {(f"p-{n}", None, None) for n in range(count)}
    assert sorted(rows) == sorted(expected)


@pytest.mark.parametrize("count", [1, 3, 9, 64, 65, 128, 129, 300])
async def test_one_statement_per_128_rows_writes_each_row_and_a_repeated_step_once(
    store: SQLiteCheckpointStorage, count: int
) -> None:
    """A batch's rows go in multi-row statements, padded by repeating the last row: every
    row lands, a row already stored is replaced, and a step saved twice in one batch keeps
    the later save (as one save after the other would)."""
    await store.open()
    await store.save("wf-0", 0, b"old")
    rows = [(f"wf-{n % 40}", n // 40, b"%d" % n) for n in range(count)]
    rows.append(("wf-0", 0, b"later"))
    before = store._writer.commits
    await asyncio.gather(*(store.save(wf, step, data) for wf, step, data in rows))
    assert store._writer.commits == before + 1
    expected = {(wf, step): data for wf, step, data in rows}
    for (wf, step), data in expected.items():
        stored = await store.load(wf, step)
        assert stored is not None and stored.data == data, (wf, step)
    steps = {wf: sorted(s for w, s in expected if w == wf) for wf, _ in expected}
    for wf, wanted in steps.items():
        assert [c.step for c in await store.scan(wf)] == wanted


async def test_writers_that_yield_between_saves_share_one_commit_per_round(
    store: SQLiteCheckpointStorage,
) -> None:
    """Callers that await something else between saves (as workflows do) still share one
    commit per round: the batch is taken one loop iteration after the first write is queued,
    so every caller woken by the last commit joins it (no batch of one going first)."""
    await store.open()
    before = store._writer.commits

    async def work(n: int) -> None:
        for step in range(5):
            await store.save(f"wf-{n}", step, b"%d" % step)
            await asyncio.sleep(0)

    await asyncio.gather(*(work(n) for n in range(50)))
    assert store._writer.commits - before == 5
    assert [r.step for r in await store.scan("wf-49")] == list(range(5))


async def test_a_caller_out_of_step_rejoins_the_others_commit(
    store: SQLiteCheckpointStorage,
) -> None:
    """A caller whose write is queued while a batch commits (here: it yields twice before its
    first save, so it misses the first batch) joins the next batch of the callers that batch
    woke, instead of taking a commit of its own every round (batches of 1 and C-1)."""
    await store.open()
    before = store._writer.commits

    async def work(n: int) -> None:
        if n == 0:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        for step in range(5):
            await store.save(f"wf-{n}", step, b"%d" % step)
            await asyncio.sleep(0)

    await asyncio.gather(*(work(n) for n in range(50)))
    # Round 1 without the late caller, rounds 2-5 with it, its last save alone: 6 commits
    # (batches of 1 and 49 alternating would take 10).
    assert store._writer.commits - before == 6
    assert [r.step for r in await store.scan("wf-0")] == list(range(5))


async def test_queued_writes_fail_when_the_writer_thread_is_gone(db: Path) -> None:
    """If the batch cannot be handed to the writer thread (its executor shut down under
    it), every queued caller gets StorageClosedError instead of waiting forever."""
    storage = SQLiteCheckpointStorage(db)
    await storage.open()
    storage._write_thread.shutdown(wait=True)
    results = await asyncio.wait_for(
        asyncio.gather(
            *(storage.save(f"wf-{n}", 0, b"x") for n in range(3)), return_exceptions=True
        ),
        timeout=10,
    )
    assert [type(r) for r in results] == [StorageClosedError] * 3
    assert not storage._pending
    # close() needs the writer thread too: release the connections directly.
    storage._readers.close()
    storage._writer.close()
    storage._read_threads.shutdown(wait=True)


async def test_one_failing_write_fails_only_its_caller(
    store: SQLiteCheckpointStorage, db: Path
) -> None:
    """A write that SQLite rejects inside a shared batch fails its own caller with a chained
    StorageBackendError; the other writes of the batch land."""
    await store.open()
    conn = sqlite3.connect(db)
    conn.execute(
        "CREATE TRIGGER poison BEFORE INSERT ON checkpoints WHEN NEW.workflow_id = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
    )
    conn.commit()
    conn.close()
    with write_lock(db):
        saves = [asyncio.create_task(store.save(f"wf-{n}", 0, b"ok")) for n in range(20)]
        bad = asyncio.create_task(store.save("poison", 0, b"bad"))
        saves += [asyncio.create_task(store.save(f"wf-{n}", 0, b"ok")) for n in range(20, 40)]
        await until(lambda: writer_blocked(store) or store._pending)
    with pytest.raises(StorageBackendError) as info:
        await bad
    assert isinstance(info.value.__cause__, sqlite3.Error)
    await asyncio.gather(*saves)
    assert len(await store.list_workflows()) == 40
    assert not await store.exists("poison")


async def test_failing_commit_retries_writes_one_by_one(
    store: SQLiteCheckpointStorage, db: Path
) -> None:
    """When a batch's COMMIT itself fails (a deferred constraint), each write is retried in
    its own transaction: only the offending one fails."""
    await store.open()
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        CREATE TABLE parent (id INTEGER PRIMARY KEY);
        CREATE TABLE child (pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
        CREATE TRIGGER dangling AFTER INSERT ON checkpoints WHEN NEW.workflow_id = 'dangling'
        BEGIN INSERT INTO child VALUES (42); END;
        """
    )
    conn.close()
    with write_lock(db):
        first = asyncio.create_task(store.save("first", 0, b"x"))
        await until(lambda: writer_blocked(store))
        batch = [asyncio.create_task(store.save(f"wf-{n}", 0, b"x")) for n in range(10)]
        bad = asyncio.create_task(store.save("dangling", 0, b"x"))
        await asyncio.sleep(0)
    await first
    with pytest.raises(StorageBackendError, match="FOREIGN KEY"):
        await bad
    await asyncio.gather(*batch)
    assert len(await store.list_workflows()) == 11
    assert not await store.exists("dangling")


async def test_mixed_keep_last_in_one_batch_matches_one_by_one(
    store: SQLiteCheckpointStorage,
) -> None:
    """A batch mixing keep_last values and deletes leaves exactly what applying the writes
    one by one leaves (checked against the in-memory backend)."""
    await store.open()
    ops: list[tuple[str, int, int | None]] = []
    for n in range(60):
        keep = (None, 2, 2, 3, None, 1)[n % 6]
        ops.append((f"wf-{n % 3}", (n * 7) % 23, keep))
    memory = InMemoryCheckpointStorage()
    for wf, step, keep in ops:
        await memory.save(wf, step, b"%d" % step, keep_last=keep)
    with write_lock(store.path):
        first = asyncio.create_task(store.save("other", 0, b"x"))
        await until(lambda: writer_blocked(store))
        tasks = [
            asyncio.create_task(store.save(wf, step, b"%d" % step, keep_last=keep))
            for wf, step, keep in ops
        ]
        await asyncio.sleep(0)
    await asyncio.gather(first, *tasks)
    commits = store._writer.commits
    for wf in ("wf-0", "wf-1", "wf-2"):
        assert await store.scan(wf) == await memory.scan(wf), wf
    assert commits <= 3  # the 60 writes shared one transaction


# --- cancellation -----------------------------------------------------------------------


async def test_cancel_while_queued_writes_nothing(store: SQLiteCheckpointStorage) -> None:
    """A caller cancelled while its write waits in the queue removes it: nothing is written,
    and the writes around it land."""
    await store.open()
    with write_lock(store.path):
        first = asyncio.create_task(store.save("wf", 1, b"first"))
        await until(lambda: writer_blocked(store))
        queued = asyncio.create_task(store.save("wf", 2, b"cancelled"))
        later = asyncio.create_task(store.save("wf", 3, b"later"))
        await asyncio.sleep(0)
        assert len(store._pending) == 2
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
    await asyncio.gather(first, later)
    assert [r.step for r in await store.scan("wf")] == [1, 3]


async def test_cancel_while_committing_lands_whole(db: Path) -> None:
    """A caller cancelled once its batch is committing sees CancelledError, and its write
    lands whole; another caller of the same batch is unaffected."""
    async with SQLiteCheckpointStorage(db) as first:
        await first.save("wf", 0, b"old")
    storage = SQLiteCheckpointStorage(db, busy_timeout=30.0)
    with write_lock(db):
        # Queued while the (lazy) open runs, both writes become one batch; the batch then
        # waits for the lock inside the writer thread, i.e. it is committing.
        doomed = asyncio.create_task(storage.save("wf", 1, b"x" * 100_000, keep_last=1))
        neighbour = asyncio.create_task(storage.save("other", 0, b"fine"))
        await until(lambda: storage._opened and writer_blocked(storage))
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        assert not neighbour.done()
    await neighbour
    await storage.close()
    async with SQLiteCheckpointStorage(db) as again:
        assert [r.step for r in await again.scan("wf")] == [1]  # keep_last=1 applied too
        got = await again.load("wf", 1)
        assert got is not None and got.data == b"x" * 100_000
        assert await again.exists("other", 0)


async def test_cancelled_reader_does_not_break_the_store(store: SQLiteCheckpointStorage) -> None:
    """Cancelling a caller waiting on a read leaves the storage usable."""
    await store.save("wf", 0, b"x")
    read = asyncio.create_task(store.load("wf"))
    await asyncio.sleep(0)
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    got = await store.load("wf")
    assert got is not None and got.data == b"x"


# --- several connections ------------------------------------------------------------------


async def test_reads_do_not_wait_behind_writes(store: SQLiteCheckpointStorage) -> None:
    """While the writer is stuck waiting for another connection's lock, reads still answer."""
    await store.save("wf", 0, b"committed")
    with write_lock(store.path):
        pending = asyncio.create_task(store.save("wf", 1, b"blocked"))
        await until(lambda: writer_blocked(store))
        got = await store.load("wf")
        assert got is not None and got.data == b"committed"
        assert await store.list_workflows() == ["wf"]
        assert not pending.done()
    await pending
    assert (await store.load("wf")) is not None


async def test_busy_database_is_retried_until_free(db: Path) -> None:
    """A write blocked by another connection's lock for longer than busy_timeout is retried
    with backoff and lands once the lock is released."""
    storage = SQLiteCheckpointStorage(db, busy_timeout=0.02, busy_retries=20)
    await storage.open()
    with write_lock(db):
        pending = asyncio.create_task(storage.save("wf", 0, b"x"))
        await asyncio.sleep(0.3)
        assert not pending.done()
    await pending
    assert await storage.exists("wf", 0)
    await storage.close()


async def test_busy_database_fails_cleanly_when_retries_run_out(db: Path) -> None:
    """With no retries left, a locked database fails the write with StorageBackendError
    chaining sqlite3's error, and nothing is written."""
    storage = SQLiteCheckpointStorage(db, busy_timeout=0.01, busy_retries=0)
    await storage.open()
    with write_lock(db), pytest.raises(StorageBackendError) as info:
        await storage.save("wf", 0, b"x")
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert not await storage.exists("wf")
    await storage.close()


# --- limits and error mapping -------------------------------------------------------------


async def test_oversized_record_refused_on_save(db: Path) -> None:
    """A record larger than max_record_bytes is refused before anything is written."""
    async with SQLiteCheckpointStorage(db, max_record_bytes=100) as storage:
        await storage.save("wf", 0, b"x" * 100)
        with pytest.raises(InvalidArgumentError, match="max_record_bytes"):
            await storage.save("wf", 1, b"x" * 101)
        assert [r.step for r in await storage.scan("wf")] == [0]


async def test_oversized_record_refused_on_read(db: Path) -> None:
    """A stored record larger than the reader's max_record_bytes raises
    CheckpointCorruptedError naming it, from load and scan alike."""
    async with SQLiteCheckpointStorage(db) as storage:
        await storage.save("wf", 4, b"x" * 1000)
    async with SQLiteCheckpointStorage(db, max_record_bytes=999) as small:
        with pytest.raises(CheckpointCorruptedError, match="1000 bytes") as info:
            await small.load("wf")
        assert (info.value.workflow_id, info.value.step) == ("wf", 4)
        with pytest.raises(CheckpointCorruptedError):
            await small.load("wf", 4)
        with pytest.raises(CheckpointCorruptedError):
            await small.scan("wf")
        assert await small.exists("wf", 4)


async def test_not_a_database_maps_to_backend_error(db: Path) -> None:
    """A file that is not a SQLite database raises StorageBackendError chaining sqlite3's."""
    write(db, b"this is not a database, just some text" * 100)
    async with SQLiteCheckpointStorage(db) as storage:
        with pytest.raises(StorageBackendError) as info:
            await storage.load("wf")
        assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


async def test_unopenable_path_maps_to_backend_error(tmp_path: Path) -> None:
    """A path that is a directory raises StorageBackendError, and a later call retries."""
    (tmp_path / "dir.db").mkdir()
    async with SQLiteCheckpointStorage(tmp_path / "dir.db") as storage:
        for _ in range(2):
            with pytest.raises(StorageBackendError) as info:
                await storage.save("wf", 0, b"x")
            assert isinstance(info.value.__cause__, (OSError, sqlite3.Error))


@pytest.mark.parametrize(
    "kwargs",
    [{"max_record_bytes": 0}, {"busy_timeout": -1}, {"readers": 0}, {"max_batch": "8"}],
)
def test_bad_options_are_refused(db: Path, kwargs: dict[str, object]) -> None:
    """Out-of-range constructor options raise InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError):
        SQLiteCheckpointStorage(db, **kwargs)  # type: ignore[arg-type]
