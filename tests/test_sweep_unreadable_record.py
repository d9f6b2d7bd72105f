"""A sweep never deletes a blob that a record it cannot read might name, on every backend.

The newest checkpoint of a workflow whose state is stored as blobs is damaged in the real
store (its bytes cut short or changed in the file, the row, the dict), and another
workflow's blobs are left as garbage. A sweep then thins and collects: the damaged
record's blobs all stay (the file store, which finds blobs by reading the records, deletes
none and says so in the report; the stores that count references keep the damaged
record's counts), so that the record's good copy, put back, reads whole. Once it is back,
the garbage is collected.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    Keyring,
    RetentionPolicy,
)
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.names import step_name
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.backend_support import ALL, make_storage, pg_schema
from tests.pg_support import DSN

__all__ = ["pg_schema"]

Damage = Callable[[bytes], bytes]
DAMAGES: dict[str, Damage] = {
    "cut short": lambda good: good[: len(good) // 2],
    "header only": lambda good: good[:10],
    "byte changed": lambda good: good[:-3] + bytes([good[-3] ^ 0x40]) + good[-2:],
}


def state(name: str) -> dict[str, Any]:
    """A state well over the inline limit: stored as blobs of its own."""
    return {"docs": [f"{name} document {i}: " + "lorem ipsum " * 40 for i in range(60)]}


async def put_record(
    storage: CheckpointStorage, tmp_path: Path, schema: str, data: bytes, refs: bytes | None
) -> None:
    """Write ``data`` as the stored bytes of ``wf`` step 2, behind the store's back (and
    ``refs`` as its SQLite row's references)."""
    if isinstance(storage, FileCheckpointStorage):
        (Path(storage.workflow_dir("wf")) / step_name(2)).write_bytes(data)
    elif isinstance(storage, SQLiteCheckpointStorage):
        with sqlite3.connect(tmp_path / "store.db") as conn:
            # As a damaged disk would: without the store's triggers (which would take a
            # changed row for a replaced record and release its references). The refs
            # column too, damaged with the record: a full recount reads it first.
            triggers = conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
                "AND tbl_name = 'checkpoints'"
            ).fetchall()
            for name, _sql in triggers:
                conn.execute(f'DROP TRIGGER "{name}"')
            conn.execute(
                "UPDATE checkpoints SET data = ?, refs = ? WHERE workflow_id = 'wf' AND step = 2",
                (data, refs),
            )
            for _name, sql in triggers:
                conn.execute(sql)
    elif isinstance(storage, PostgresCheckpointStorage):
        conn = await asyncpg.connect(DSN)
        try:
            await conn.execute(
                f'UPDATE "{schema}".checkpoints SET data = $1 WHERE workflow_id = $2 AND step = 2',
                data,
                "wf",
            )
        finally:
            await conn.close()
    else:
        assert isinstance(storage, InMemoryCheckpointStorage)
        storage._workflows["wf"].records[2] = data


def sqlite_refs(tmp_path: Path) -> bytes | None:
    """The refs column of ``wf`` step 2 in the SQLite store (None elsewhere)."""
    path = tmp_path / "store.db"
    if not path.exists():
        return None
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT refs FROM checkpoints WHERE workflow_id = 'wf' AND step = 2")
        refs: bytes | None = row.fetchone()[0]
        return refs


async def setup(manager: CheckpointManager) -> bytes:
    """Three checkpoints of ``wf`` and a deleted workflow's garbage; step 2's good bytes."""
    for step in range(3):
        await manager.create_checkpoint("wf", step, "a", "completed", state(f"wf{step}"))
    await manager.create_checkpoint("gone", 0, "a", "completed", state("gone"))
    await manager.delete_checkpoints("gone")
    stored = await manager.storage.load("wf", 2)
    assert stored is not None and stored.data[4] == 2  # a version-2 record: blobs
    return stored.data


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("damage", DAMAGES)
async def test_a_record_it_cannot_read_keeps_every_blob_it_might_name(
    backend: str, damage: str, tmp_path: Path, pg_schema: str
) -> None:
    options = {"blob_grace_seconds": 0.001, "gc_interval": None} if backend == "file" else {}
    storage = make_storage(backend, tmp_path, pg_schema, **options)
    async with storage, CheckpointManager(storage) as manager:
        good, refs = await setup(manager), sqlite_refs(tmp_path)
        await put_record(storage, tmp_path, pg_schema, DAMAGES[damage](good), b"\x07damaged")
        with pytest.raises(CheckpointCorruptedError):
            await manager.get_checkpoint("wf", 2)
        report = await manager.sweep(policy=RetentionPolicy(keep_last=1))
        assert report.blobs_freed == 0
        assert report.blobs_held is (backend == "file")
        if isinstance(storage, SQLiteCheckpointStorage):
            with pytest.raises(CheckpointCorruptedError) as info:
                await storage.collect_garbage(full=True)  # the repair that reads the records
            assert (info.value.workflow_id, info.value.step) == ("wf", 2)
        await put_record(storage, tmp_path, pg_schema, good, refs)  # the good copy, put back
        got = await manager.get_checkpoint("wf", 2)
        assert got.state_snapshot.data == state("wf2")
        again = await manager.sweep(policy=RetentionPolicy(keep_last=1))
        assert not again.blobs_held
        if backend == "file":
            assert again.blobs_freed > 0  # the garbage it held back
        assert (await manager.get_checkpoint("wf", 2)).state_snapshot.data == state("wf2")


async def test_a_sealed_record_naming_a_blob_the_store_lacks_holds_the_file_sweep(
    tmp_path: Path,
) -> None:
    """A sealed record's references carry no checksum the store can check: one changed to
    name a blob the store lacks makes the record unreadable to the sweep, which deletes no
    blob; the good copy, put back, reads whole."""
    keys = Keyring(keys={"k1": b"k" * 32}, primary="k1")
    storage = FileCheckpointStorage(tmp_path / "store", blob_grace_seconds=0.001, gc_interval=None)
    async with storage, CheckpointManager(storage, encryption=keys) as manager:
        good = await setup(manager)
        bad = bytearray(good)
        bad[20 + 1 + 4 + 5] ^= 0x01  # a byte of the first root reference (header, digest, n)
        await put_record(storage, tmp_path, "", bytes(bad), None)
        report = await manager.sweep(policy=RetentionPolicy(keep_last=1))
        assert report.blobs_held and report.blobs_freed == 0
        await put_record(storage, tmp_path, "", good, None)
        assert (await manager.get_checkpoint("wf", 2)).state_snapshot.data == state("wf2")
