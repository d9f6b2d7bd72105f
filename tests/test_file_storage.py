"""FileCheckpointStorage specifics: names, layout, privacy, hint, integrity, cancellation."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    InvalidArgumentError,
    StorageSchemaError,
    open_storage,
)
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.names import (
    MAX_PLAIN_NAME,
    Hint,
    decode_name,
    encode_name,
    parse_step_name,
    step_name,
    temp_name,
)

ids = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1
).filter(lambda s: len(s.encode()) <= 255)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FileCheckpointStorage]:
    s = FileCheckpointStorage(tmp_path / "store")
    yield s
    await s.close()


def all_entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


def temp_litter(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.name.startswith((".tmp-", ".new-", ".del-"))]


# --- name encoding ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wf", "name"),
    [
        ("a/b", "a%2Fb"),
        ("a_b", "a_b"),
        ("a%2Fb", "a%252%46b"),
        ("a%2fb", "a%252fb"),
        ("..", "%2E."),
        (".hidden", "%2Ehidden"),
        ("a.b", "a.b"),
        ("A/B", "%41%2F%42"),
        ("wf-1", "wf-1"),
        ("é", "%C3%A9"),
        ("#1", "%231"),
        ("Plan", "%50lan"),
        ("../../etc/passwd", "%2E.%2F..%2Fetc%2Fpasswd"),
    ],
)
def test_encoding_examples(wf: str, name: str) -> None:
    """The documented examples of the name encoding hold and decode back exactly."""
    assert encode_name(wf) == name
    assert decode_name(name) == wf


@settings(max_examples=300, deadline=None)
@given(ids, ids)
def test_encoding_is_collision_free_even_ignoring_case(a: str, b: str) -> None:
    """Different ids never map to names equal up to case, and plain names decode exactly."""
    na, nb = encode_name(a), encode_name(b)
    if a != b:
        assert na.lower() != nb.lower()
    for wf, name in ((a, na), (b, nb)):
        assert len(name.encode()) <= MAX_PLAIN_NAME
        assert "/" not in name and name not in (".", "..") and not name.startswith(".")
        if not name.startswith("#"):
            assert decode_name(name) == wf


@pytest.mark.parametrize("name", ["%61", "%2e.", "A", "%2", "x%ZZ", ".x", "lost+found", "%FF"])
def test_non_canonical_names_do_not_decode(name: str) -> None:
    """Names that encode_name would never produce are not taken for workflows."""
    assert decode_name(name) is None


def test_step_names_sort_numerically() -> None:
    """Step file names are fixed width, so name order is step order."""
    steps = [0, 9, 10, 2**63 - 1, 123456789]
    names = sorted(step_name(s) for s in steps)
    assert [parse_step_name(n) for n in names] == sorted(steps)
    assert parse_step_name(".tmp-1-2-abc") is None
    assert parse_step_name("99999999999999999999.ckpt") is None  # over 2**63 - 1


async def test_traversal_ids_stay_inside_base_dir(tmp_path: Path) -> None:
    """Ids shaped like paths never create anything outside the store's directory."""
    base = tmp_path / "inner" / "store"
    store = FileCheckpointStorage(base)
    hostile = ["..", "../..", "../../escape", "/abs/path", "./x", "a/../../b", "~", "\\..\\x"]
    for n, wf in enumerate(hostile):
        await store.save(wf, n, b"data")
    outside = [p for p in all_entries(tmp_path) if base not in p.parents and p != base]
    assert outside == [tmp_path / "inner"]
    assert await store.list_workflows() == sorted(hostile)
    await store.close()


async def test_long_ids_use_hashed_directories(store: FileCheckpointStorage) -> None:
    """Ids whose encoding is too long get a hash-named directory holding the exact id."""
    long_ids = ["é" * 127, "日" * 85, "x" * 255, "A" * 100]
    for wf in long_ids:
        await store.save(wf, 0, b"v")
        path = Path(store.workflow_dir(wf))
        assert path.name.startswith("#") and len(path.name) == 65
        assert (path / "id").read_bytes() == wf.encode()
    assert await store.list_workflows() == sorted(long_ids)


async def test_foreign_directories_are_not_workflows(store: FileCheckpointStorage) -> None:
    """Directories that are not canonical encodings, or hashed dirs with a wrong id, are ignored."""
    await store.save("real", 0, b"v")
    root = Path(store.base_dir) / "workflows"
    for foreign in ("lost+found", "UPPER", "%61", "#" + "0" * 64):
        (root / foreign).mkdir()
        (root / foreign / step_name(0)).write_bytes(b"x")
    (root / ("#" + "0" * 64) / "id").write_bytes(b"not-the-hashed-id")
    assert await store.list_workflows() == ["real"]


# --- layout, privacy, format marker ----------------------------------------------------


async def test_files_are_private_regardless_of_umask(tmp_path: Path) -> None:
    """With umask 0 the store still creates 0700 directories and 0600 files."""
    old = os.umask(0)
    try:
        store = FileCheckpointStorage(tmp_path / "store")
        await store.save("wf", 0, b"secret", keep_last=5)
        await store.save("a" * 250, 0, b"secret")
        await store.close()
    finally:
        os.umask(old)
    for path in [tmp_path / "store", *all_entries(tmp_path / "store")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path


async def test_construction_and_reads_touch_nothing(tmp_path: Path) -> None:
    """Creating a store and reading from a missing one creates no files."""
    store = FileCheckpointStorage(tmp_path / "nothing")
    assert await store.load("wf") is None
    assert await store.scan("wf") == []
    assert await store.list_workflows() == []
    assert not await store.exists("wf")
    assert await store.delete("wf") is False
    assert not (tmp_path / "nothing").exists()
    await store.close()


async def test_format_marker_written_on_first_write(store: FileCheckpointStorage) -> None:
    """The first write creates aiocheckpoint.json naming format 1."""
    await store.save("wf", 0, b"x")
    marker = Path(store.base_dir) / "aiocheckpoint.json"
    assert json.loads(marker.read_text()) == {"format": 1}


@pytest.mark.parametrize("content", [b'{"format": 4}', b"garbage", b'{"format": "1"}'])
async def test_newer_or_unknown_format_is_refused(tmp_path: Path, content: bytes) -> None:
    """A store marked with a newer or unreadable format is refused for reads and writes."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "aiocheckpoint.json").write_bytes(content)
    store = FileCheckpointStorage(tmp_path / "store")
    with pytest.raises(StorageSchemaError):
        await store.load("wf")
    with pytest.raises(StorageSchemaError):
        await store.save("wf", 0, b"x")
    assert not (tmp_path / "store" / "workflows").exists()
    await store.close()


async def test_open_storage_file_url(tmp_path: Path) -> None:
    """open_storage('file://...') builds a FileCheckpointStorage with the options given."""
    store = open_storage(f"file://{tmp_path}/s", max_record_bytes=1000)
    assert isinstance(store, FileCheckpointStorage)
    assert store.base_dir == f"{tmp_path}/s" and store.max_record_bytes == 1000
    await store.close()


# --- integrity -------------------------------------------------------------------------


async def test_truncated_and_flipped_files_fall_back(
    store: FileCheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """Damaged newest files raise CheckpointCorruptedError; resume falls back with a warning."""
    manager = CheckpointManager(store)
    for step in range(3):
        await manager.create_checkpoint("wf", step, "a", "completed", {"n": step})
    wdir = Path(store.workflow_dir("wf"))
    two = wdir / step_name(2)
    two.write_bytes(two.read_bytes()[:-5])
    one = wdir / step_name(1)
    data = bytearray(one.read_bytes())
    data[30] ^= 0x40
    one.write_bytes(bytes(data))
    for step in (1, 2):
        with pytest.raises(CheckpointCorruptedError) as info:
            await manager.get_checkpoint("wf", step)
        assert (info.value.workflow_id, info.value.step) == ("wf", step)
    with caplog.at_level(logging.WARNING, logger="aiocheckpoint"):
        point = await manager.get_resume_point("wf")
    assert point is not None and point[0] == 1 and point[1].data == {"n": 0}
    assert "corrupted" in caplog.text


async def test_foreign_files_are_ignored_or_reported(store: FileCheckpointStorage) -> None:
    """Files not named like steps are ignored; a foreign file named like a step is corrupted."""
    manager = CheckpointManager(store)
    await manager.create_checkpoint("wf", 1, "a", "completed", {"n": 1})
    wdir = Path(store.workflow_dir("wf"))
    (wdir / "notes.txt").write_text("hello")
    (wdir / "5.ckpt").write_text("short name")
    assert [c.step for c in await manager.list_checkpoints("wf")] == [1]
    (wdir / step_name(3)).write_bytes(b"<html>not a record</html>")
    with pytest.raises(CheckpointCorruptedError):
        await manager.get_checkpoint("wf", 3)
    (wdir / step_name(4)).mkdir()
    with pytest.raises(CheckpointCorruptedError):
        await store.load("wf", 4)


async def test_oversized_records_refused_both_ways(tmp_path: Path) -> None:
    """Saving over max_record_bytes writes nothing; reading an over-limit file is corruption."""
    store = FileCheckpointStorage(tmp_path / "s", max_record_bytes=1000)
    await store.save("wf", 0, b"x" * 1000)
    with pytest.raises(InvalidArgumentError):
        await store.save("wf", 1, b"x" * 1001)
    assert [r.step for r in await store.scan("wf")] == [0]
    (Path(store.workflow_dir("wf")) / step_name(2)).write_bytes(b"y" * 5000)
    with pytest.raises(CheckpointCorruptedError) as info:
        await store.load("wf", 2)
    assert (info.value.workflow_id, info.value.step) == ("wf", 2)
    await store.close()


# --- the latest-step hint ---------------------------------------------------------------


def _write_hint(store: FileCheckpointStorage, wf: str, step: int | None) -> None:
    wdir = Path(store.workflow_dir(wf))
    (wdir / "latest").write_bytes(Hint(step, wdir.stat().st_ino).pack())


async def test_garbage_hint_is_rebuilt(store: FileCheckpointStorage) -> None:
    """A torn or foreign hint file never changes what load() returns."""
    for step in range(5):
        await store.save("wf", step, b"%d" % step)
    (Path(store.workflow_dir("wf")) / "latest").write_bytes(b"\x00garbage")
    latest = await store.load("wf")
    assert latest is not None and latest.step == 4
    assert Hint.unpack((Path(store.workflow_dir("wf")) / "latest").read_bytes()) is not None


async def test_hint_ahead_of_files_falls_back_to_scan(store: FileCheckpointStorage) -> None:
    """A hint naming a step whose write never finished (crash before rename) is skipped."""
    for step in range(3):
        await store.save("wf", step, b"%d" % step)
    _write_hint(store, "wf", 9)
    latest = await store.load("wf")
    assert latest is not None and latest.step == 2
    assert await store.exists("wf")


async def test_copied_directory_does_not_trust_its_hint(store: FileCheckpointStorage) -> None:
    """A workflow directory restored from an older copy of its hint rebuilds the hint."""
    for step in range(3):
        await store.save("wf", step, b"%d" % step)
    wdir = Path(store.workflow_dir("wf"))
    stale = Hint(0, os.stat(wdir).st_ino).pack()  # what a backup taken at step 0 would hold
    shutil.move(wdir, wdir.with_name("moved"))
    shutil.copytree(wdir.with_name("moved"), wdir)  # a copy: a new inode
    (wdir / "latest").write_bytes(stale)
    latest = await store.load("wf")
    assert latest is not None and latest.step == 2
    await store.save("wf", 1, b"again")  # a writer must not trust it either
    latest = await store.load("wf")
    assert latest is not None and latest.step == 2


async def test_deleting_latest_updates_hint_for_other_instances(tmp_path: Path) -> None:
    """After one instance deletes the top step, another's latest is the next highest."""
    a = FileCheckpointStorage(tmp_path / "s")
    b = FileCheckpointStorage(tmp_path / "s")
    for step in (0, 3, 7):
        await a.save("wf", step, b"%d" % step)
    got = await b.load("wf")
    assert got is not None and got.step == 7
    assert await a.delete("wf", 7)
    got = await b.load("wf")
    assert got is not None and got.step == 3
    assert await a.delete("wf", 0)
    assert await a.delete("wf", 3)
    assert await b.load("wf") is None and not await b.exists("wf")
    await a.close()
    await b.close()


# --- temp files, cancellation, concurrency ---------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def test_stale_temp_files_ignored_and_swept(store: FileCheckpointStorage) -> None:
    """Temp files of dead writers are invisible to readers and removed by the next writer."""
    await store.save("wf", 0, b"x")
    wdir = Path(store.workflow_dir("wf"))
    ns = temp_name().split("-")[1]
    dead = wdir / f".tmp-{ns}-{_dead_pid()}-deadbeef"
    dead.write_bytes(b"half")
    live_young = wdir / f".tmp-{ns}-1-cafe"  # pid 1 is alive
    live_young.write_bytes(b"in flight")
    live_old = wdir / f".tmp-{ns}-1-0ld"
    live_old.write_bytes(b"abandoned")
    os.utime(live_old, (1, 1))
    assert [r.step for r in await store.scan("wf")] == [0]
    fresh = FileCheckpointStorage(store.base_dir)
    await fresh.save("wf", 1, b"y")
    assert not dead.exists() and not live_old.exists()
    assert live_young.exists()
    await fresh.close()


async def test_cancelled_save_is_all_or_nothing(store: FileCheckpointStorage) -> None:
    """A save cancelled at a random moment lands whole or not at all, and leaves no temp file."""
    data = os.urandom(4 * 1024 * 1024)
    await store.save("wf", 0, b"base")
    outcomes = set()
    for n in range(1, 16):
        with anyio.move_on_after(n * 0.002):
            await store.save("wf", n, data)
        got = await store.load("wf", n)
        assert got is None or got.data == data
        outcomes.add(got is not None)
        assert temp_litter(Path(store.base_dir)) == []
    base = await store.load("wf", 0)
    assert base is not None and base.data == b"base"
    assert True in outcomes  # the longest timeouts let saves finish


async def test_concurrent_retention_keeps_newest(store: FileCheckpointStorage) -> None:
    """Many tasks saving with keep_last leave exactly the newest N steps."""
    async with anyio.create_task_group() as tg:
        for step in range(120):
            tg.start_soon(lambda s=step: store.save("wf", s, b"%d" % s, keep_last=4))
    assert [r.step for r in await store.scan("wf")] == [116, 117, 118, 119]


async def test_delete_workflow_races_with_writers(store: FileCheckpointStorage) -> None:
    """Deleting a workflow while tasks write to it never errors or leaves half a workflow."""
    async with anyio.create_task_group() as tg:
        for step in range(60):
            tg.start_soon(store.save, "wf", step, b"%d" % step)
            if step % 15 == 7:
                tg.start_soon(store.delete, "wf")
    steps = [r.step for r in await store.scan("wf")]
    latest = await store.load("wf")
    assert (latest.step if latest else None) == (max(steps) if steps else None)
    await store.delete("wf")
    assert await store.list_workflows() == []
    assert temp_litter(Path(store.base_dir)) == []


async def test_missing_ancestors_are_created(tmp_path: Path) -> None:
    """A base_dir several levels below an existing directory is created on first write."""
    base = tmp_path / "a" / "b" / "store"
    async with FileCheckpointStorage(base) as store:
        await store.save("wf", 0, b"x")
        assert await store.list_workflows() == ["wf"]
    assert stat.S_IMODE(os.stat(base).st_mode) == 0o700
