"""What retention needs of a stored record, without its state: step, status and time.

A version-2 record keeps these fields apart from its state's tree, so reading them costs
the record alone (no blob is fetched); a version-1 record is one JSON body, parsed whole.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

import orjson

from ..errors import CheckpointCorruptedError
from ..format.checksum import crc32
from ..format.header import FORMAT_VERSION, HEADER_SIZE, MAGIC, read_header, record_format_version
from ..format.jsonread import loads_fast
from ..format.tree import open_record_v2
from ..models import AgentStatus

__all__ = ["RecordFacts", "plain_record_fields", "record_facts", "record_fields"]

#: The statuses by their stored text (a dict lookup costs a fraction of ``AgentStatus(text)``).
_STATUSES: Final = {status.value: status for status in AgentStatus}
#: A plain version-1 record's header up to its length: magic, version 1, no flags, reserved 0.
_PLAIN_V1: Final = MAGIC + bytes((FORMAT_VERSION, 0, 0, 0))
#: The rest of the header: the body's length and CRC-32.
_LENGTH_CRC: Final = struct.Struct(">QI")


@dataclass(frozen=True, slots=True)
class RecordFacts:
    """A stored checkpoint's step, agent status, timestamp and size in bytes."""

    step: int
    status: AgentStatus
    timestamp: datetime
    size: int


def record_facts(data: bytes) -> RecordFacts:
    """The facts of a record of either version; CheckpointCorruptedError if unreadable."""
    step, status, timestamp = record_fields(data)
    return RecordFacts(step=step, status=status, timestamp=timestamp, size=len(data))


def record_fields(data: bytes) -> tuple[int, AgentStatus, datetime]:
    """:func:`record_facts`' step, status and timestamp, as a plain tuple (no object).

    What a sweep judges each record it reads by; the same checks, the same errors.
    """
    try:
        fields = _fields(data)
        moment = datetime.fromisoformat(fields["timestamp"])
        return (
            _int(fields["step"]),
            _STATUSES[fields["status"]],
            moment if moment.tzinfo is not None else _aware(moment),
        )
    except CheckpointCorruptedError:
        raise
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise CheckpointCorruptedError(f"unreadable record fields ({type(exc).__name__})") from exc


def plain_record_fields(data: bytes) -> tuple[int, AgentStatus, datetime] | None:
    """:func:`record_fields` of a sound plain version-1 record, in one step; else None.

    None for anything else (a version-2 or sealed record, a damaged one, text orjson does
    not read): :func:`record_fields` then says what it is. What a sweep tries first on every
    record it judges: the same checks, without the general path's calls.
    """
    if data[:8] != _PLAIN_V1 or len(data) < HEADER_SIZE:
        return None
    length, crc = _LENGTH_CRC.unpack_from(data, 8)
    body = data[HEADER_SIZE:]
    if len(body) != length or crc32(body) != crc:
        return None
    try:
        fields = orjson.loads(body)
        step = fields["step"]
        status = _STATUSES[fields["status"]]
        moment = datetime.fromisoformat(fields["timestamp"])
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
        return None
    if type(step) is not int:
        return None
    return step, status, moment if moment.tzinfo is not None else _aware(moment)


def _fields(data: bytes) -> Any:
    if data[:8] != _PLAIN_V1:  # a plain version-1 record is what a sweep mostly reads
        if record_format_version(data) == 2:
            return open_record_v2(data)[0]
        read_header(data)  # raises: no plain version-1 header is a valid one
    if len(data) < HEADER_SIZE:
        raise CheckpointCorruptedError(f"record too short ({len(data)} bytes)")
    length, crc = _LENGTH_CRC.unpack_from(data, 8)
    body = data[HEADER_SIZE:]
    if len(body) != length or crc32(body) != crc:
        raise CheckpointCorruptedError("checksum mismatch or truncated body")
    # orjson where it reads the text (a sweep judges every record it reads: it parses them
    # ~3x as fast); an int beyond 64 bits it reads as a float, which no field read here
    # can be (a step that is not an int makes the record unreadable, and kept).
    fields = loads_fast(body)
    if type(fields) is not dict:
        raise CheckpointCorruptedError("body is not a JSON object")
    return fields


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError("step is not an int")
    return value


def _aware(moment: datetime) -> datetime:
    # The writers store UTC; a time without a zone is read as UTC too.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
