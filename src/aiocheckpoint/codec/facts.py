"""What retention needs of a stored record, without its state: step, status and time.

A version-2 record keeps these fields apart from its state's tree, so reading them costs
the record alone (no blob is fetched); a version-1 record is one JSON body, parsed whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..errors import CheckpointCorruptedError
from ..format.checksum import crc32
from ..format.header import HEADER_SIZE, read_header, record_format_version
from ..format.jsonread import loads_fast
from ..format.tree import open_record_v2
from ..models import AgentStatus

__all__ = ["RecordFacts", "record_facts"]


@dataclass(frozen=True, slots=True)
class RecordFacts:
    """A stored checkpoint's step, agent status, timestamp and size in bytes."""

    step: int
    status: AgentStatus
    timestamp: datetime
    size: int


def record_facts(data: bytes) -> RecordFacts:
    """The facts of a record of either version; CheckpointCorruptedError if unreadable."""
    try:
        fields = _fields(data)
        return RecordFacts(
            step=_int(fields["step"]),
            status=AgentStatus(fields["status"]),
            timestamp=_aware(datetime.fromisoformat(fields["timestamp"])),
            size=len(data),
        )
    except CheckpointCorruptedError:
        raise
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise CheckpointCorruptedError(f"unreadable record fields ({type(exc).__name__})") from exc


def _fields(data: bytes) -> Any:
    if record_format_version(data) == 2:
        return open_record_v2(data)[0]
    _version, length, crc = read_header(data)
    body = memoryview(data)[HEADER_SIZE:]
    if len(body) != length or crc32(body) != crc:
        raise CheckpointCorruptedError("checksum mismatch or truncated body")
    # orjson where it reads the text (a sweep judges every record it reads: it parses them
    # ~3x as fast); an int beyond 64 bits it reads as a float, which no field read here
    # can be (a step that is not an int makes the record unreadable, and kept).
    fields = loads_fast(bytes(body))
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
