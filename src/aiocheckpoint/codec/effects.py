"""Effect records: one durable effect's intent or outcome, and its stored bytes.

An effect record is what :meth:`ResumableWorkflow.effect
<aiocheckpoint.ResumableWorkflow.effect>` writes before calling a function (its *intent*:
state ``in_doubt``) and after (its *outcome*: ``done`` with the result, or ``failed`` with
the error). Stored bytes::

    offset size  field
    0      4     magic  b"ACKE"
    4      1     format version (1)
    5      4     CRC-32 of the body, big-endian
    9      ...   body: one JSON object (the fields of EffectRecord)

The result goes through the value stage (:mod:`aiocheckpoint.codec.stages`), as a state
does: what an effect may return is what a state may hold. Nothing is ever unpickled or
evaluated.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Final

from .._validation import check_step
from ..errors import CheckpointCorruptedError, CheckpointSerializationError
from ..format.checksum import crc32
from ..format.jsonread import loads
from .jsonwrite import dumps
from .stages import DEFAULT_VALUES, ValueStage
from .verify import check_depth

__all__ = ["EffectRecord", "EffectState", "Reconciled", "decode_effect", "encode_effect"]

_MAGIC: Final = b"ACKE"
_VERSION: Final = 1
_HEAD: Final = struct.Struct(">4sBI")


class EffectState(str, Enum):
    """Where one effect stands."""

    #: The intent is recorded, the outcome is not: the call may or may not have happened
    #: (or it is running right now).
    IN_DOUBT = "in_doubt"
    #: The call returned; its result is recorded and is returned instead of calling again.
    DONE = "done"
    #: The call raised; the error is recorded and a retried step calls it again.
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One effect of one step, as its journal holds it.

    ``key`` names it within its step, ``name`` is the function's qualified name (a re-run
    that calls another function under the key raises
    :class:`~aiocheckpoint.EffectOrderError`), ``attempt`` counts its calls (1 for the
    first), ``idempotency_key`` is the same on every attempt. ``result`` is set when
    ``state`` is DONE, ``error`` (``{"type", "message"}``) when it is FAILED.
    """

    workflow_id: str
    step: int
    key: str
    name: str
    state: EffectState
    attempt: int
    intent_at: datetime
    idempotency_key: str
    finished_at: datetime | None = None
    result: Any = None
    error: dict[str, str] | None = None

    @property
    def in_doubt(self) -> bool:
        """Whether the intent has no recorded outcome."""
        return self.state is EffectState.IN_DOUBT

    def finished(
        self, state: EffectState, *, result: Any = None, error: dict[str, str] | None = None
    ) -> EffectRecord:
        """A copy with its outcome (``result`` or ``error``), finished now."""
        # Built directly: dataclasses.replace costs several times more, on every effect.
        return EffectRecord(
            self.workflow_id,
            self.step,
            self.key,
            self.name,
            state,
            self.attempt,
            self.intent_at,
            self.idempotency_key,
            _now(),
            result,
            error,
        )


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a ``reconcile`` callback found out about an effect in doubt.

    ``Reconciled(happened=True, result=...)``: the call did happen, and ``result`` is what
    it returned (recorded, then returned to the step). ``Reconciled(happened=False)``: it
    did not, and the function is called again.
    """

    happened: bool
    result: Any = None


def encode_effect(record: EffectRecord, values: ValueStage = DEFAULT_VALUES) -> tuple[bytes, Any]:
    """The stored bytes of ``record`` and the stored copy of its result.

    The result goes through the value stage ``values``: a result it cannot store raises
    :class:`~aiocheckpoint.CheckpointSerializationError`.
    """
    if record.result is None:  # an intent, a failure: no value to copy
        result, finite = None, True
    else:
        result, finite = values.copy(record.result, f"effect {record.key!r} result")
    body = {
        "workflow_id": record.workflow_id,
        "step": record.step,
        "key": record.key,
        "name": record.name,
        "state": record.state.value,
        "attempt": record.attempt,
        "intent_at": record.intent_at.isoformat(),
        "idempotency_key": record.idempotency_key,
        "finished_at": None if record.finished_at is None else record.finished_at.isoformat(),
        "result": result,
        "error": record.error,
    }
    try:
        text = dumps(body, finite)
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise CheckpointSerializationError(f"effect {record.key!r}", str(exc)) from exc
    return _HEAD.pack(_MAGIC, _VERSION, crc32(text)) + text, result


def decode_effect(data: bytes) -> EffectRecord:
    """The record stored as ``data``; :class:`CheckpointCorruptedError` if it does not verify."""
    if len(data) < _HEAD.size:
        raise CheckpointCorruptedError(f"effect record too short ({len(data)} bytes)")
    magic, version, crc = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if magic != _MAGIC or version != _VERSION:
        raise CheckpointCorruptedError("not an aiocheckpoint effect record (bad magic or version)")
    if crc32(body) != crc:
        raise CheckpointCorruptedError("effect record checksum mismatch")
    try:
        fields = loads(body)
        check_depth(fields.get("result"), "effect result")
        return _record(fields)
    except CheckpointCorruptedError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointCorruptedError(f"effect record does not parse: {exc}") from None


def _record(fields: dict[str, Any]) -> EffectRecord:
    for name in ("workflow_id", "key", "name", "idempotency_key"):
        if not isinstance(fields[name], str):
            raise TypeError(f"{name} is not a str")
    attempt = fields["attempt"]
    if type(attempt) is not int or attempt < 1:
        raise ValueError(f"bad attempt {attempt!r}")
    error = fields["error"]
    if error is not None and not (
        isinstance(error, dict) and all(isinstance(v, str) for v in error.values())
    ):
        raise TypeError("error is not an object of strings")
    finished = fields["finished_at"]
    return EffectRecord(
        workflow_id=fields["workflow_id"],
        step=check_step(fields["step"]),
        key=fields["key"],
        name=fields["name"],
        state=EffectState(fields["state"]),
        attempt=attempt,
        intent_at=_time(fields["intent_at"]),
        idempotency_key=fields["idempotency_key"],
        finished_at=None if finished is None else _time(finished),
        result=fields["result"],
        error=error,
    )


def _time(text: object) -> datetime:
    if not isinstance(text, str):
        raise TypeError("a time is not a str")
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        raise ValueError("a time without a time zone")
    return when
