"""A file store whose directory holds anything (issue #22, items 5-8 and 12, file store).

Real FIFOs, real sparse files, real directories where step files belong, real directories
owned by another uid (those tests are in the ``root`` tier). A planted FIFO must never make a
call wait for a writer: each such test runs the call under a :class:`Watchdog` that, if the
call is still blocked after a while, opens the FIFO's other end to release it and records
that it had to (so a hang fails the test instead of hanging the suite).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

import pytest

from aiocheckpoint import CheckpointCorruptedError, CheckpointManager, StorageSchemaError
from aiocheckpoint.errors import StoragePermissionError
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.names import encode_name, hashed_name, step_name

#: A state large enough to be stored incrementally (a version-2 record and blobs).
BIG = {"doc": " ".join(f"word{i}" for i in range(4000))}
OTHER_UID = 65534  # nobody


class Watchdog:
    """Releases calls blocked on ``fifos`` after ``seconds``; ``fired`` if it had to."""

    def __init__(self, *fifos: Path, seconds: float = 10.0) -> None:
        self.fifos = fifos
        self.seconds = seconds
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.fired = True
        while not self._done.wait(0.2):  # a blocked open of either end completes
            for fifo in self.fifos:
                for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
                    with contextlib.suppress(OSError):
                        os.close(os.open(fifo, flags))


def plant_fifo(path: Path) -> Path:
    """Replace whatever is at ``path`` by a FIFO."""
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FileCheckpointStorage]:
    s = FileCheckpointStorage(tmp_path / "store")
    yield s
    await s.close()


async def three_steps(store: FileCheckpointStorage, state: object = None) -> CheckpointManager:
    manager = CheckpointManager(store)
    for step in range(3):
        data = {"n": step} if state is None else {**state, "n": step}  # type: ignore[dict-item]
        await manager.create_checkpoint("wf", step, "agent", "completed", data)
    return manager


# --- item 5: FIFOs are never waited on -----------------------------------------------------


async def test_a_fifo_at_the_latest_step_is_corruption_and_resume_falls_back(
    store: FileCheckpointStorage,
) -> None:
    """A FIFO in place of the latest step file: load raises CheckpointCorruptedError naming
    the step (without waiting for a writer) and get_resume_point resumes from the step before.
    """
    manager = await three_steps(store)
    fifo = plant_fifo(Path(store.workflow_dir("wf")) / step_name(2))
    with Watchdog(fifo) as watchdog:
        with pytest.raises(CheckpointCorruptedError) as info:
            await store.load("wf")
        point = await manager.get_resume_point("wf")
    assert not watchdog.fired
    assert (info.value.workflow_id, info.value.step) == ("wf", 2)
    assert point is not None and point[0] == 2 and point[1].data == {"n": 1}


async def test_a_fifo_as_the_latest_hint_is_ignored_and_replaced(
    store: FileCheckpointStorage,
) -> None:
    """A FIFO in place of the ``latest`` hint: reads find the top by a scan, and the next
    write puts a regular hint file back."""
    manager = await three_steps(store)
    hint = plant_fifo(Path(store.workflow_dir("wf")) / "latest")
    with Watchdog(hint) as watchdog:
        latest = await store.load("wf")
        await manager.create_checkpoint("wf", 3, "agent", "completed", {"n": 3})
        again = await store.load("wf")
    assert not watchdog.fired
    assert latest is not None and latest.step == 2
    assert again is not None and again.step == 3
    assert hint.is_file()


async def test_a_fifo_as_the_id_of_a_hashed_directory_is_skipped(
    store: FileCheckpointStorage,
) -> None:
    """A FIFO in place of a hash-named directory's ``id``: the directory is skipped."""
    long_id = "x" * 250
    await store.save(long_id, 0, b"v")
    await store.save("short", 0, b"v")
    fifo = plant_fifo(Path(store.workflow_dir(long_id)) / "id")
    with Watchdog(fifo) as watchdog:
        listed = await store.list_workflows()
    assert not watchdog.fired
    assert listed == ["short"]


async def test_a_fifo_as_the_format_marker_is_refused(store: FileCheckpointStorage) -> None:
    """A FIFO in place of ``aiocheckpoint.json``: StorageSchemaError, not a wait."""
    await store.save("wf", 0, b"v")
    fifo = plant_fifo(Path(store.base_dir) / "aiocheckpoint.json")
    fresh = FileCheckpointStorage(store.base_dir)
    with Watchdog(fifo) as watchdog, pytest.raises(StorageSchemaError):
        await fresh.load("wf")
    await fresh.close()
    assert not watchdog.fired


async def test_a_fifo_at_a_step_path_does_not_stop_garbage_collection(
    store: FileCheckpointStorage,
) -> None:
    """collect_garbage skips (and reports) a FIFO where a record belongs; it never waits."""
    manager = await three_steps(store, BIG)
    fifo = plant_fifo(Path(store.workflow_dir("wf")) / step_name(0))
    with Watchdog(fifo) as watchdog:
        await store.collect_garbage(grace=0)
        latest = await manager.get_latest_checkpoint("wf")
    assert not watchdog.fired
    assert latest is not None and latest.state_snapshot.data == {**BIG, "n": 2}


# --- item 6: garbage collection reads as load does -----------------------------------------


async def test_a_huge_sparse_step_file_is_skipped_by_gc_without_reading_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sparse step file far over max_record_bytes, with a version-2 header, is reported and
    skipped by a sweep (also the one a delete triggers) while the sweep allocates little."""
    store = FileCheckpointStorage(tmp_path / "store", max_record_bytes=1 << 20, gc_interval=1)
    manager = await three_steps(store, BIG)
    await manager.create_checkpoint("other", 0, "agent", "completed", BIG)
    wdir = Path(store.workflow_dir("wf"))
    head = (wdir / step_name(2)).read_bytes()[:20]  # a real version-2 header
    with (wdir / step_name(7)).open("wb") as f:
        f.write(head)
        f.truncate(256 << 20)
    (Path(store.blob_dir) / "gc.lock").touch()
    os.utime(Path(store.blob_dir) / "gc.lock", (0, 0))  # the next delete sweeps
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger="aiocheckpoint"):
            assert await manager.delete_checkpoints("other")
            await store.collect_garbage(grace=0)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    assert "over max_record_bytes" in caplog.text
    assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == {**BIG, "n": 1}
    await store.close()


async def test_a_directory_at_a_step_path_does_not_stop_garbage_collection(
    store: FileCheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory where a record belongs is reported and skipped: unreferenced blobs are
    still reclaimed."""
    manager = await three_steps(store, BIG)
    await manager.create_checkpoint("gone", 0, "agent", "completed", {"doc": BIG["doc"][::-1]})
    await manager.delete_checkpoints("gone")
    (Path(store.workflow_dir("wf")) / step_name(9)).mkdir()
    with caplog.at_level(logging.WARNING, logger="aiocheckpoint"):
        freed = await store.collect_garbage(grace=0)
    assert freed > 0
    assert "not a regular file" in caplog.text
    latest = await manager.get_latest_checkpoint("wf")
    assert latest is not None and latest.state_snapshot.data == {**BIG, "n": 2}


# --- item 7: a store directory another user controls ---------------------------------------


async def forge(base: Path) -> None:
    """A store with one forged checkpoint of workflow "wf", as an attacker would plant it."""
    async with FileCheckpointStorage(base, allow_shared=True) as forger:
        await CheckpointManager(forger).create_checkpoint(
            "wf", 5, "agent", "completed", {"forged": True}
        )


def chown_tree(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)


@pytest.mark.root  # chowns to another uid
async def test_a_store_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A store (with a forged record) whose directory belongs to another uid is refused with
    StoragePermissionError by reads and writes alike; allow_shared=True opts in."""
    base = tmp_path / "shared"
    await forge(base)
    chown_tree(base, OTHER_UID)
    async with FileCheckpointStorage(base) as victim:
        manager = CheckpointManager(victim)
        with pytest.raises(StoragePermissionError, match="belongs to uid 65534"):
            await manager.get_resume_point("wf")
        with pytest.raises(StoragePermissionError):
            await manager.create_checkpoint("wf", 6, "agent", "completed", {"mine": True})
    assert sorted(p.name for p in (base / "workflows").iterdir()) == ["wf"]
    async with FileCheckpointStorage(base, allow_shared=True) as opted_in:
        point = await CheckpointManager(opted_in).get_resume_point("wf")
        assert point is not None and point[1].data == {"forged": True}


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o720])
async def test_a_store_directory_others_may_write_into_is_refused(
    tmp_path: Path, mode: int
) -> None:
    """A store directory writable by group or others (even sticky) is refused."""
    base = tmp_path / "loose"
    await forge(base)
    base.chmod(mode)
    async with FileCheckpointStorage(base) as victim:
        with pytest.raises(StoragePermissionError, match="group or others"):
            await victim.load("wf")


@pytest.mark.root  # chowns to another uid
async def test_a_workflows_directory_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    """Our own private store directory holding another uid's ``workflows/`` is refused."""
    base = tmp_path / "store"
    await forge(base)
    chown_tree(base / "workflows", OTHER_UID)
    async with FileCheckpointStorage(base) as victim:
        with pytest.raises(StoragePermissionError):
            await victim.list_workflows()


async def test_a_private_store_is_accepted_and_created_private(tmp_path: Path) -> None:
    """The store's own directories (created by it, or by the user 0700/0755) are accepted."""
    made = tmp_path / "made"
    made.mkdir(mode=0o755)
    for base in (tmp_path / "new", made):
        async with FileCheckpointStorage(base) as storage:
            await storage.save("wf", 0, b"v")
            got = await storage.load("wf")
            assert got is not None and got.data == b"v"


# --- item 8: only the canonical directory of an id counts ----------------------------------


def plant_hashed(store: FileCheckpointStorage, raw_id: bytes) -> None:
    """A hash-named directory for ``raw_id`` with a step file, as a forger would make it."""
    wdir = Path(store.base_dir) / "workflows" / hashed_name(raw_id)
    wdir.mkdir()
    (wdir / "id").write_bytes(raw_id)
    (wdir / step_name(0)).write_bytes(b"forged")


async def test_a_hashed_directory_for_a_short_id_is_not_that_workflow(
    store: FileCheckpointStorage,
) -> None:
    """A hash-named directory for an id whose canonical directory is its plain name is
    skipped: the id is listed once, and it is the plain directory's."""
    await store.save("wf", 0, b"mine")
    await store.save("other", 0, b"v")
    plant_hashed(store, b"wf")
    assert await store.list_workflows() == ["other", "wf"]
    assert encode_name("wf") == "wf"
    got = await store.load("wf")
    assert got is not None and got.data == b"mine"


@pytest.mark.parametrize("raw_id", [b"nul\x00" + b"x" * 250, b"y" * 300, b"\xff" * 240])
async def test_a_hashed_directory_with_an_invalid_id_is_skipped(
    store: FileCheckpointStorage, raw_id: bytes
) -> None:
    """A hash-named directory whose ``id`` is no valid workflow id (NUL, over 255 bytes, not
    UTF-8) is not listed."""
    await store.save("wf", 0, b"v")
    plant_hashed(store, raw_id)
    assert await store.list_workflows() == ["wf"]
    [entry] = await store.foreign_entries()
    assert entry.path == f"workflows/{hashed_name(raw_id)}"
    assert "id file" in entry.reason


async def test_foreign_entries_name_what_listings_skip_and_nothing_of_ours(
    store: FileCheckpointStorage,
) -> None:
    """foreign_entries() reports each entry of workflows/ that listings skip (a name that is
    no id's, a hashed directory for a short id, a file, a symlink), by path and reason; the
    store's own directories (plain, hashed, emptied) and its temporaries are not reported."""
    assert await store.foreign_entries() == []  # nothing written yet
    for workflow_id in ("wf", "e" * 250, "emptied"):
        await store.save(workflow_id, 0, b"v")
    await store.delete("emptied", 0)
    root = Path(store.base_dir) / "workflows"
    (root / "UPPER").mkdir()
    plant_hashed(store, b"wf")
    (root / "notes.txt").write_bytes(b"x")
    (root / "link").symlink_to(root / "wf")
    (root / ".new-0-1-x").mkdir()
    assert {(e.path, e.reason) for e in await store.foreign_entries()} == {
        ("workflows/UPPER", "not the directory name of any workflow id"),
        (
            f"workflows/{hashed_name(b'wf')}",
            "a hashed directory whose id file is missing or names no workflow stored here",
        ),
        ("workflows/notes.txt", "not a directory"),
        ("workflows/link", "not a directory"),
    }
    assert await store.list_workflows() == sorted(["e" * 250, "wf"])


# --- item 12: the storage's own refusals fall back like decoding failures ------------------


async def test_resume_falls_back_when_the_latest_record_is_over_the_limit(
    tmp_path: Path,
) -> None:
    """The latest step file padded past max_record_bytes: the store refuses it, and
    get_resume_point resumes from the newest record it can read."""
    store = FileCheckpointStorage(tmp_path / "store", max_record_bytes=64 * 1024)
    manager = await three_steps(store)
    with (Path(store.workflow_dir("wf")) / step_name(2)).open("ab") as f:
        f.truncate(128 * 1024)
    with pytest.raises(CheckpointCorruptedError):
        await store.load("wf")
    point = await manager.get_resume_point("wf")
    assert point is not None and point[0] == 2 and point[1].data == {"n": 1}
    await store.close()


async def test_resume_falls_back_when_a_directory_is_at_the_latest_step_path(
    store: FileCheckpointStorage,
) -> None:
    """A directory where the latest step file belongs: resume from the step before."""
    manager = await three_steps(store)
    latest = Path(store.workflow_dir("wf")) / step_name(2)
    latest.unlink()
    latest.mkdir()
    point = await manager.get_resume_point("wf")
    assert point is not None and point[0] == 2 and point[1].data == {"n": 1}


async def test_resume_pages_past_a_refused_record_below_the_latest(
    store: FileCheckpointStorage,
) -> None:
    """The latest record damaged and the one before it a directory: resume from step 0."""
    manager = await three_steps(store)
    wdir = Path(store.workflow_dir("wf"))
    top = wdir / step_name(2)
    top.write_bytes(top.read_bytes()[:-3])
    (wdir / step_name(1)).unlink()
    (wdir / step_name(1)).mkdir()
    point = await manager.get_resume_point("wf")
    assert point is not None and point[0] == 1 and point[1].data == {"n": 0}
