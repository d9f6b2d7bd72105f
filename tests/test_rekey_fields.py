"""``rekey`` and ``encrypt`` re-seal the sealed fields: events' texts, resume input, failure text.

After a rotation whose old key is then dropped, every event and workflow record reads with
the new key alone, and the store holds no text sealed under the old key (every sealed text
in its bytes names the new key) and no plaintext of them. The memory store runs the
command's job in this process (it has no URL); SQLite and PostgreSQL run the real command.
A SIGKILL anywhere in a rekey, while a runner keeps failing, pausing and resuming
workflows, leaves every text readable with both keys, and a run after it finishes the job.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
from pathlib import Path

import pytest

from aiocheckpoint import (
    CheckpointManager,
    EventKind,
    Keyring,
    ResumableWorkflow,
    RetryPolicy,
    UnknownKeyError,
    open_storage,
)
from aiocheckpoint.cli import rekey
from aiocheckpoint.codec import Sealer, sealed_text_key
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from tests.test_cli import SRC, NewStore, cli, new_store
from tests.test_cli_encryption import keys_file, run_killed
from tests.test_sealed_events import _raw_text

__all__ = ["new_store"]

pytestmark = pytest.mark.asyncio

OLD_ID, NEW_ID = "old-7c1d", "new-2b8e"
K_OLD, K_NEW = os.urandom(32), os.urandom(32)
OLD = Keyring(keys={OLD_ID: K_OLD}, primary=OLD_ID)
BOTH = Keyring(keys={OLD_ID: K_OLD, NEW_ID: K_NEW}, primary=NEW_ID)
NEW = Keyring(keys={NEW_ID: K_NEW}, primary=NEW_ID)
SECRETS = ["reason-5e1a", "data-c3f0", "input-9d2b", "message-71ae", "cancel-0f6c"]
SEALED = re.compile(r"ackx:[A-Za-z0-9+/=]+")


class Boom(RuntimeError):
    """A step's failure."""


async def story(manager: CheckpointManager, wf: str = "wf") -> None:
    """Pause, resume with input, fail, cancel; ``{wf}-failed`` fails; ``{wf}-paused`` waits."""
    await manager.register_workflow(wf)
    async with ResumableWorkflow(wf, manager) as run:
        async with run.step(0, agent_id="a"):
            pass
        await run.pause(SECRETS[0], {"note": SECRETS[1]})
    await manager.resume_workflow(wf, {"answer": SECRETS[2]})
    await manager.record_failure(wf, Boom(SECRETS[3]), retry=RetryPolicy(max_attempts=3))
    await manager.cancel_workflow(wf, reason=SECRETS[4])
    await manager.register_workflow(f"{wf}-failed")  # a record and no checkpoint
    await manager.record_failure(f"{wf}-failed", Boom(SECRETS[3]))
    await manager.register_workflow(f"{wf}-paused")
    await manager.mark_workflow(f"{wf}-paused", "paused")
    await manager.resume_workflow(f"{wf}-paused", [SECRETS[2]])


async def check_readable(storage: CheckpointStorage, keys: Keyring, wf: str = "wf") -> None:
    """Every sealed field of ``story``'s workflows reads with ``keys``."""
    manager = CheckpointManager(storage, encryption=keys)
    data = {e.kind: e.data for e in await manager.get_events(wf)}
    assert data[EventKind.PAUSED] == {"reason": SECRETS[0], "data": {"note": SECRETS[1]}}
    assert data[EventKind.RESUMED] == {"input": {"answer": SECRETS[2]}}
    assert data[EventKind.STEP_FAILED]["message"] == SECRETS[3]
    assert data[EventKind.CANCELLED] == {"reason": SECRETS[4]}
    record = await manager.get_workflow(wf)
    assert record is not None and record.resume_input == {"answer": SECRETS[2]}
    assert record.last_error == {"type": "WorkflowCancelledError", "message": SECRETS[4]}
    failed = await manager.get_workflow(f"{wf}-failed")
    assert failed is not None and failed.last_error == {"type": "Boom", "message": SECRETS[3]}
    paused = await manager.get_workflow(f"{wf}-paused")
    assert paused is not None and paused.resume_input == [SECRETS[2]]
    first = (await manager.get_events(f"{wf}-failed"))[0]
    assert first.data["message"] == SECRETS[3]


def sealed_keys(raw: str) -> list[str | None]:
    """The key id of every sealed text in a store's bytes."""
    return [sealed_text_key(token) for token in SEALED.findall(raw)]


async def run_job(storage: CheckpointStorage, *, encrypt: bool) -> rekey._Tally:
    """What ``rekey`` (or ``encrypt``) does to each workflow, in this process."""
    tally = rekey._Tally()
    manager = CheckpointManager(storage)
    job = rekey._Job(manager, Sealer(BOTH, allow_plaintext=True), NEW_ID, encrypt, tally)
    ids = sorted({*await manager.list_workflows(), *await rekey._recorded(manager)})
    for workflow_id in ids:
        await job.workflow(workflow_id)
    return tally


async def test_memory_rekey_then_the_old_key_dropped() -> None:
    storage = InMemoryCheckpointStorage()
    await story(CheckpointManager(storage, encryption=OLD))
    with pytest.raises(UnknownKeyError):
        await CheckpointManager(storage, encryption=NEW).get_events("wf")
    tally = await run_job(storage, encrypt=False)
    assert tally.texts >= 8 and not (tally.bad or tally.unreadable or tally.left), tally
    await check_readable(storage, NEW)
    raw = await _raw_text(storage, Path("."))
    found = sealed_keys(raw)
    assert found and set(found) == {NEW_ID}
    assert not any(secret in raw for secret in SECRETS)
    again = await run_job(storage, encrypt=False)
    assert again.texts == 0  # everything is under the primary key: nothing to do


async def test_memory_encrypt_seals_plain_fields() -> None:
    storage = InMemoryCheckpointStorage()
    await story(CheckpointManager(storage))
    tally = await run_job(storage, encrypt=True)
    assert tally.texts >= 8 and not (tally.bad or tally.unreadable), tally
    await check_readable(storage, NEW)
    raw = await _raw_text(storage, Path("."))
    assert set(sealed_keys(raw)) == {NEW_ID}
    assert not any(secret in raw for secret in SECRETS)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_cli_rekey_then_encrypt_on_real_stores(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    url = new_store(kind)
    async with CheckpointManager(open_storage(url), encryption=OLD) as manager:
        await story(manager)
    both = keys_file(tmp_path / "both.json", {OLD_ID: K_OLD, NEW_ID: K_NEW}, NEW_ID)
    result = cli("--json", "rekey", url, "--keys", both)
    assert result.code == 0, result.out + result.err
    assert result.json()["texts"] >= 8  # type: ignore[index]
    async with open_storage(url) as storage:
        await check_readable(storage, NEW)
        raw = await _rows_text(storage)
    found = sealed_keys(raw)
    assert found and set(found) == {NEW_ID}, found
    assert not any(secret in raw for secret in SECRETS)
    new = keys_file(tmp_path / "new.json", {NEW_ID: K_NEW}, NEW_ID)
    events = cli("events", url, "wf", "--keys", new)
    assert events.code == 0 and SECRETS[4] in events.out, events.err

    plain = new_store(kind)
    async with CheckpointManager(open_storage(plain)) as manager:
        await story(manager)
    assert cli("encrypt", plain, "--keys", new).code == 0
    async with open_storage(plain) as storage:
        await check_readable(storage, NEW)
        raw = await _rows_text(storage)
    assert set(sealed_keys(raw)) == {NEW_ID}
    assert not any(secret in raw for secret in SECRETS)


async def _rows_text(storage: CheckpointStorage) -> str:
    """The workflow records' and events' stored texts, as the store reads them.

    Not the file's bytes: SQLite keeps a rewritten row's old text in the WAL and in free
    pages until they are reused (``aiocheckpoint compact`` rewrites the file).
    """
    from aiocheckpoint.storage.events import EventStorage

    assert isinstance(storage, EventStorage)
    parts = []
    for record in await storage.list_workflow_records():
        parts.append(repr(record))
        parts += [repr(e) for e in await storage.get_events(record.workflow_id)]
    return "\n".join(parts)


@pytest.mark.slow
async def test_rekey_of_fields_survives_sigkill_with_a_runner_writing(
    new_store: NewStore, tmp_path: Path
) -> None:
    url = new_store("sqlite")
    async with CheckpointManager(open_storage(url), encryption=OLD) as manager:
        for w in range(30):
            await story(manager, f"wf{w}")
            for step in range(1, 8):  # records for rekey to seal, one save each
                await manager.create_checkpoint(f"wf{w}-failed", step, "a", "running", {})
    both = keys_file(tmp_path / "both.json", {OLD_ID: K_OLD, NEW_ID: K_NEW}, NEW_ID)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    stop = asyncio.Event()

    async def runner() -> None:  # fails and pauses other workflows, under either key
        async with CheckpointManager(open_storage(url), encryption=BOTH) as manager:
            n = 0
            while not stop.is_set():
                wf = f"live{n % 5}"
                await manager.register_workflow(wf)
                await manager.record_failure(wf, Boom(SECRETS[3]))
                await manager.mark_workflow(wf, "paused")
                await manager.resume_workflow(wf, {"n": n})
                n += 1
                await asyncio.sleep(0.005)

    async def run(kill_after: float | None) -> int:
        return await run_killed(["rekey", url, "--keys", both], env, kill_after)

    async def readable(keys: Keyring) -> None:
        async with open_storage(url) as storage:
            for w in range(30):
                await check_readable(storage, keys, f"wf{w}")
            manager = CheckpointManager(storage, encryption=keys)
            for n in range(5):
                await manager.get_events(f"live{n}")
                await manager.get_workflow(f"live{n}")

    task = asyncio.create_task(runner())
    rng = random.Random(33)
    codes = []
    try:
        for low, high in [(0.3, 0.6), (0.5, 1.0), (0.5, 1.5)]:
            codes.append(await run(rng.uniform(low, high)))
            await readable(BOTH)  # between kills: every text reads with the keyring
        assert await run(None) in (0, 1)  # 1: the runner changed texts meanwhile
    finally:
        stop.set()
        await task
    assert set(codes) <= {-signal.SIGKILL, 0, 1} and -signal.SIGKILL in codes
    assert await run(None) == 0
    await readable(NEW)
    async with open_storage(url) as storage:
        raw = await _rows_text(storage)
    assert set(sealed_keys(raw)) == {NEW_ID}


async def test_export_plaintext_opens_the_sealed_fields(
    new_store: NewStore, tmp_path: Path
) -> None:
    """`export --plaintext` writes events' sealed fields opened; a plain export keeps them."""
    url = new_store("sqlite")
    async with CheckpointManager(open_storage(url), encryption=OLD) as manager:
        await story(manager)
    keys = keys_file(tmp_path / "old.json", {OLD_ID: K_OLD}, OLD_ID)
    sealed, opened = tmp_path / "sealed.jsonl", tmp_path / "opened.jsonl"
    assert cli("export", url, str(sealed), "--keys", keys).code == 0
    assert cli("export", url, str(opened), "--keys", keys, "--plaintext").code == 0
    assert not any(secret in sealed.read_text() for secret in SECRETS)
    lines = [json.loads(line) for line in opened.read_text().splitlines()]
    data = {
        e["kind"]: e["data"] for e in lines if e.get("type") == "event" and e["workflow_id"] == "wf"
    }
    assert data["paused"] == {"reason": SECRETS[0], "data": {"note": SECRETS[1]}}
    assert data["cancelled"] == {"reason": SECRETS[4]}
    assert "ackx:" not in opened.read_text()
