"""A record sealed under a key the keyring lacks is not corruption (docs/encryption.md).

A rolling key rotation leaves runners on the old keyring beside runners on the new one. A
record the new key sealed must stop an old runner (UnknownKeyError, naming the key, the
workflow and the step, and nothing written), never send it back to an older checkpoint to
run a completed step, or its effect, again. On every backend; real corruption still falls
back.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointStorage,
    DecryptionError,
    EncryptionError,
    InvalidArgumentError,
    Keyring,
    ResumableWorkflow,
    RetentionPolicy,
    UnknownKeyError,
    WorkflowStatus,
)
from aiocheckpoint.codec.sealing import sealed_key_id
from aiocheckpoint.storage.base import EffectStorage, WorkflowStorage
from tests.backend_support import ALL, make_storage
from tests.pg_support import pg_schema

__all__ = ["pg_schema"]

K1, K2 = os.urandom(32), os.urandom(32)
#: A runner not yet given the new key, and one that writes under it.
OLD = Keyring(keys={"k1": K1}, primary="k1")
NEW = Keyring(keys={"k1": K1, "k2": K2}, primary="k2")
#: Above the default root_inline_limit: an incremental (tree) record on blob stores.
LARGE = {"pad": "x" * 40_000, "items": [f"item {n}" for n in range(2_000)]}


@pytest.fixture(params=ALL)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[CheckpointStorage]:
    async with make_storage(request.param, tmp_path, pg_schema) as storage:
        yield storage


async def contents(store: CheckpointStorage, workflow_id: str) -> Any:
    """Every byte stored for a workflow: records, effects, and its workflow record."""
    records = [(r.step, r.data) for r in await store.scan(workflow_id)]
    effects = []
    if isinstance(store, EffectStorage):
        for step in range(6):
            effects += [
                (e.key, e.data, e.in_doubt) for e in await store.load_effects(workflow_id, step)
            ]
    record = None
    if isinstance(store, WorkflowStorage):
        found = await store.get_workflow(workflow_id)
        # Not its update time: the runner's lease was taken and released.
        record = None if found is None else (found.status, found.attempts, found.last_error)
    return records, effects, record


async def rotated_history(store: CheckpointStorage, large: bool = False) -> None:
    """Steps 0 and 1 COMPLETED under k1 (an old runner), step 2 COMPLETED under k2."""
    old, new = CheckpointManager(store, encryption=OLD), CheckpointManager(store, encryption=NEW)
    for step, manager in ((0, old), (1, old), (2, new)):
        state = {**(LARGE if large else {}), "done": step}
        await manager.create_checkpoint("wf", step, "agent", "completed", state)
    assert [sealed_key_id(r.data) for r in await store.scan("wf")] == ["k1", "k1", "k2"]


def owner(store: CheckpointStorage) -> str | None:
    """A lease owner where the backend has leases (the file store has none)."""
    return "old-runner" if isinstance(store, WorkflowStorage) else None


def assert_names(exc: UnknownKeyError, step: int, effect_key: str | None = None) -> None:
    assert (exc.key_id, exc.workflow_id, exc.step) == ("k2", "wf", step)
    assert exc.effect_key == effect_key
    assert "'k2'" in str(exc) and "'wf'" in str(exc) and f"step {step}" in str(exc)


def test_a_missing_key_is_not_a_corruption() -> None:
    """Everything that skips corrupted records skips CheckpointCorruptedError: not this."""
    assert issubclass(UnknownKeyError, EncryptionError)
    assert not issubclass(UnknownKeyError, CheckpointCorruptedError)
    assert not issubclass(UnknownKeyError, DecryptionError)


@pytest.mark.parametrize("large", [False, True], ids=["whole", "incremental"])
async def test_resuming_past_an_unknown_key_raises_and_writes_nothing(
    store: CheckpointStorage, large: bool
) -> None:
    """The old runner neither resumes from step 1 (re-running completed step 2) nor writes."""
    await rotated_history(store, large)
    before = await contents(store, "wf")
    old = CheckpointManager(store, encryption=OLD)
    with pytest.raises(UnknownKeyError) as caught:
        await old.get_resume_point("wf")
    assert_names(caught.value, 2)
    with pytest.raises(UnknownKeyError) as caught:
        await old.get_latest_checkpoint("wf")
    assert_names(caught.value, 2)
    ran: list[int] = []
    with pytest.raises(UnknownKeyError) as caught:
        async with ResumableWorkflow("wf", old, lease_owner=owner(store)) as wf:
            ran.append(wf.resume_step)
    assert_names(caught.value, 2)
    assert ran == []
    assert await contents(store, "wf") == before
    point = await CheckpointManager(store, encryption=NEW).get_resume_point("wf")
    assert point is not None and point[0] == 3


async def test_real_corruption_still_falls_back_but_never_past_an_unknown_key(
    store: CheckpointStorage,
) -> None:
    """A damaged step 3 (under k1) falls back to step 2; step 2 under k2 stops an old runner."""
    await rotated_history(store)
    new = CheckpointManager(store, encryption=NEW)
    old = CheckpointManager(store, encryption=OLD)
    await old.create_checkpoint("wf", 3, "agent", "completed", {"done": 3})
    latest = await store.load("wf", 3)
    assert latest is not None
    flipped = latest.data[:-3] + bytes([latest.data[-3] ^ 1]) + latest.data[-2:]
    await store.save("wf", 3, flipped)
    point = await new.get_resume_point("wf")  # a key it holds, failing: corruption
    assert point is not None and point[0] == 3 and point[1].data == {"done": 2}
    with pytest.raises(UnknownKeyError) as caught:
        await old.get_resume_point("wf")
    assert_names(caught.value, 2)


async def test_a_step_whose_effect_is_under_an_unknown_key_raises_without_calling(
    store: CheckpointStorage,
) -> None:
    """A new runner ran step 1's effect and died; an old runner re-runs step 1."""
    old, new = CheckpointManager(store, encryption=OLD), CheckpointManager(store, encryption=NEW)
    await old.create_checkpoint("wf", 0, "agent", "completed", {"done": 0})
    calls: list[str] = []

    async def charge(card: str) -> str:
        calls.append(card)
        return f"receipt {len(calls)}"

    class Killed(BaseException):
        """Stands in for the new runner's death right after the effect (nothing recorded)."""

    with pytest.raises(Killed):
        async with ResumableWorkflow("wf", new) as wf, wf.step(1, agent_id="agent"):
            assert await wf.effect("charge", charge, "4242") == "receipt 1"
            raise Killed
    before = await contents(store, "wf")
    with pytest.raises(UnknownKeyError) as caught:
        async with ResumableWorkflow("wf", old, lease_owner=owner(store)) as wf:
            assert wf.resume_step == 1
            async with wf.step(1, agent_id="agent"):
                await wf.effect("charge", charge, "4242")
    assert_names(caught.value, 1, "charge")
    assert calls == ["4242"]
    assert await contents(store, "wf") == before  # no FAILED step, the workflow not failed
    if isinstance(store, WorkflowStorage):
        record = await store.get_workflow("wf")
        assert record is None or record.status is WorkflowStatus.UNFINISHED
    async with ResumableWorkflow("wf", new) as wf, wf.step(1, agent_id="agent"):
        assert await wf.effect("charge", charge, "4242") == "receipt 1"
    assert calls == ["4242"]


async def test_a_sweep_keeps_and_names_what_it_cannot_read(store: CheckpointStorage) -> None:
    """Not counted as damage: ``skipped_no_key`` and the key ids, apart from corruption."""
    await rotated_history(store)
    policy = RetentionPolicy(keep_last=1, keep_terminal=False)
    old = CheckpointManager(store, encryption=OLD)
    report = await old.thin_workflow("wf", policy=policy, dry_run=True)
    assert (report.skipped_no_key, report.missing_keys, report.skipped_corrupted) == (
        1,
        ["k2"],
        0,
    )
    keyless = await CheckpointManager(store).sweep(policy=policy, dry_run=True)
    assert (keyless.skipped_no_key, keyless.missing_keys) == (3, ["k1", "k2"])
    assert keyless.skipped_corrupted == keyless.checkpoints_deleted == 0
    full = await CheckpointManager(store, encryption=NEW).sweep(policy=policy, dry_run=True)
    assert (full.skipped_no_key, full.checkpoints_deleted) == (0, 2)


class _Vault:
    """A KeyProvider that says "unknown key" its own way, as a KMS client would."""

    primary = "k1"

    async def wrap_key(self, data_key: bytes) -> tuple[str, bytes]:
        return await OLD.wrap_key(data_key)

    async def unwrap_key(self, key_id: str, wrapped: bytes) -> bytes:
        if key_id != "k1":
            raise UnknownKeyError("the vault has no such key")
        return await OLD.unwrap_key(key_id, wrapped)


async def test_a_key_providers_unknown_key_names_the_key_asked_for() -> None:
    manager = CheckpointManager(encryption=NEW)
    await manager.create_checkpoint("wf", 2, "agent", "completed", {"done": 2})
    vault = CheckpointManager(manager.storage, encryption=_Vault())
    with pytest.raises(UnknownKeyError) as caught:
        await vault.get_resume_point("wf")
    assert_names(caught.value, 2)


def test_one_loader_reads_the_keys_file_of_the_command_line(tmp_path: Path) -> None:
    """``Keyring.from_file`` is what ``--keys FILE`` runs: same format, same checks."""
    import base64
    import json

    path = tmp_path / "keys.json"
    path.write_text(
        json.dumps(
            {"primary": "k2", "keys": {n: base64.b64encode(k).decode() for n, k in NEW_KEYS}}
        )
    )
    path.chmod(0o600)
    keyring = Keyring.from_file(path)
    assert (keyring.primary, keyring.key_ids) == ("k2", {"k1", "k2"})
    path.chmod(0o640)
    with pytest.raises(InvalidArgumentError, match="chmod 600"):
        Keyring.from_file(path)
    with pytest.raises(InvalidArgumentError, match="not base64"):
        Keyring.from_json('{"primary": "k1", "keys": {"k1": "%%%"}}')
    with pytest.raises(InvalidArgumentError, match="cannot read keys file"):
        Keyring.from_file(tmp_path / "absent.json")


NEW_KEYS = (("k1", K1), ("k2", K2))
