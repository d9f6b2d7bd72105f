"""Sealed fields: the texts of a workflow's events and record that an encrypted store seals.

A manager with ``encryption=`` seals, before they reach the storage, the values a person
wrote or a run produced: a pause's reason and data, a resume's input (the event's and the
record's ``resume_input``), a cancel's reason and a failed run's error message (the
events' and the record's ``last_error``). It opens them when it reads the record or the
events. The storage stays opaque: it stores and copies the sealed text like any other, and
composes its events from it as it does from plain text.

A sealed value is the str ``"ackx:"`` + the base64 of an envelope of kind 4
(:mod:`aiocheckpoint.codec.sealing`) holding the value's JSON text, put in the value's
place. Its associated data is the workflow id and the field's *label* (the event kind and
field it belongs to, :data:`EVENT_FIELDS`), so a sealed text moved to another workflow, or
to another kind of field, fails to open with :class:`~aiocheckpoint.DecryptionError`; a
key the keyring lacks raises :class:`~aiocheckpoint.UnknownKeyError`. The event's
sequence number is not bound: the store assigns it in the write's own transaction, after
the text was sealed, so two texts of the same label in one workflow's history (two failed
runs' messages, say) could be swapped by someone who can write the store.

What stays in the clear is listed in ``docs/encryption.md``: the event kinds, times, steps
and attempts, an error's type, and the fields no person writes (retry and wake-up times,
lease owners, fork sources, a retried workflow's previous status).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Final

from ..errors import DecryptionError, PlaintextRecordError
from ..leases import WorkflowRecord
from .sealing import ENVELOPE_MAGIC, Sealer

__all__ = [
    "CANCEL_LABEL",
    "EVENT_FIELDS",
    "FAILURE_LABEL",
    "KEEP",
    "RESUME_LABEL",
    "SEALED_PREFIX",
    "FieldSealer",
    "is_sealed_text",
    "locked_view",
    "sealed_text_key",
]

#: What a sealed value (a str) starts with.
SEALED_PREFIX: Final = "ackx:"
#: The label of a resume's input: the ``resumed`` event's and the record's ``resume_input``.
RESUME_LABEL: Final = "resumed.input"
#: The label of a cancel's reason: the ``cancelled`` event's and the record's message.
CANCEL_LABEL: Final = "cancelled.reason"
#: The label of a failed run's message: its events' and the record's ``last_error``.
FAILURE_LABEL: Final = "step_failed.message"
#: The sealed fields of each event kind, with the label each is sealed under.
EVENT_FIELDS: Final[dict[str, dict[str, str]]] = {
    "paused": {"reason": "paused.reason", "data": "paused.data"},
    "resumed": {"input": RESUME_LABEL},
    "cancelled": {"reason": CANCEL_LABEL},
    "step_failed": {"message": FAILURE_LABEL},
    # The same error as the step_failed event written with it.
    "effect_in_doubt": {"message": FAILURE_LABEL},
}
_CANCELLED_ERROR: Final = "WorkflowCancelledError"
#: What :meth:`FieldSealer.reseal` returns for a value that need not be sealed again.
KEEP: Final = object()


def is_sealed_text(value: object) -> bool:
    """Whether ``value`` is a sealed field's text."""
    return isinstance(value, str) and value.startswith(SEALED_PREFIX)


def sealed_text_key(value: str) -> str | None:
    """The key id a sealed field's text names, or None if it is not one."""
    try:
        envelope = base64.b64decode(value[len(SEALED_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None
    if not envelope.startswith(ENVELOPE_MAGIC) or len(envelope) < 7:
        return None
    return envelope[7 : 7 + envelope[6]].decode("utf-8", "replace")


def locked_view(value: Any) -> Any:
    """``value`` with each sealed text in it shown as ``[sealed: key ID]``.

    What a reader without the keys prints: the sealed text itself says nothing, at length.
    """
    if is_sealed_text(value):
        key_id = sealed_text_key(value)
        return "[sealed]" if key_id is None else f"[sealed: key {key_id!r}]"
    if isinstance(value, dict):
        return {key: locked_view(item) for key, item in value.items()}
    if isinstance(value, list):
        return [locked_view(item) for item in value]
    return value


def _envelope(label: str, value: str, workflow_id: str) -> bytes:
    """The envelope a sealed text holds; DecryptionError if it holds none."""
    try:
        return base64.b64decode(value[len(SEALED_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise DecryptionError(f"{label}: not a sealed text", workflow_id=workflow_id) from None


class FieldSealer:
    """Seals and opens the fields of one manager's events and records (module docstring).

    Without a sealer (a manager without ``encryption=``) it changes nothing either way: a
    sealed text read without keys stays as it is (the CLI shows it as locked).
    """

    def __init__(self, sealer: Sealer | None) -> None:
        self._sealer = sealer

    @property
    def sealing(self) -> bool:
        """Whether this manager seals (it has keys)."""
        return self._sealer is not None

    async def seal(self, workflow_id: str, label: str, value: Any) -> Any:
        """``value`` sealed under ``label`` (a str), or as it is without keys."""
        if self._sealer is None:
            return value
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return await self._seal_text(workflow_id, label, text)

    async def seal_resume(self, workflow_id: str, value: Any) -> Any:
        """A resume's input, sealed (the ``resumed`` event's and the record's)."""
        return await self.seal(workflow_id, RESUME_LABEL, value)

    async def seal_reason(self, workflow_id: str, reason: str) -> str:
        """A cancel's reason, sealed (the ``cancelled`` event's and the record's message)."""
        sealed: str = await self.seal(workflow_id, CANCEL_LABEL, reason)
        return sealed

    async def seal_error(self, workflow_id: str, error: dict[str, str]) -> dict[str, str]:
        """A failed run's error (``type``, ``message``) with its message sealed."""
        if self._sealer is None:
            return error
        return {**error, "message": await self.seal(workflow_id, FAILURE_LABEL, error["message"])}

    async def pause_data(self, workflow_id: str, reason: str, data_text: str) -> str:
        """The ``paused`` event's data (JSON text): ``reason`` and ``data``, each sealed."""
        if self._sealer is None:
            return f'{{"reason": {json.dumps(reason)}, "data": {data_text}}}'
        sealed_reason = await self.seal(workflow_id, "paused.reason", reason)
        sealed_data = await self._seal_text(workflow_id, "paused.data", data_text)
        return json.dumps({"reason": sealed_reason, "data": sealed_data})

    async def _seal_text(self, workflow_id: str, label: str, text: str) -> str:
        assert self._sealer is not None
        envelope = await self._sealer.seal_text(workflow_id, label, text.encode("utf-8"))
        return SEALED_PREFIX + base64.b64encode(envelope).decode("ascii")

    async def open(self, workflow_id: str, label: str, value: Any) -> Any:
        """The value a sealed text holds; any other value as it is."""
        if self._sealer is None or not is_sealed_text(value):
            return value
        envelope = _envelope(label, value, workflow_id)
        plain = await self._sealer.unseal_text(workflow_id, label, envelope)
        try:
            return json.loads(plain)
        except ValueError:
            raise DecryptionError(f"{label}: holds no JSON", workflow_id=workflow_id) from None

    async def open_event(self, workflow_id: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        """An event's data with its sealed fields opened."""
        fields = EVENT_FIELDS.get(kind)
        if self._sealer is None or not fields:
            return data
        opened = dict(data)
        for name, label in fields.items():
            if name in opened:
                opened[name] = await self.open(workflow_id, label, opened[name])
        return opened

    async def reseal(self, workflow_id: str, label: str, value: Any, *, plaintext: bool) -> Any:
        """``value`` sealed again under the primary key, or :data:`KEEP` if it need not be.

        A text sealed under another key is opened and sealed under the primary one (its JSON
        text unchanged); with ``plaintext``, a plain value (other than None) is sealed.
        """
        assert self._sealer is not None
        if is_sealed_text(value):
            if sealed_text_key(value) == self._sealer.provider.primary:
                return KEEP
            plain = await self._sealer.unseal_text(
                workflow_id, label, _envelope(label, value, workflow_id)
            )
            try:
                json.loads(plain)
            except ValueError:
                raise DecryptionError(f"{label}: holds no JSON", workflow_id=workflow_id) from None
            return await self._seal_text(workflow_id, label, plain.decode("utf-8"))
        if value is None or not plaintext:
            return KEEP
        return await self.seal(workflow_id, label, value)

    async def reseal_event(
        self, workflow_id: str, kind: str, data: str, *, plaintext: bool
    ) -> str | None:
        """An event's data (JSON text) with its fields sealed again (:meth:`reseal`), or None."""
        fields = EVENT_FIELDS.get(kind)
        if not fields:
            return None
        opened = json.loads(data)
        changed = False
        for name, label in fields.items():
            if isinstance(opened, dict) and name in opened:
                value = await self.reseal(workflow_id, label, opened[name], plaintext=plaintext)
                if value is not KEEP:
                    opened[name], changed = value, True
        return json.dumps(opened) if changed else None

    async def reseal_record(
        self, record: WorkflowRecord, *, plaintext: bool
    ) -> list[tuple[str, Any, Any]]:
        """The record's fields to seal again: (``resume_input`` or ``error_message``, old, new)."""
        wf = record.workflow_id
        found: list[tuple[str, Any, Any]] = []
        value = await self.reseal(wf, RESUME_LABEL, record.resume_input, plaintext=plaintext)
        if value is not KEEP:
            found.append(("resume_input", record.resume_input, value))
        error = record.last_error
        if error is not None and "message" in error:
            label = CANCEL_LABEL if error.get("type") == _CANCELLED_ERROR else FAILURE_LABEL
            value = await self.reseal(wf, label, error["message"], plaintext=plaintext)
            if value is not KEEP:
                found.append(("error_message", error["message"], value))
        return found

    async def open_record(self, record: WorkflowRecord) -> WorkflowRecord:
        """``record`` with its resume input and error message opened.

        A plaintext resume input on an encrypted store is refused with
        :class:`~aiocheckpoint.PlaintextRecordError` unless the manager allows plaintext
        (it is what the next run reads); a plaintext error message, written before its
        store was encrypted, is read as it is.
        """
        if self._sealer is None:
            return record
        wf = record.workflow_id
        changes: dict[str, Any] = {}
        if record.resume_input is not None:
            if not is_sealed_text(record.resume_input) and not self._sealer.allow_plaintext:
                raise PlaintextRecordError(
                    "the resume input is not encrypted (pass allow_plaintext=True only to "
                    "migrate a store)",
                    workflow_id=wf,
                )
            changes["resume_input"] = await self.open(wf, RESUME_LABEL, record.resume_input)
        error = record.last_error
        if error is not None and is_sealed_text(error.get("message")):
            label = CANCEL_LABEL if error.get("type") == _CANCELLED_ERROR else FAILURE_LABEL
            message = await self.open(wf, label, error["message"])
            changes["last_error"] = {**error, "message": message}
        return record.model_copy(update=changes) if changes else record
