"""Sealed fields on an encrypted store: events, resume input and failure text, per backend.

The stored bytes (the SQLite file, the PostgreSQL rows, what the memory store keeps) hold
no plaintext of a pause reason or data, a resume input, an error message or a cancel
reason; a manager with the key reads them back, one without keys sees them sealed, one
without the key id is refused with UnknownKeyError, and a sealed text moved to another
workflow fails with DecryptionError.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import pytest

from aiocheckpoint import (
    CheckpointManager,
    DecryptionError,
    EventKind,
    InvalidArgumentError,
    Keyring,
    ResumableWorkflow,
    RetryPolicy,
    UnknownKeyError,
)
from aiocheckpoint.codec import FieldSealer, Sealer, is_sealed_text
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.events import EventStorage
from tests.backend_support import WITH_RECORDS, make_storage
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

pytestmark = pytest.mark.asyncio

K1 = os.urandom(32)
SECRETS = [
    "pause-reason-7f3a",
    "pause-data-91c2",
    "resume-input-4d8e",
    "error-message-b6f1",
    "cancel-reason-2e9d",
]


class Boom(RuntimeError):
    """A step's failure."""


@pytest.fixture(params=WITH_RECORDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[CheckpointStorage]:
    async with make_storage(request.param, tmp_path, pg_schema) as storage:
        yield storage


def _keys(name: str = "k1") -> Keyring:
    return Keyring(keys={name: K1 if name == "k1" else os.urandom(32)}, primary=name)


async def _story(manager: CheckpointManager) -> None:
    """Pause (reason, data), resume (input), fail (message), cancel (reason)."""
    await manager.register_workflow("wf")
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="a"):
            pass
        await wf.pause(SECRETS[0], {"note": SECRETS[1]})
    resumed = await manager.resume_workflow("wf", {"answer": SECRETS[2]})
    assert resumed.resume_input == {"answer": SECRETS[2]}
    failed = await manager.record_failure("wf", Boom(SECRETS[3]), retry=RetryPolicy(max_attempts=3))
    assert failed.last_error == {"type": "Boom", "message": SECRETS[3]}
    cancelled = await manager.cancel_workflow("wf", reason=SECRETS[4])
    assert cancelled.last_error == {"type": "WorkflowCancelledError", "message": SECRETS[4]}


async def _raw_text(storage: CheckpointStorage, tmp_path: Path) -> str:
    """Everything the store keeps of the workflow, as text (the bytes it holds)."""
    name = type(storage).__name__
    if name.startswith("SQLite"):
        files = await anyio.to_thread.run_sync(lambda: sorted(tmp_path.glob("store.db*")))
        raw = [await anyio.Path(p).read_bytes() for p in files]  # the file and its WAL
        return b"".join(raw).decode("latin-1")
    if name.startswith("Postgres"):
        schema = storage._schema  # type: ignore[attr-defined]
        con = await asyncpg.connect(DSN)
        try:
            rows = await con.fetch(
                f'SELECT t::text FROM "{schema}".workflows t UNION ALL '
                f'SELECT t::text FROM "{schema}".workflow_events t'
            )
        finally:
            await con.close()
        return "\n".join(row[0] for row in rows)
    assert isinstance(storage, EventStorage)
    record = await storage.get_workflow("wf")
    return repr(record) + repr(await storage.get_events("wf"))


def _data_of(events: list[object], kind: EventKind) -> dict[str, object]:
    found = [e.data for e in events if e.kind is kind]  # type: ignore[attr-defined]
    assert len(found) == 1, (kind, events)
    return found[0]  # type: ignore[no-any-return]


async def test_sealed_fields_stored_sealed_and_read_back(
    store: CheckpointStorage, tmp_path: Path
) -> None:
    manager = CheckpointManager(store, encryption=_keys())  # not closed: the store is the test's
    await _story(manager)
    events = list(await manager.get_events("wf"))
    record = await manager.get_workflow("wf")
    assert _data_of(events, EventKind.PAUSED) == {
        "reason": SECRETS[0],
        "data": {"note": SECRETS[1]},
    }
    assert _data_of(events, EventKind.RESUMED) == {"input": {"answer": SECRETS[2]}}
    assert _data_of(events, EventKind.STEP_FAILED) == {"type": "Boom", "message": SECRETS[3]}
    assert _data_of(events, EventKind.CANCELLED) == {"reason": SECRETS[4]}
    assert record is not None
    assert record.last_error == {"type": "WorkflowCancelledError", "message": SECRETS[4]}
    raw = await _raw_text(store, tmp_path)
    assert "Boom" in raw and "WorkflowCancelledError" in raw  # what stays in the clear
    for secret in SECRETS:
        assert secret not in raw, secret


async def test_without_keys_sealed_and_without_the_key_refused(store: CheckpointStorage) -> None:
    await _story(CheckpointManager(store, encryption=_keys()))
    plain = CheckpointManager(store)
    events = list(await plain.get_events("wf"))
    record = await plain.get_workflow("wf")
    paused = _data_of(events, EventKind.PAUSED)
    assert is_sealed_text(paused["reason"]) and is_sealed_text(paused["data"])
    assert is_sealed_text(_data_of(events, EventKind.RESUMED)["input"])
    assert record is not None and record.last_error is not None
    assert is_sealed_text(record.last_error["message"])
    other = CheckpointManager(store, encryption=_keys("k2"))
    with pytest.raises(UnknownKeyError) as caught:
        await other.get_events("wf")
    assert caught.value.key_id == "k1" and caught.value.workflow_id == "wf"
    with pytest.raises(UnknownKeyError):
        await other.get_workflow("wf")
    with pytest.raises(UnknownKeyError):
        await other.list_workflow_records()


async def test_a_sealed_text_moved_to_another_workflow_or_field_fails(
    store: CheckpointStorage,
) -> None:
    assert isinstance(store, EventStorage)
    manager = CheckpointManager(store, encryption=_keys())
    await _story(manager)
    stored = await store.get_events("wf")
    await manager.register_workflow("other")
    await store.put_events("other", stored, replace=True)
    with pytest.raises(DecryptionError) as caught:
        await manager.get_events("other")
    assert caught.value.workflow_id == "other"
    # Within its workflow, a pause's reason put where its data goes does not open.
    paused = next(e for e in stored if e.kind == "paused")
    reason = json.loads(paused.data)["reason"]
    swapped = dataclasses.replace(paused, data=json.dumps({"reason": reason, "data": reason}))
    await store.put_events("wf", [swapped], replace=True)
    with pytest.raises(DecryptionError):
        await manager.get_events("wf")


async def test_the_web_shows_a_sealed_text_locked() -> None:
    from aiocheckpoint.web.app import shown

    fields = FieldSealer(Sealer(_keys()))
    token = await fields.seal("wf", "step_failed.message", "card-declined")
    assert "card-declined" not in token
    assert shown(token) == "[sealed: key 'k1']"
    assert await fields.open("wf", "step_failed.message", token) == "card-declined"
    with pytest.raises(DecryptionError):
        await fields.open("wf", "cancelled.reason", token)


async def test_the_timeline_names_a_sealed_error_by_its_key(store: CheckpointStorage) -> None:
    from aiocheckpoint.web.timeline import _ending

    await _story(CheckpointManager(store, encryption=_keys()))
    record = await CheckpointManager(store).get_workflow("wf")  # no keys: sealed
    assert record is not None
    (span,) = _ending(record, record.updated_at)
    assert span.title.endswith(": WorkflowCancelledError [sealed: key 'k1']"), span.title


async def test_a_sealed_resume_input_is_held_to_the_field_limit(store: CheckpointStorage) -> None:
    manager = CheckpointManager(store, encryption=_keys())
    await manager.register_workflow("wf")
    await manager.mark_workflow("wf", "paused")
    with pytest.raises(InvalidArgumentError, match="resume input is over"):
        await manager.resume_workflow("wf", "x" * 60_000)  # fits plain, not sealed
    record = await manager.get_workflow("wf")
    assert record is not None and str(record.status) == "paused"
    resumed = await manager.resume_workflow("wf", "x" * 40_000)
    assert resumed.resume_input == "x" * 40_000
