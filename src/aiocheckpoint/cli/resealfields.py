"""``rekey`` and ``encrypt`` for sealed fields: events' texts and workflow records' fields.

An encrypted store seals the texts a person wrote or a run produced (:mod:`aiocheckpoint.codec`'s
``FieldSealer``): a pause's reason and data, a resume's input, a cancel's reason and a failed
run's message, in the events and in the workflow record. A text sealed under another key than
the primary one is opened and sealed again under the primary key (``encrypt`` also seals a
plain one), and put back with the storage's ``reseal``: only where the stored text is still the
one read, in one transaction per page of events (and one for the record). A run stopped
anywhere leaves each text under the old key or the new one, both in the keyring; a text a
runner changed meanwhile (a new resume input, a later failure) is the runner's, and left to it.
"""

from __future__ import annotations

import json
from typing import Any, Final, Protocol

from ..codec import FieldSealer
from ..errors import DecryptionError, EncryptionError, UnknownKeyError
from ..storage.base import CheckpointStorage
from ..storage.events import MAX_EVENT_PAGE, EventStorage, Reseal
from .redact import redact

__all__ = ["reseal_fields"]

#: Events read (and re-sealed, in one transaction) at a time.
_PAGE: Final = MAX_EVENT_PAGE


class _Tally(Protocol):
    texts: int
    left: int
    bad: list[dict[str, Any]]
    unreadable: list[dict[str, Any]]


async def reseal_fields(
    storage: CheckpointStorage,
    fields: FieldSealer,
    workflow_id: str,
    tally: _Tally,
    *,
    plaintext: bool,
) -> None:
    """Seal the workflow's events' and record's texts again under the primary key."""
    if not isinstance(storage, EventStorage):
        return
    after: int | None = None
    while True:
        page = await storage.get_events(workflow_id, after=after, limit=_PAGE)
        changes: list[Reseal] = []
        for event in page:
            try:
                new = await fields.reseal_event(
                    workflow_id, event.kind, event.data, plaintext=plaintext
                )
            except (EncryptionError, ValueError) as exc:
                _problem(tally, workflow_id, event.step, f"event {event.seq}", exc)
                continue
            if new is not None:
                changes.append(Reseal("event", event.data, new, event.seq))
        await _put(storage, workflow_id, changes, tally)
        if len(page) < _PAGE:
            break
        after = page[-1].seq
    record = await storage.get_workflow(workflow_id)
    if record is None:
        return
    try:
        found = await fields.reseal_record(record, plaintext=plaintext)
    except EncryptionError as exc:
        _problem(tally, workflow_id, record.latest_step, "workflow record", exc)
        return
    changes = [Reseal(name, _json(old), _json(new)) for name, old, new in found]
    await _put(storage, workflow_id, changes, tally)


async def _put(
    storage: EventStorage, workflow_id: str, changes: list[Reseal], tally: _Tally
) -> None:
    if changes:
        done = await storage.reseal(workflow_id, changes)
        tally.texts += done
        tally.left += len(changes) - done  # changed or deleted meanwhile: the writer's


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _problem(tally: _Tally, workflow_id: str, step: int | None, what: str, exc: Exception) -> None:
    if isinstance(exc, UnknownKeyError):
        reason = f"{what}: unreadable: key {exc.key_id!r} not in the keyring"
        tally.unreadable.append({"workflow_id": workflow_id, "step": step, "reason": reason})
        return
    reason = exc.reason if isinstance(exc, DecryptionError) else "holds no JSON object"
    tally.bad.append(
        {"workflow_id": workflow_id, "step": step, "reason": f"{what}: {redact(reason)}"}
    )
