"""Encryption at rest (docs/encryption.md): on every backend, nothing readable or forgeable."""

from __future__ import annotations

import base64
import os
import sqlite3
import zlib
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from aiocheckpoint import (
    BlobCheckpointStorage,
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointStorage,
    DecryptionError,
    EffectRecord,
    EffectState,
    EncryptionError,
    InMemoryCheckpointStorage,
    InvalidArgumentError,
    Keyring,
    PlaintextRecordError,
    ResumableWorkflow,
    RetentionPolicy,
    UnknownKeyError,
)
from aiocheckpoint.format import node_children, record_root_refs
from aiocheckpoint.format.header import HEADER_SIZE
from aiocheckpoint.storage.base import EffectStorage
from tests.backend_support import ALL, WITH_BLOBS, RecordsOnly, make_storage
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

CANARY = "zq-CANARY-4f1d9e"
K1, K2 = os.urandom(32), os.urandom(32)
#: Collect a file store's unreferenced blobs at once (not after the default grace period).
GRACE: dict[str, dict[str, Any]] = {"file": {"blob_grace_seconds": 0.01}}


def ring(primary: str = "k1", **keys: bytes) -> Keyring:
    return Keyring(keys=keys or {"k1": K1}, primary=primary)


@pytest.fixture(params=ALL)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[tuple[str, CheckpointStorage]]:
    async with make_storage(request.param, tmp_path, pg_schema) as store:
        yield request.param, store


def effect(workflow_id: str, step: int, key: str, result: Any) -> EffectRecord:
    now = datetime.now(timezone.utc)
    return EffectRecord(
        workflow_id, step, key, "tool", EffectState.IN_DOUBT, 1, now, f"idem-{key}"
    ).finished(EffectState.DONE, result=result)


async def write_history(manager: CheckpointManager, workflow_id: str, steps: int = 4) -> None:
    for step in range(steps):
        state = {
            "secret": f"{CANARY} {workflow_id} {step}",
            "blob": f"{step}{CANARY}".encode(),
            "pad": "x" * 900,
        }
        await manager.create_checkpoint(
            workflow_id, step, "agent", "running", state, metadata={"note": CANARY}
        )
        if isinstance(manager.storage, EffectStorage):
            await manager.record_effect(effect(workflow_id, step, "call", {"out": CANARY}))


# --- keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "primary"),
    [
        ({}, "k1"),
        ({"k1": b"short"}, "k1"),
        ({"k1": "x" * 32}, "k1"),
        ({"k1": K1}, "k2"),
        ({"": K1}, ""),
        ({"a\nb": K1}, "a\nb"),
        ([("k1", K1)], "k1"),
    ],
)
def test_bad_keyrings_are_refused(keys: Any, primary: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Keyring(keys=keys, primary=primary)


def test_keyring_repr_shows_ids_not_keys() -> None:
    keyring = ring("k2", k1=K1, k2=K2)
    assert keyring.key_ids == {"k1", "k2"} and keyring.primary == "k2"
    assert K1.hex() not in repr(keyring) and "k2" in repr(keyring)


def test_bad_manager_options_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        CheckpointManager(encryption="secret")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        CheckpointManager(allow_plaintext=True)
    with pytest.raises(InvalidArgumentError):
        CheckpointManager(RecordsOnly(), incremental=True, encryption=ring())


# --- on every backend -------------------------------------------------------------------


def store_bytes(kind: str, tmp_path: Path) -> list[tuple[str, bytes]]:
    """Every file of a file store or SQLite database (with -wal and -shm)."""
    if kind == "file":
        files = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    else:
        files = [p for p in tmp_path.glob("store.db*") if p.is_file()]
    assert files
    return [(str(p), p.read_bytes()) for p in files]


async def pg_bytes(schema: str) -> list[tuple[str, bytes]]:
    """Every row of every table of the schema, as COPY writes it (bytea in hex)."""
    con = await asyncpg.connect(DSN)
    try:
        tables = await con.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
        )
        out = []
        for row in tables:
            chunks: list[bytes] = []

            async def sink(data: bytes, chunks: list[bytes] = chunks) -> None:
                chunks.append(data)

            name = row["table_name"]
            await con.copy_from_query(f'SELECT * FROM "{schema}"."{name}"', output=sink)
            out.append((name, b"".join(chunks)))
        assert out
        return out
    finally:
        await con.close()


def memory_bytes(store: Any) -> list[tuple[str, bytes]]:
    """Every bytes and str object reachable from the in-memory store's attributes."""
    found: list[tuple[str, bytes]] = []
    seen: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if id(value) in seen or depth > 12:
            return
        seen.add(id(value))
        if isinstance(value, bytes | bytearray | memoryview):
            found.append(("memory", bytes(value)))
        elif isinstance(value, str):
            found.append(("memory", value.encode()))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(value, list | tuple | set | frozenset):
            for v in value:
                walk(v, depth + 1)
        elif hasattr(value, "__dict__") or hasattr(value, "__slots__"):
            for name in getattr(value, "__slots__", ()):
                walk(getattr(value, name, None), depth + 1)
            for v in getattr(value, "__dict__", {}).values():
                walk(v, depth + 1)

    walk(store, 0)
    assert found
    return found


def canary_forms(canary: str = CANARY) -> list[bytes]:
    """The canary as stored text, hex (PostgreSQL's bytea), UTF-16, and base64 (the tagged
    form of bytes) at each of its three alignments: the characters only it decides."""
    raw = canary.encode()
    forms = [raw, raw.hex().encode(), canary.encode("utf-16-le")]
    forms += [base64.b64encode(bytes(pad) + raw + bytes(2))[4:-4] for pad in range(3)]
    return forms


def assert_no_canary(dumps: list[tuple[str, bytes]], canary: str = CANARY) -> None:
    for where, data in dumps:
        for form in canary_forms(canary):
            assert form not in data, f"{form!r} found in {where}"


async def dump_store(kind: str, store: Any, tmp_path: Path, pg_schema: str) -> list[Any]:
    """Every byte of the store: open (the WAL holds the writes), then closed and checkpointed."""
    if kind == "memory":
        return memory_bytes(store)
    if kind == "postgres":
        return await pg_bytes(pg_schema)
    dumps = store_bytes(kind, tmp_path)
    await store.close()
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "store.db") as con:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return dumps + store_bytes(kind, tmp_path)


@pytest.mark.parametrize("encrypted", [True, False])
async def test_no_canary_in_any_byte_of_the_store(
    backend: tuple[str, CheckpointStorage], tmp_path: Path, pg_schema: str, encrypted: bool
) -> None:
    """Encrypted: no trace of the canary anywhere. Plain (the control): the search finds it."""
    kind, store = backend
    manager = CheckpointManager(
        store, encryption=ring() if encrypted else None, max_checkpoints=2, incremental=False
    )
    await write_history(manager, "wf-a", steps=5)
    await write_history(manager, "wf-b", steps=3)
    await manager.create_checkpoint("wf-c", 0, "agent", "completed", {"big": [CANARY] * 20_000})
    await manager.delete_checkpoints("wf-b", 2)
    if isinstance(store, BlobCheckpointStorage):
        await store.collect_garbage()
    # Every value reads back: the store held them.
    point = await manager.get_resume_point("wf-a")
    assert point is not None and point[1].data["secret"] == f"{CANARY} wf-a 4"
    assert (await manager.get_checkpoint("wf-a", 4)).metadata == {"note": CANARY}
    assert (await manager.get_effects("wf-a", 4))[0].result == {"out": CANARY}
    dumps = await dump_store(kind, store, tmp_path, pg_schema)
    if encrypted:
        assert_no_canary(dumps)
    else:
        with pytest.raises(AssertionError, match="found in"):
            assert_no_canary(dumps)


async def reachable(store: BlobCheckpointStorage, workflow_id: str, step: int) -> set[bytes]:
    """The names of every blob a stored record reaches, read as a backend reads them."""
    stored = await store.load(workflow_id, step)
    assert stored is not None
    digest = store.blob_params.digest_size
    level, seen = set(record_root_refs(stored.data)), set()
    while level:
        seen |= level
        found = await store.fetch_blobs(level)
        assert found.keys() == level
        level = {k for b in found.values() for k in node_children(b, digest)} - seen
    return seen


def chat(messages: int, canary: str = CANARY) -> dict[str, Any]:
    """A large state of many strings, each holding the canary: cut into many blobs."""
    return {
        "chat": [{"role": "user", "text": f"{canary} message {i}"} for i in range(messages)],
        "notes": {f"n{i}": f"{canary} note {i}" * 40 for i in range(40)},
    }


@pytest.mark.parametrize("kind", WITH_BLOBS)
@pytest.mark.parametrize("encrypted", [True, False])
async def test_no_canary_in_any_byte_of_an_incremental_store(
    kind: str, tmp_path: Path, pg_schema: str, encrypted: bool
) -> None:
    """Encrypted incremental checkpoints: records, blobs, names, counts all canary-free."""
    async with make_storage(kind, tmp_path, pg_schema, **GRACE.get(kind, {})) as store:
        manager = CheckpointManager(
            store, encryption=ring() if encrypted else None, max_checkpoints=3, incremental=True
        )
        state = chat(3000)
        for step in range(5):
            state["chat"].append({"role": "agent", "text": f"{CANARY} reply {step}"})
            await manager.create_checkpoint("wf-a", step, "agent", "running", state)
        await manager.fork_workflow("wf-a", 4, "wf-f")
        await manager.delete_checkpoints("wf-a", 4)
        await manager.create_checkpoint("wf-g", 0, "agent", "running", chat(500, "other"))
        assert isinstance(store, BlobCheckpointStorage)
        garbage = await reachable(store, "wf-g", 0)
        assert len(garbage) > 3
        await manager.delete_checkpoints("wf-g")
        await anyio.sleep(0.05)  # past the file store's grace period
        await store.collect_garbage()
        assert await store.fetch_blobs(garbage) == {}
        assert (await manager.get_checkpoint("wf-f", 4)).state_snapshot.data == state
        assert (await manager.get_checkpoint("wf-a", 3)).state_snapshot.data["chat"][-1] == {
            "role": "agent",
            "text": f"{CANARY} reply 3",
        }
        dumps = await dump_store(kind, store, tmp_path, pg_schema)
    if encrypted:
        assert_no_canary(dumps)
    else:
        with pytest.raises(AssertionError, match="found in"):
            assert_no_canary(dumps)


async def flip_sealed(data: bytes, at: int) -> bytes:
    """A sealed record with byte ``at`` of its envelope flipped, its header left as it is."""
    envelope = bytearray(data[HEADER_SIZE:])
    envelope[at] ^= 0x01
    return data[:HEADER_SIZE] + bytes(envelope)


async def plaintext_record(workflow_id: str, step: int) -> bytes:
    plain = InMemoryCheckpointStorage()
    await CheckpointManager(plain).create_checkpoint(
        workflow_id, step, "agent", "running", {"forged": True}
    )
    stored = await plain.load(workflow_id, step)
    assert stored is not None
    return stored.data


async def tampered(store: CheckpointStorage, how: str) -> bytes:
    """What replaces step 3 of wf-a, made by each kind of tampering."""
    a3, a2 = await store.load("wf-a", 3), await store.load("wf-a", 2)
    b3 = await store.load("wf-b", 3)
    assert a3 is not None and a2 is not None and b3 is not None
    if how == "flip-tag":
        return a3.data[:-1] + bytes([a3.data[-1] ^ 0x80])
    if how == "crc-field":
        crc = zlib.crc32(a3.data[HEADER_SIZE:]).to_bytes(4, "big")
        return a3.data[: HEADER_SIZE - 4] + crc + a3.data[HEADER_SIZE:]
    if how == "flags":
        return a3.data[:5] + b"\x03" + a3.data[6:]
    if how == "flip-ciphertext":
        return await flip_sealed(a3.data, len(a3.data) - HEADER_SIZE - 40)
    if how == "flip-key-id":
        return await flip_sealed(a3.data, 7)
    if how == "flip-nonce":
        return await flip_sealed(a3.data, len(a3.data) - HEADER_SIZE - 17 - 900)
    if how == "truncate":
        return a3.data[: len(a3.data) // 2]
    if how == "empty":
        return b""
    if how == "other-workflow":
        return b3.data
    if how == "other-step":
        return a2.data
    if how == "plaintext":
        return await plaintext_record("wf-a", 3)
    raise AssertionError(how)


TAMPERING = [
    "flip-tag",
    "crc-field",
    "flags",
    "flip-ciphertext",
    "flip-nonce",
    "truncate",
    "empty",
    "other-workflow",
    "other-step",
    "plaintext",
]


@pytest.mark.parametrize("how", TAMPERING)
async def test_tampered_records_are_refused_and_resume_falls_back(
    backend: tuple[str, CheckpointStorage], how: str
) -> None:
    _kind, store = backend
    manager = CheckpointManager(store, encryption=ring())
    await write_history(manager, "wf-a")
    await write_history(manager, "wf-b")
    await store.save("wf-a", 3, await tampered(store, how))
    with pytest.raises(DecryptionError) as caught:
        await manager.get_checkpoint("wf-a", 3)
    assert (caught.value.workflow_id, caught.value.step) == ("wf-a", 3)
    if how == "plaintext":
        assert isinstance(caught.value, PlaintextRecordError)
    point = await manager.get_resume_point("wf-a")
    assert point is not None and point[1].data["secret"] == f"{CANARY} wf-a 2"
    assert [(await manager.get_checkpoint("wf-a", s)).step for s in range(3)] == [0, 1, 2]
    assert (await manager.get_checkpoint("wf-b", 3)).step == 3


async def test_a_changed_key_id_is_a_missing_key_and_resume_does_not_fall_back(
    backend: tuple[str, CheckpointStorage],
) -> None:
    """A key id the keyring lacks reads as a rotation's new key, damaged or not: resuming
    from an older checkpoint could run completed work again, so it raises instead."""
    _kind, store = backend
    manager = CheckpointManager(store, encryption=ring())
    await write_history(manager, "wf-a")
    await write_history(manager, "wf-b")
    await store.save("wf-a", 3, await tampered(store, "flip-key-id"))
    with pytest.raises(UnknownKeyError) as caught:
        await manager.get_resume_point("wf-a")
    assert (caught.value.workflow_id, caught.value.step) == ("wf-a", 3)
    assert caught.value.key_id != "k1"


@pytest.mark.parametrize("how", ["other-workflow", "other-step", "other-key", "flip", "plain"])
async def test_tampered_effects_are_refused(
    backend: tuple[str, CheckpointStorage], how: str
) -> None:
    _kind, store = backend
    if not isinstance(store, EffectStorage):
        pytest.fail("every bundled backend keeps an effect journal")
    manager = CheckpointManager(store, encryption=ring())
    await write_history(manager, "wf-a")
    await write_history(manager, "wf-b")
    await manager.record_effect(effect("wf-a", 3, "other", {"out": 2}))
    source = {e.key: e for e in await store.load_effects("wf-a", 3)}
    call = source["call"].data
    data = {
        "other-workflow": (await store.load_effects("wf-b", 3))[0].data,
        "other-step": (await store.load_effects("wf-a", 2))[0].data,
        "other-key": source["other"].data,
        "flip": call[:-5] + bytes([call[-5] ^ 4]) + call[-4:],
    }.get(how)
    if data is None:
        plain = CheckpointManager(InMemoryCheckpointStorage())
        await plain.record_effect(effect("wf-a", 3, "call", {"out": "forged"}))
        data = (await plain.storage.load_effects("wf-a", 3))[0].data  # type: ignore[attr-defined]
    await store.put_effect("wf-a", 3, "call", data, in_doubt=False)
    with pytest.raises(DecryptionError) as caught:
        await manager.get_effects("wf-a", 3)
    assert (caught.value.workflow_id, caught.value.step) == ("wf-a", 3)
    assert "'call'" in str(caught.value)


# --- keys, rotation, plaintext ----------------------------------------------------------


def key_id_of(data: bytes) -> str:
    envelope = data[HEADER_SIZE:]
    return envelope[7 : 7 + envelope[6]].decode()


async def test_rotation_reads_old_keys_and_writes_the_primary() -> None:
    store = InMemoryCheckpointStorage()
    await CheckpointManager(store, encryption=ring()).create_checkpoint(
        "wf", 0, "a", "running", {"n": 0}
    )
    rotated = CheckpointManager(store, encryption=ring("k2", k1=K1, k2=K2))
    await rotated.create_checkpoint("wf", 1, "a", "running", {"n": 1})
    assert [(await rotated.get_checkpoint("wf", s)).state_snapshot.data for s in (0, 1)] == [
        {"n": 0},
        {"n": 1},
    ]
    ids = [key_id_of(r.data) for r in await store.scan("wf")]
    assert ids == ["k1", "k2"]
    retired = CheckpointManager(store, encryption=ring("k2", k2=K2))
    with pytest.raises(UnknownKeyError) as caught:
        await retired.get_checkpoint("wf", 0)
    assert (caught.value.workflow_id, caught.value.step) == ("wf", 0)
    assert (await retired.get_checkpoint("wf", 1)).state_snapshot.data == {"n": 1}


async def test_a_wrong_key_under_the_same_id_does_not_authenticate() -> None:
    store = InMemoryCheckpointStorage()
    await CheckpointManager(store, encryption=ring()).create_checkpoint(
        "wf", 0, "a", "running", {"n": 0}
    )
    wrong = CheckpointManager(store, encryption=ring(k1=K2))
    with pytest.raises(DecryptionError):
        await wrong.get_checkpoint("wf", 0)
    with pytest.raises(DecryptionError, match="does not authenticate"):
        await wrong.get_resume_point("wf")  # nothing authenticates: nothing to fall back to


async def test_plaintext_is_read_only_when_allowed_and_rewritten_sealed() -> None:
    store = InMemoryCheckpointStorage()
    await CheckpointManager(store).create_checkpoint("wf", 0, "a", "running", {"n": 0})
    strict = CheckpointManager(store, encryption=ring())
    with pytest.raises(PlaintextRecordError):
        await strict.get_checkpoint("wf", 0)
    migrating = CheckpointManager(store, encryption=ring(), allow_plaintext=True)
    checkpoint = await migrating.get_checkpoint("wf", 0)
    await migrating.create_checkpoint("wf", 0, "a", "running", checkpoint.state_snapshot)
    assert (await strict.get_checkpoint("wf", 0)).state_snapshot.data == {"n": 0}


async def test_a_manager_without_keys_refuses_sealed_records_without_falling_back() -> None:
    store = InMemoryCheckpointStorage()
    plain = CheckpointManager(store)
    await plain.create_checkpoint("wf", 0, "a", "running", {"n": 0})
    await CheckpointManager(store, encryption=ring()).create_checkpoint(
        "wf", 1, "a", "running", {"n": 1}
    )
    with pytest.raises(EncryptionError) as caught:
        await plain.get_resume_point("wf")
    assert not isinstance(caught.value, CheckpointCorruptedError)
    assert "'wf' step 1" in str(caught.value)


async def test_a_fork_is_sealed_for_its_new_workflow() -> None:
    store = InMemoryCheckpointStorage()
    manager = CheckpointManager(store, encryption=ring())
    await write_history(manager, "wf-a", steps=2)
    await manager.fork_workflow("wf-a", 1, "wf-f")
    assert (await manager.get_checkpoint("wf-f", 1)).state_snapshot.data["secret"].endswith("1")
    forked = await store.load("wf-f", 1)
    assert forked is not None and CANARY.encode() not in forked.data


class Provider:
    """A KeyProvider kept outside the keyring (a KMS stand-in) that counts its calls."""

    def __init__(self, fail: bool = False) -> None:
        self.remote = ring()
        self.calls: list[str] = []
        self.fail = fail

    @property
    def primary(self) -> str:
        return "k1"

    async def wrap_key(self, data_key: bytes) -> tuple[str, bytes]:
        self.calls.append("wrap")
        if self.fail:
            raise ConnectionError("KMS unreachable")
        return await self.remote.wrap_key(data_key)

    async def unwrap_key(self, key_id: str, wrapped: bytes) -> bytes:
        self.calls.append("unwrap")
        return await self.remote.unwrap_key(key_id, wrapped)


async def test_a_key_provider_wraps_one_data_key_per_manager() -> None:
    store = InMemoryCheckpointStorage()
    provider = Provider()
    writer = CheckpointManager(store, encryption=provider)
    for step in range(5):
        await writer.create_checkpoint("wf", step, "a", "running", {"n": step})
    reader = CheckpointManager(store, encryption=provider)
    assert [c.step for c in await reader.list_checkpoints("wf")] == list(range(5))
    assert provider.calls == ["wrap", "unwrap"]
    # The data key is wrapped under the keyring's key: the keyring itself reads it too.
    assert (await CheckpointManager(store, encryption=ring()).get_checkpoint("wf", 4)).step == 4


async def test_a_failing_key_provider_is_an_encryption_error_and_writes_nothing() -> None:
    store = InMemoryCheckpointStorage()
    manager = CheckpointManager(store, encryption=Provider(fail=True))
    with pytest.raises(EncryptionError, match="ConnectionError"):
        await manager.create_checkpoint("wf", 0, "a", "running", {"n": 0})
    assert await store.list_workflows() == []


async def test_effect_results_round_trip_sealed() -> None:
    store = InMemoryCheckpointStorage()
    manager = CheckpointManager(store, encryption=ring())
    stored = await manager.record_effect(effect("wf", 0, "call", {"when": CANARY}))
    assert stored.result == {"when": CANARY}
    assert (await manager.get_effects("wf", 0)) == [replace(stored)]
    assert CANARY.encode() not in (await store.load_effects("wf", 0))[0].data
    with pytest.raises(EncryptionError):
        await CheckpointManager(store).get_effects("wf", 0)


@pytest.mark.parametrize("encrypted", [True, False])
async def test_a_fork_of_whole_records_keeps_typed_values(encrypted: bool) -> None:
    """Forking re-encodes each whole record for the new id: typed values go as stored."""
    manager = CheckpointManager(encryption=ring() if encrypted else None)
    state = {"b": b"\x00bytes", "when": datetime(2026, 1, 2, tzinfo=timezone.utc), "s": {1, 2}}
    await manager.create_checkpoint("wf", 0, "a", "running", state)
    await manager.fork_workflow("wf", 0, "fork")
    assert (await manager.get_checkpoint("fork", 0)).state_snapshot.data == state


async def test_a_resumed_workflow_replays_sealed_effects(
    backend: tuple[str, CheckpointStorage],
) -> None:
    """ResumableWorkflow on an encrypted manager: a step interrupted after its effect
    returns the sealed, recorded result on the re-run without calling again."""
    _kind, store = backend
    calls: list[str] = []

    async def search(query: str) -> dict[str, str]:
        calls.append(query)
        return {"hit": CANARY}

    class Interrupted(Exception):
        pass

    wf = ResumableWorkflow("wf", CheckpointManager(store, encryption=ring()))
    with pytest.raises(Interrupted):
        async with wf.step(0, agent_id="a"):
            assert await wf.effect("search", search, "q") == {"hit": CANARY}
            raise Interrupted
    again = ResumableWorkflow("wf", CheckpointManager(store, encryption=ring()))
    async with again.step(0, agent_id="a"):
        assert await again.effect("search", search, "q") == {"hit": CANARY}
    assert calls == ["q"]
    assert isinstance(store, EffectStorage)
    assert all(CANARY.encode() not in e.data for e in await store.load_effects("wf", 0))


async def test_retention_thins_encrypted_histories_as_plain_ones(
    backend: tuple[str, CheckpointStorage],
) -> None:
    """The history rules read each record's status and time: sealed records are unsealed for
    it, so an encrypted history is thinned exactly as the same plain one."""
    _kind, store = backend
    policy = RetentionPolicy(keep_last=3, keep_every=5, keep_terminal=True)
    kept: dict[str, list[int]] = {}
    for name, keys in (("plain", None), ("sealed", ring())):
        manager = CheckpointManager(store, encryption=keys, retention=policy)
        for step in range(20):
            status = "completed" if step in (7, 8) else "failed" if step == 11 else "running"
            await manager.create_checkpoint(name, step, "a", status, {"n": step})
        report = await manager.thin_workflow(name)
        assert report.skipped_corrupted == 0
        kept[name] = [r.step for r in await store.scan(name)]
    assert kept["sealed"] == kept["plain"] == [0, 5, 8, 10, 11, 15, 17, 18, 19]
