"""The command line on encrypted stores: --keys, show/diff/verify/export, rekey and encrypt.

Real subprocesses against real stores (docs/encryption.md, docs/cli.md). The rotation test
SIGKILLs ``rekey`` while writers keep writing, restarts it, and checks that every record and
effect then reads with the new key alone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    EffectRecord,
    EffectState,
    Keyring,
    open_storage,
)
from aiocheckpoint.cli import rekey
from aiocheckpoint.codec.sealing import Sealer, sealed_key_id
from aiocheckpoint.format.sealed import is_sealed_tree_record
from aiocheckpoint.storage.base import EffectStorage, StoredEffect, WorkflowStorage
from tests.test_cli import BACKENDS, SRC, NewStore, cli, new_store

__all__ = ["new_store"]

K1, K2 = os.urandom(32), os.urandom(32)
OLD = Keyring(keys={"k1": K1}, primary="k1")
BOTH = Keyring(keys={"k1": K1, "k2": K2}, primary="k2")
NEW = Keyring(keys={"k2": K2}, primary="k2")
CANARY = "cli-CANARY-58c2"


def keys_file(path: Path, keys: dict[str, bytes], primary: str, mode: int = 0o600) -> str:
    text = {"primary": primary, "keys": {k: base64.b64encode(v).decode() for k, v in keys.items()}}
    path.write_text(json.dumps(text))
    path.chmod(mode)
    return str(path)


def effect(workflow_id: str, step: int, result: object) -> EffectRecord:
    now = datetime.now(timezone.utc)
    record = EffectRecord(workflow_id, step, "call", "tool", EffectState.IN_DOUBT, 1, now, "i")
    return record.finished(EffectState.DONE, result=result)


async def populate(url: str, keys: Keyring | None, workflows: int = 3, steps: int = 4) -> None:
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:
        for w in range(workflows):
            for step in range(steps):
                state = {"secret": CANARY, "n": step}
                await manager.create_checkpoint(f"wf-{w}", step, "a", "running", state)
                await manager.record_effect(effect(f"wf-{w}", step, {"out": CANARY}))


async def key_ids(url: str) -> set[str | None]:
    """The key id of every record and effect of the store (None: plaintext)."""
    storage = open_storage(url)
    found: set[str | None] = set()
    async with storage:
        for wf in await storage.list_workflows():
            for record in await storage.scan(wf):
                found.add(sealed_key_id(record.data))
                assert isinstance(storage, EffectStorage)
                for item in await storage.load_effects(wf, record.step):
                    found.add(sealed_key_id(item.data, effect=True))
    return found


async def read_all(url: str, keys: Keyring) -> int:
    """Read every checkpoint and effect with ``keys``; how many checkpoints there were."""
    count = 0
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:
        for wf in await manager.list_workflows():
            for checkpoint in await manager.list_checkpoints(wf):
                assert checkpoint.state_snapshot.data["secret"] == CANARY
                for record in await manager.get_effects(wf, checkpoint.step):
                    assert record.result == {"out": CANARY}
                count += 1
    return count


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        ({"primary": "k1", "keys": {"k1": base64.b64encode(K1).decode()}}, 0o644, "chmod 600"),
        ({"primary": "k1", "keys": {"k1": base64.b64encode(b"short").decode()}}, 0o600, "32"),
        ({"primary": "k9", "keys": {"k1": base64.b64encode(K1).decode()}}, 0o600, "primary"),
        ({"keys": {}}, 0o600, "KeyError"),
        ("not json", 0o600, "JSONDecodeError"),
        ({"primary": "k1", "keys": {"k1": "%%%"}}, 0o600, "not base64"),
    ],
)
def test_bad_keys_files_are_usage_errors(
    tmp_path: Path, content: object, mode: int, message: str
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    path.chmod(mode)
    result = cli("verify", f"sqlite://{tmp_path}/x.db", "--keys", str(path))
    assert result.code == 2
    assert message in result.error_line()
    assert base64.b64encode(K1).decode() not in result.err


@pytest.mark.parametrize("kind", BACKENDS)
async def test_reading_commands_take_the_keys(
    kind: str, new_store: NewStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = new_store(kind)
    await populate(url, OLD)
    keys = keys_file(tmp_path / "k.json", {"k1": K1}, "k1")
    without = cli("verify", url)
    assert without.code == 5 and "encrypted under key k1: pass --keys" in without.out
    assert cli("verify", url, "--keys", keys).code == 0
    with monkeypatch.context() as patched:
        patched.setenv("AIOCHECKPOINT_KEYS", keys)
        assert cli("verify", url).code == 0
    shown = cli("--json", "show", url, "wf-0", "--keys", keys)
    assert shown.code == 0 and CANARY in shown.out
    diff = cli("diff", url, "wf-0", "1", "2", "--keys", keys)
    assert diff.code == 0 and "n" in diff.out
    sealed, plain = tmp_path / "sealed.jsonl", tmp_path / "plain.jsonl"
    assert cli("export", url, str(sealed), "--keys", keys).code == 0
    assert cli("export", url, str(plain), "--keys", keys, "--plaintext").code == 0
    sealed_text, plain_text = sealed.read_text(), plain.read_text()
    canary_b64 = [base64.b64encode(bytes(p) + CANARY.encode() + bytes(2))[4:-4] for p in range(3)]
    assert not any(form.decode() in sealed_text for form in canary_b64)
    assert any(form.decode() in plain_text for form in canary_b64)
    # The ciphertext export imports into another store and reads there with the keys.
    other = new_store(kind)
    assert cli("import", str(sealed), other, "--keys", keys).code == 0
    assert await read_all(other, OLD) == 12


@pytest.mark.parametrize("kind", BACKENDS)
async def test_encrypt_then_rekey_then_retire_the_old_key(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    url = new_store(kind)
    await populate(url, None)
    old = keys_file(tmp_path / "old.json", {"k1": K1}, "k1")
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    new = keys_file(tmp_path / "new.json", {"k2": K2}, "k2")
    assert cli("rekey", url, "--keys", old).code == 1  # plaintext left: rekey does not seal it
    result = cli("--json", "encrypt", url, "--keys", old)
    assert result.code == 0, result.out + result.err
    assert await key_ids(url) == {"k1"}
    assert cli("rekey", url, "--keys", both).code == 0
    assert await key_ids(url) == {"k2"}
    again = cli("--json", "rekey", url, "--keys", both)
    assert again.code == 0 and again.json()["resealed"] == 0  # type: ignore[index]
    assert await read_all(url, NEW) == 12
    assert cli("verify", url, "--keys", new).code == 0


@pytest.mark.parametrize("kind", BACKENDS)
async def test_rekey_reseals_every_effect_record_of_the_journal(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    """Effects of a step far from any checkpoint, and of a workflow with no checkpoint (a
    run killed in its first step), are re-sealed too: after the old key is retired, every
    recorded result still replays."""
    url = new_store(kind)
    async with CheckpointManager(open_storage(url), encryption=OLD) as manager:
        await manager.create_checkpoint("w", 0, "a", "completed", {"n": 0})
        await manager.record_effect(effect("w", 7, "far"))
        await manager.record_effect(effect("bare", 3, "no checkpoint"))
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    result = cli("rekey", url, "--keys", both)
    assert result.code == 0, result.out + result.err
    async with CheckpointManager(open_storage(url), encryption=NEW) as manager:
        [far] = await manager.get_effects("w", 7)
        [bare] = await manager.get_effects("bare", 3)
    assert (far.result, bare.result) == ("far", "no checkpoint")


@pytest.mark.parametrize("kind", BACKENDS)
async def test_rekey_makes_encrypted_incremental_records_whole_under_the_new_key(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    url = new_store(kind)
    big = {"secret": CANARY, "log": [f"{CANARY} line {i}" for i in range(3000)]}
    async with CheckpointManager(open_storage(url), encryption=OLD) as manager:
        for step in range(3):
            big["log"].append(f"step {step}")
            await manager.create_checkpoint("wf-big", step, "a", "running", big)
    assert await tree_records(url) == 3
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    # Exported as it is, an encrypted tree would be written whole in the clear: refused.
    early = tmp_path / "early.jsonl"
    refused = cli("export", url, str(early), "--keys", both)
    assert refused.code != 0 and "rekey" in refused.out + refused.err
    forms = [base64.b64encode(bytes(p) + CANARY.encode() + bytes(2))[4:-4] for p in range(3)]
    assert not any(form.decode() in early.read_text() for form in forms)
    result = cli("--json", "rekey", url, "--keys", both)
    assert result.code == 0, result.out + result.err
    assert result.json()["resealed"] == 3  # type: ignore[index]
    assert await tree_records(url) == 0 and await key_ids(url) == {"k2"}
    late = tmp_path / "late.jsonl"
    assert cli("export", url, str(late), "--keys", both).code == 0
    assert not any(form.decode() in late.read_text() for form in forms)
    # Only the new key: the records read, and none relies on a blob sealed under k1.
    async with CheckpointManager(open_storage(url), encryption=NEW) as manager:
        checkpoint = await manager.get_checkpoint("wf-big", 2)
        assert checkpoint.state_snapshot.data == big
        await manager.create_checkpoint("wf-big", 3, "a", "running", big)
    assert await tree_records(url) == 1  # later checkpoints are incremental again
    assert (
        cli("verify", url, "--keys", keys_file(tmp_path / "new.json", {"k2": K2}, "k2")).code == 0
    )


async def run_killed(args: list[str], env: dict[str, str], kill_after: float | None) -> int:
    """``python -m aiocheckpoint ARGS``'s exit status; SIGKILLed after ``kill_after`` s."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiocheckpoint", *args,
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    if kill_after is not None:
        await asyncio.sleep(kill_after)
        # os.kill, not proc.send_signal: Popen.send_signal polls first, which reaps a
        # child that has just exited, and asyncio's child watcher then reports 255.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    return await proc.wait()


async def tree_records(url: str) -> int:
    """How many records of the store are encrypted incremental (sealed tree) records."""
    count = 0
    async with open_storage(url) as storage:
        for wf in await storage.list_workflows():
            count += sum(is_sealed_tree_record(r.data) for r in await storage.scan(wf))
    return count


@pytest.mark.slow  # a kill loop or a decoding bomb: the slow tier
async def test_rekey_survives_sigkill_with_writers_running(
    new_store: NewStore, tmp_path: Path
) -> None:
    url = new_store("sqlite")
    # 400 records: re-sealing them one save (and fsync) at a time outlasts the first kills
    # even on a quiet machine, so at least one kill lands while rekey runs.
    await populate(url, OLD, workflows=40, steps=10)
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    stop = asyncio.Event()

    async def writer(n: int) -> None:
        async with CheckpointManager(open_storage(url), encryption=BOTH) as manager:
            step = 10
            while not stop.is_set():
                wf = f"wf-{(n * 7 + step) % 20}"
                state = {"secret": CANARY, "n": step}
                await manager.create_checkpoint(wf, 1000 * (n + 1) + step, "w", "running", state)
                step += 1
                await asyncio.sleep(0.005)

    async def rekey(kill_after: float | None) -> int:
        return await run_killed(["rekey", url, "--keys", both], env, kill_after)

    writers = [asyncio.create_task(writer(n)) for n in range(3)]
    rng = random.Random(19)
    codes = []
    try:
        for low, high in [(0.25, 0.5), (0.5, 0.9), (0.6, 1.6), (0.6, 1.6)]:
            codes.append(await rekey(rng.uniform(low, high)))
            assert await read_all(url, BOTH) >= 400  # between kills: everything reads
        assert await rekey(None) in (0, 1)  # 1: writers changed records meanwhile
    finally:
        stop.set()
        await asyncio.gather(*writers)
    assert set(codes) <= {-signal.SIGKILL, 0, 1} and -signal.SIGKILL in codes
    assert await rekey(None) == 0
    assert await key_ids(url) == {"k2"}
    assert await read_all(url, NEW) >= 400


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_rekey_leaves_the_effects_of_a_workflow_a_runner_holds(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    """A runner holding a workflow's lease may be writing its effects: rekey re-seals none
    of them (its save could replace a newer outcome), names the workflow, and a later run
    re-seals them once the lease is free."""
    url = new_store(kind)
    await populate(url, OLD, workflows=2, steps=2)
    async with CheckpointManager(open_storage(url), encryption=OLD) as manager:
        await manager.record_effect(effect("bare", 0, "no checkpoint, no record"))
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    async with open_storage(url) as storage:
        assert isinstance(storage, WorkflowStorage)
        runner = await storage.acquire_lease("wf-0", "runner", 600)
        held = cli("--json", "rekey", url, "--keys", both)
        report = held.json()
        assert held.code != 0 and report["held"] == ["wf-0"]  # type: ignore[index]
        assert isinstance(storage, EffectStorage)
        for step in range(2):
            [mine] = await storage.load_effects("wf-0", step)
            [other] = await storage.load_effects("wf-1", step)
            assert sealed_key_id(mine.data, effect=True) == "k1"
            assert sealed_key_id(other.data, effect=True) == "k2"
        await storage.release_lease(runner)
    again = cli("--json", "rekey", url, "--keys", both)
    assert again.code == 0, again.out + again.err
    assert await key_ids(url) == {"k2"}
    async with CheckpointManager(open_storage(url), encryption=NEW) as manager:
        [bare] = await manager.get_effects("bare", 0)
        assert bare.result == "no checkpoint, no record"
        assert await manager.get_workflow("bare") is None  # no lease taken, no record made


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_rekey_cannot_write_over_a_runner_that_took_the_workflow_over(
    kind: str, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rekey reads an effect FAILED and checks it is unchanged; then its lease expires, a
    runner takes the workflow over, retries the call and records it DONE. Rekey's save,
    fenced by its own lease, is refused: the DONE record stands (the call is not repeated)
    and the workflow is reported as left to the runner."""
    url = new_store(kind)
    now = datetime.now(timezone.utc)
    intent = EffectRecord("w", 1, "call", "tool", EffectState.IN_DOUBT, 1, now, "i")
    failed = intent.finished(EffectState.FAILED, error={"type": "E", "message": "down"})
    async with CheckpointManager(open_storage(url), encryption=OLD) as manager:
        await manager.create_checkpoint("w", 0, "a", "running", {"n": 0})
        await manager.record_effect(failed)
    monkeypatch.setattr(rekey, "_LEASE_TTL", 0.05, raising=False)
    async with CheckpointManager(open_storage(url), encryption=BOTH) as manager:
        storage: Any = manager.storage
        load = storage.load_effects
        calls = 0

        async def checked_then_taken_over(workflow_id: str, step: int) -> list[StoredEffect]:
            nonlocal calls
            found: list[StoredEffect] = await load(workflow_id, step)
            calls += step == 1
            if calls == 2:  # rekey's check just before its save
                await asyncio.sleep(0.3)  # its lease has expired
                lease = await manager.acquire_lease("w", "runner", 600)
                retried = EffectRecord("w", 1, "call", "tool", EffectState.IN_DOUBT, 2, now, "i")
                await manager.record_effect(retried, lease=lease)
                await manager.record_effect(
                    retried.finished(EffectState.DONE, result="ok"), lease=lease
                )
            return found

        monkeypatch.setattr(storage, "load_effects", checked_then_taken_over)
        tally = rekey._Tally()
        job = rekey._Job(manager, Sealer(BOTH, allow_plaintext=True), "k2", False, tally)
        await job.workflow("w")
        monkeypatch.setattr(storage, "load_effects", load)
        [record] = await manager.get_effects("w", 1)
    assert (record.state, record.result, record.attempt) == (EffectState.DONE, "ok", 2)
    assert tally.held == ["w"]  # type: ignore[attr-defined]
