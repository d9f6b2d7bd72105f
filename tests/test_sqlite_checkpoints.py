"""SQLite WAL checkpoint scheduling: checkpoints run beside the commits, never inside one.

The writer connection has SQLite's automatic checkpoint off; a background connection runs
PASSIVE checkpoints, the writer finishes one between two batches when the WAL is long, and
close truncates the WAL (docs/sqlite-storage.md "WAL checkpoints"). These tests write real
databases and use real reader processes.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager
from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2
from aiocheckpoint.storage.base import StoredCheckpoint
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage, groupcommit
from aiocheckpoint.storage.sqlite import walcheckpoint as sqldb

RECORD = 64 * 1024  # 16 pages: the WAL grows fast with few commits
PAGE = 4096
# How far past the limit the WAL may run: the frames committed during one background
# checkpoint (docs/sqlite-storage.md, "The bound"), which a loaded machine stretches: ~2,100
# with two whole test runs at once on two cores.
SLACK_PAGES = 3 * sqldb.CHECKPOINT_PAGES

# A reader in another process: "open" attaches to the database without a transaction,
# "hold" starts a read transaction (a snapshot), "release" ends it; it exits at end of input.
_READER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "open":
        conn.execute("SELECT count(*) FROM checkpoints").fetchall()
    elif cmd == "hold":
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM checkpoints").fetchall()
    elif cmd == "release":
        conn.execute("COMMIT")
    print("ok", flush=True)
conn.close()
"""


class Reader:
    """Drives the reader process one command at a time."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def __call__(self, cmd: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok", f"reader failed on {cmd!r}"


@contextmanager
def reader_process(db: Path) -> Iterator[Reader]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield Reader(proc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def wal_size(db: Path, missing: int = 0) -> int:
    wal = Path(f"{db}-wal")
    return wal.stat().st_size if wal.exists() else missing


async def write_steadily(store: SQLiteCheckpointStorage, workers: int, each: int) -> None:
    """``workers`` callers saving back to back: the writer is never idle meanwhile."""
    data = os.urandom(RECORD)

    async def worker(n: int) -> None:
        for step in range(each):
            await store.save(f"wf-{n}", step, data, keep_last=2)

    await asyncio.gather(*(worker(n) for n in range(workers)))


async def wait_for_full_checkpoint(store: SQLiteCheckpointStorage) -> sqldb.CheckpointResult:
    """Wait until the background checkpointer reports the whole WAL copied."""
    for _ in range(500):
        last = store._checkpointer.last
        if store._checkpointing is None and last is not None and last.done == last.log:
            return last
        await asyncio.sleep(0.01)
    raise AssertionError(f"no complete checkpoint; last: {store._checkpointer.last}")


def test_the_writer_does_not_checkpoint_on_commit(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def main() -> None:
        store = SQLiteCheckpointStorage(db)
        await store.save("wf", 0, b"x")
        assert store._writer.conn is not None
        pages = store._writer.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert pages == 0
        await store.close()

    asyncio.run(main())


def test_wal_stays_bounded_when_the_writer_is_never_idle(tmp_path: Path) -> None:
    db = tmp_path / "bounded.db"
    written = 0

    async def main() -> None:
        nonlocal written
        store = SQLiteCheckpointStorage(db)
        largest = 0
        for _ in range(10):  # 120 MiB in all, over 3x the bound
            await write_steadily(store, workers=8, each=24)
            written += 8 * 24 * RECORD
            largest = max(largest, wal_size(db))
        assert store._checkpointer.runs >= 3
        assert store._writer.checkpoints >= 1  # it caught up at least once
        assert largest <= (sqldb.WAL_LIMIT_PAGES + SLACK_PAGES) * (PAGE + 24) + 32
        await store.close()

    asyncio.run(main())
    assert written > 3 * (sqldb.WAL_LIMIT_PAGES + SLACK_PAGES) * PAGE


def test_a_reader_snapshot_delays_checkpoints_but_never_a_save(tmp_path: Path) -> None:
    db = tmp_path / "snapshot.db"

    async def main() -> None:
        store = SQLiteCheckpointStorage(db)
        await store.save("solo", 0, b"first")
        with reader_process(db) as reader:
            reader("hold")
            # While the snapshot is held the WAL cannot be copied past it nor started over.
            await write_steadily(store, workers=8, each=30)  # ~15 MiB
            await wait_for_idle(store)
            held = store._checkpointer.last
            assert held is not None and held.done < held.log
            assert wal_size(db) > 8 * 30 * RECORD
            assert (await store.load("wf-7")) is not None
            reader("release")
            # Once idle after this write, a checkpoint copies the whole WAL (unless the
            # writer's catch-up did before this write, which then started the WAL over).
            await store.save("solo", 1, b"after")
            await wait_for_full_checkpoint(store)
            await store.save("solo", 2, b"restart")  # starts the WAL over
            await wait_for_idle(store)
            with sqlite3.connect(db) as probe:
                busy, log, _done = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            assert busy == 0 and log < 100  # only the last write's frames
            reader("hold")
            await store.save("solo", 3, b"last")  # frames the snapshot does not see
            await store.close()  # it cannot truncate under the snapshot, and does not wait
            assert wal_size(db) > 0
            reader("release")
        restored = SQLiteCheckpointStorage(db)
        assert (await restored.load("solo")) == StoredCheckpoint(3, b"last")
        await restored.close()

    asyncio.run(main())


def test_close_truncates_the_wal_while_another_process_has_the_file_open(
    tmp_path: Path,
) -> None:
    db = tmp_path / "close.db"

    async def main() -> None:
        store = SQLiteCheckpointStorage(db)
        await store.save("wf-0", 0, b"x")
        with reader_process(db) as reader:
            reader("open")  # attached, so this close is not the last one
            await write_steadily(store, workers=4, each=20)
            assert wal_size(db) > 0
            await store.close()
            # Without the truncation at close the WAL would stay as long as it grew.
            assert wal_size(db, missing=-1) == 0

    asyncio.run(main())


async def wait_for_idle(store: SQLiteCheckpointStorage) -> None:
    """Wait until queued writes are committed and no background checkpoint runs."""
    await store._flush()
    while (running := store._checkpointing) is not None:
        await asyncio.wait([running])


def test_an_idle_writer_gets_its_wal_checkpointed(tmp_path: Path) -> None:
    db = tmp_path / "idle.db"

    async def main() -> None:
        store = SQLiteCheckpointStorage(db)
        for step in range(3):  # far below the page threshold
            await store.save("wf", step, b"x" * 100)
        last = await wait_for_full_checkpoint(store)  # the idle timer starts one
        assert last.log > 0 and not last.busy
        assert store._writer.wal_pages == 0
        await store.close()

    asyncio.run(main())


def test_the_page_estimate_counts_the_blobs_a_tree_save_inserts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree save whose blobs are all stored adds the record's pages, not the tree's.

    A split made from cached sub-trees names every blob of the state: counting them all
    started a WAL checkpoint every other save of a growing chat.
    """
    monkeypatch.setattr(groupcommit, "_IDLE_SECONDS", 3600.0)  # no idle checkpoint resets it
    db = tmp_path / "tree.db"
    state = {"docs": [f"doc {i} " + "lorem ipsum " * 400 for i in range(50)]}  # ~250 KB

    async def main() -> None:
        store = SQLiteCheckpointStorage(db)
        manager = CheckpointManager(InMemoryCheckpointStorage())
        checkpoint = await manager.create_checkpoint("wf", 1, "a", "running", state)
        record, split = encode_checkpoint_v2(checkpoint, store.blob_params)
        blob_pages = split.stored_bytes() // PAGE
        assert blob_pages > 50
        await store.save_tree("wf", 1, record, split)
        first = store._writer.wal_pages
        assert first >= blob_pages  # the blobs were inserted
        await store.save_tree("wf", 2, record, split)  # the same tree: every blob is stored
        # The record's pages, two per save, one per count updated (the root's references),
        # one for the pointer map of the auto_vacuum store.
        assert store._writer.wal_pages - first <= len(record) // PAGE + 3 + len(split.root_refs)
        await store.close()

    asyncio.run(main())
