"""Turning checkpoints into bytes and back: validation, the record format and its checksum.

What can be stored
------------------
dicts with ``str`` keys, lists, tuples (stored as lists), ``str``, ``int`` of any size,
``float`` (NaN and infinities included), ``bool`` and ``None`` round-trip exactly, key order
included. Pydantic models, ``datetime``/``date``/``time`` and ``UUID`` are accepted and stored
as their JSON form (a model comes back as a dict, the others as ISO strings or the UUID's
string). Anything else -- sets, bytes, non-``str`` keys, enums, other objects, cycles, or
nesting deeper than :data:`MAX_DEPTH` -- raises :class:`CheckpointSerializationError` naming
the offending path, and nothing is written.

The record format (version 1)
-----------------------------
A record is a 20-byte header followed by a UTF-8 JSON body::

    offset size  field
    0      4     magic  b"ACKP"
    4      1     format version (1)
    5      1     flags (0; reserved for compression)
    6      2     reserved (0)
    8      8     body length, big-endian
    16     4     CRC-32 of the body, big-endian

The body is one JSON object with the keys ``workflow_id``, ``step``, ``agent_id``,
``status``, ``timestamp``, ``metrics``, ``metadata`` and ``state`` (``data``, ``version``,
``metadata``). Nothing in a record is ever unpickled or evaluated.
"""

from __future__ import annotations

import json
import math
import struct
import uuid
import zlib
from collections.abc import Callable, Generator
from datetime import date, datetime, time, timezone
from time import perf_counter
from typing import Any, Final

import orjson
from pydantic import BaseModel, ValidationError

from .errors import CheckpointCorruptedError, CheckpointSerializationError
from .models import Checkpoint

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_DEPTH",
    "decode_checkpoint",
    "encode_checkpoint",
    "json_copy",
    "storable_copy",
    "storable_copy_work",
    "to_storable",
]

MAGIC: Final = b"ACKP"
FORMAT_VERSION: Final = 1
MAX_DEPTH: Final = 200
_HEADER = struct.Struct(">4sBBHQI")
HEADER_SIZE: Final = _HEADER.size

# Python refuses to convert ints of more than 4300 digits to or from text by default; below
# this bit length the fast path is always safe.
_BIG_INT_BITS: Final = 14_000
_IDENTIFIER_CHARS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
)


def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key and not key[0].isdigit() and set(key) <= _IDENTIFIER_CHARS:
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


class _Walker:
    """Validates a value and returns a fresh JSON-compatible copy of it."""

    __slots__ = ("_active", "nonfinite")

    def __init__(self) -> None:
        self._active: set[int] = set()
        self.nonfinite = False

    def walk(self, value: Any, path: str, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            return _checked_text(value, path)
        if kind is bool or value is None:
            return value
        if kind is int:
            return value
        if kind is float:
            self.nonfinite = self.nonfinite or value - value != 0.0
            return value
        if depth >= MAX_DEPTH:
            raise CheckpointSerializationError(path, f"nesting deeper than {MAX_DEPTH} levels")
        if kind is dict or kind is list or kind is tuple:
            return self._container(value, path, depth)
        if isinstance(value, BaseModel):
            try:
                dumped = value.model_dump(mode="json")
            except Exception as exc:
                raise CheckpointSerializationError(
                    path,
                    f"model_dump() of {kind.__qualname__} raised {type(exc).__qualname__}",
                ) from exc
            return self.walk(dumped, path, depth)
        if isinstance(value, (datetime, date, time)):
            return value.isoformat()
        if isinstance(value, uuid.UUID):
            return str(value)
        raise CheckpointSerializationError(
            path, f"values of type {kind.__qualname__} are not JSON-compatible"
        )

    def _container(self, value: Any, path: str, depth: int) -> Any:
        marker = id(value)
        if marker in self._active:
            raise CheckpointSerializationError(path, "the value contains itself (a cycle)")
        self._active.add(marker)
        try:
            if type(value) is dict:
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if type(key) is not str:
                        raise CheckpointSerializationError(
                            f"{path}[{_safe_repr(key)}]",
                            f"dict keys must be str, not {type(key).__qualname__}",
                        )
                    child = _child_path(path, key)
                    out[_checked_text(key, child)] = self.walk(item, child, depth + 1)
                return out
            return [
                self.walk(item, _child_path(path, i), depth + 1) for i, item in enumerate(value)
            ]
        finally:
            self._active.discard(marker)


class _Unstorable(Exception):
    """Internal: the fast copy met something it does not handle."""


_PLAIN: Final = frozenset({str, int, bool, type(None)})


def _fast_copy(value: Any, depth: int, nonfinite: list[float]) -> Any:
    # The hot path: plain JSON data, no paths kept, no cycle set (a cycle ends at the depth
    # limit). Anything unusual bails out to _Walker, which finds and names the problem.
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        if value - value != 0.0:  # NaN or an infinity
            nonfinite.append(value)
        return value
    if depth >= MAX_DEPTH:
        raise _Unstorable
    depth += 1
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Unstorable
            kind = type(item)
            if kind in _PLAIN:
                out[key] = item
            elif kind is float:
                if item - item != 0.0:
                    nonfinite.append(item)
                out[key] = item
            else:
                out[key] = _fast_copy(item, depth, nonfinite)
        return out
    if kind is list or kind is tuple:
        # Copy first (in C), then replace the containers by their copies; scalars stay.
        items = list(value)
        for index, item in enumerate(items):
            kind = type(item)
            if kind in _PLAIN:
                continue
            if kind is float:
                if item - item != 0.0:
                    nonfinite.append(item)
            else:
                items[index] = _fast_copy(item, depth, nonfinite)
        return items
    raise _Unstorable


def storable_copy(value: Any, path: str = "state") -> tuple[Any, bool]:
    """Like :func:`to_storable`, also telling whether every float in it is finite."""
    nonfinite: list[float] = []
    try:
        return _fast_copy(value, 0, nonfinite), not nonfinite
    except (_Unstorable, RecursionError):
        walker = _Walker()
        return walker.walk(value, path, 0), not walker.nonfinite


#: How long (seconds of work) :func:`storable_copy_work` goes between two yields.
_COPY_SLICE: Final = 0.00015
_COPY_BATCH: Final = 16  # elements copied between two looks at the clock
_CONTAINERS: Final = (dict, list)


def storable_copy_work(value: Any, path: str = "state") -> Generator[None, None, tuple[Any, bool]]:
    """:func:`storable_copy` as a generator that yields every ~0.15 ms of work.

    Only for a value that nobody changes until the generator is done (a ``SharedState``
    tree, which is copy-on-write): the copy is taken piece by piece. The top-level
    container's elements, and the elements of any large container among them, are copied
    in batches; anything else in one piece. A value the fast copy does not handle (an
    unstorable one, or one that needs converting) is copied again whole by
    :func:`storable_copy`, which names the problem.
    """
    kind = type(value)
    items = value.values() if kind is dict else value if kind is list else ()
    if len(items) <= _COPY_BATCH and not any(
        type(item) in _CONTAINERS and len(item) > _COPY_BATCH for item in items
    ):
        return storable_copy(value, path)  # nothing to slice: one piece, no generator work
    nonfinite: list[float] = []
    try:
        copied = yield from _fast_copy_work(value, 0, nonfinite, [perf_counter()])
    except (_Unstorable, RecursionError):
        return storable_copy(value, path)
    return copied, not nonfinite


def _fast_copy_work(
    value: Any, depth: int, nonfinite: list[float], last: list[float]
) -> Generator[None, None, Any]:
    kind = type(value)
    if (kind is not dict and kind is not list) or (depth and len(value) <= _COPY_BATCH):
        return _fast_copy(value, depth, nonfinite)
    keys = list(value) if kind is dict else None
    items = list(value.values()) if kind is dict else value
    copies: list[Any] = []
    for start in range(0, len(items), _COPY_BATCH):
        for item in items[start : start + _COPY_BATCH]:
            if depth == 0 and type(item) in (dict, list) and len(item) > _COPY_BATCH:
                copies.append((yield from _fast_copy_work(item, 1, nonfinite, last)))
            else:
                copies.append(_fast_copy(item, depth + 1, nonfinite))
        now = perf_counter()
        if now - last[0] > _COPY_SLICE:
            yield
            last[0] = perf_counter()
    if keys is None:
        return copies
    if any(type(key) is not str for key in keys):
        raise _Unstorable
    return dict(zip(keys, copies, strict=True))


def _checked_text(text: str, path: str) -> str:
    """Return ``text`` if it can be stored as UTF-8 (no lone surrogates), else raise."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CheckpointSerializationError(
                path, "the string is not valid Unicode (it holds a lone surrogate)"
            ) from exc
    return text


def _safe_repr(value: object) -> str:
    """``repr(value)``, or a stand-in when the object's ``__repr__`` raises."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__qualname__} object>"


def to_storable(value: Any, path: str = "state") -> Any:
    """Return a validated, independent JSON-compatible copy of ``value``.

    Raises :class:`CheckpointSerializationError` naming the first offending path.
    """
    return storable_copy(value, path)[0]


def json_copy(value: Any) -> Any:
    """Deep-copy a JSON-compatible value quickly; other values fall back to ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if kind is list:
        return [json_copy(v) for v in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    import copy

    return copy.deepcopy(value)


def _int_to_decimal(n: int) -> str:
    """Decimal text of an int of any size (divide and conquer; no digit limit applies)."""
    if n < 0:
        return "-" + _int_to_decimal(-n)
    if n.bit_length() <= _BIG_INT_BITS:
        return str(n)
    half = len(hex(n)) * 3 // 5  # about half the number of decimal digits
    high, low = divmod(n, 10**half)
    return _int_to_decimal(high) + _int_to_decimal(low).rjust(half, "0")


def _decimal_to_int(text: str) -> int:
    """Parse decimal digits of any length (the inverse of :func:`_int_to_decimal`)."""
    if len(text) <= 4000:
        return int(text)
    if text[0] == "-":
        return -_decimal_to_int(text[1:])
    half = len(text) // 2
    low_len = len(text) - half
    scale: int = 10**low_len
    return _decimal_to_int(text[:half]) * scale + _decimal_to_int(text[half:])


def _is_digit_limit(exc: ValueError) -> bool:
    return "integer string conversion" in str(exc) or "Exceeds the limit" in str(exc)


_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _dumps(obj: Any, finite: bool) -> bytes:
    if finite:
        # orjson writes the same bytes 10-90x faster (see docs/serialization.md), but it
        # would turn NaN into null and refuses ints beyond 64 bits: those take the slow path.
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    try:
        return _ENCODER.encode(obj).encode()
    except ValueError as exc:
        if not _is_digit_limit(exc):
            raise
    # Replace each huge int by a unique placeholder string, then splice in its digits.
    nonce = uuid.uuid4().hex
    digits: dict[str, str] = {}

    def swap(value: Any) -> Any:
        if type(value) is int and value.bit_length() > _BIG_INT_BITS:
            token = f"\ue000bigint-{nonce}-{len(digits)}"
            digits[token] = _int_to_decimal(value)
            return token
        if type(value) is dict:
            return {k: swap(v) for k, v in value.items()}
        if type(value) is list:
            return [swap(v) for v in value]
        return value

    text = _ENCODER.encode(swap(obj))
    for token, number in digits.items():
        text = text.replace(f'"{token}"', number, 1)
    return text.encode()


def _loads(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        if not _is_digit_limit(exc):
            raise
    return json.loads(body, parse_int=_decimal_to_int)


def encode_checkpoint(checkpoint: Checkpoint, *, finite: bool = False) -> bytes:
    """Encode a checkpoint as a version-1 record (header, checksum, JSON body).

    The checkpoint's state and metadata must already be storable (see :func:`to_storable`).
    ``finite=True`` promises that state and metadata hold no NaN or infinite float (as
    :func:`storable_copy` reports), which allows the fast encoder.
    """
    body = None
    metrics = checkpoint.metrics
    if finite and math.isfinite(metrics.total_cost + metrics.elapsed_seconds):
        body = _fast_body(checkpoint)
    if body is None:
        try:
            body = _dumps(_body(checkpoint, _iso_time), False)
        except UnicodeEncodeError as exc:
            raise CheckpointSerializationError(_bad_text_path(checkpoint), str(exc)) from exc
        except (TypeError, ValueError, RecursionError) as exc:
            raise CheckpointSerializationError("checkpoint", str(exc)) from exc
    return _HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0, len(body), zlib.crc32(body)) + body


def _fast_body(checkpoint: Checkpoint) -> bytes | None:
    # orjson writes the same bytes 10-90x faster (see docs/serialization.md), UTC and naive
    # datetimes included (the same text as isoformat()); but NaN would become null and ints
    # beyond 64 bits are refused (a TypeError): None sends those to the exact path.
    try:
        return orjson.dumps(_body(checkpoint, _native_time))
    except TypeError:
        return None


def _iso_time(value: datetime) -> str:
    return value.isoformat()


def _native_time(value: datetime) -> datetime | str:
    """``value`` itself where orjson writes exactly its ``isoformat()``, else that text."""
    if type(value) is datetime and (value.tzinfo is timezone.utc or value.tzinfo is None):
        return value
    return value.isoformat()


def _body(checkpoint: Checkpoint, time_: Callable[[datetime], datetime | str]) -> dict[str, Any]:
    """The record body as one JSON-ready dict; ``time_`` renders the datetimes."""
    snapshot = checkpoint.state_snapshot
    version = snapshot.version
    metrics = dict(checkpoint.metrics.__dict__)
    start = metrics.get("start_time")
    if start is not None:
        metrics["start_time"] = time_(start)
    return {
        "workflow_id": checkpoint.workflow_id,
        "step": checkpoint.step,
        "agent_id": checkpoint.agent_id,
        "status": checkpoint.status._value_,
        "timestamp": time_(checkpoint.timestamp),
        "metrics": metrics,
        "metadata": checkpoint.metadata,
        "state": {
            "data": snapshot.data,
            "version": {
                "version": version.version,
                "timestamp": time_(version.timestamp),
                "agent_id": version.agent_id,
                "changed_fields": list(version.changed_fields),
            },
            "metadata": snapshot.metadata,
        },
    }


def _bad_text_path(checkpoint: Checkpoint) -> str:
    """Name the first string that is not valid Unicode (a lone surrogate)."""
    roots = (
        ("state", checkpoint.state_snapshot.data),
        ("metadata", checkpoint.metadata),
        ("state.metadata", checkpoint.state_snapshot.metadata),
    )
    for root, value in roots:
        found = _find_bad_text(value, root)
        if found is not None:
            return found
    return "checkpoint"


def _find_bad_text(value: Any, path: str) -> str | None:
    if type(value) is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
    elif type(value) is dict:
        for key, item in value.items():
            child = _child_path(path, key)
            if _find_bad_text(key, child) is not None:
                return f"{path}[{key!r}]"
            found = _find_bad_text(item, child)
            if found is not None:
                return found
    elif type(value) is list:
        for index, item in enumerate(value):
            found = _find_bad_text(item, _child_path(path, index))
            if found is not None:
                return found
    return None


def read_header(data: bytes) -> tuple[int, int, int]:
    """Parse a record header; return ``(format_version, body_length, crc32)``.

    Raises :class:`CheckpointCorruptedError` when the bytes are not a record.
    """
    if len(data) < HEADER_SIZE:
        raise CheckpointCorruptedError(f"record too short ({len(data)} bytes)")
    magic, version, flags, reserved, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointCorruptedError("not an aiocheckpoint record (bad magic)")
    if version != FORMAT_VERSION:
        raise CheckpointCorruptedError(f"unknown record format version {version}")
    if flags != 0:
        raise CheckpointCorruptedError(f"unknown record flags {flags:#x}")
    if reserved != 0:
        raise CheckpointCorruptedError(f"reserved header bytes are not zero ({reserved:#x})")
    return version, length, crc


def decode_checkpoint(
    data: bytes, *, workflow_id: str | None = None, step: int | None = None
) -> Checkpoint:
    """Verify and decode a record made by :func:`encode_checkpoint`.

    When ``workflow_id``/``step`` are given, the record must belong to them. Any mismatch,
    truncation, bit flip or foreign content raises :class:`CheckpointCorruptedError`.
    """
    try:
        _version, length, crc = read_header(data)
        body = memoryview(data)[HEADER_SIZE:]
        if len(body) != length:
            raise CheckpointCorruptedError(
                f"body is {len(body)} bytes, header says {length} (truncated or padded)"
            )
        if zlib.crc32(body) != crc:
            raise CheckpointCorruptedError("checksum mismatch")
        obj = _loads(bytes(body))
        checkpoint = _build(obj)
    except CheckpointCorruptedError as exc:
        raise CheckpointCorruptedError(exc.reason, workflow_id=workflow_id, step=step) from exc
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise CheckpointCorruptedError(
            f"undecodable body ({type(exc).__name__})", workflow_id=workflow_id, step=step
        ) from exc
    return check_owner(checkpoint, workflow_id, step)


def check_owner(checkpoint: Checkpoint, workflow_id: str | None, step: int | None) -> Checkpoint:
    """Return ``checkpoint`` if it belongs to ``workflow_id``/``step`` (None: any).

    A valid record stored under another key (moved, copied or crafted) is corruption.
    """
    if workflow_id is not None and checkpoint.workflow_id != workflow_id:
        raise CheckpointCorruptedError(
            f"record belongs to workflow {checkpoint.workflow_id!r}",
            workflow_id=workflow_id,
            step=step,
        )
    if step is not None and checkpoint.step != step:
        raise CheckpointCorruptedError(
            f"record belongs to step {checkpoint.step}", workflow_id=workflow_id, step=step
        )
    return checkpoint


def _build(obj: Any) -> Checkpoint:
    if type(obj) is not dict:
        raise CheckpointCorruptedError("body is not a JSON object")
    state = obj["state"]
    try:
        return Checkpoint.model_validate(
            {
                "workflow_id": obj["workflow_id"],
                "step": obj["step"],
                "agent_id": obj["agent_id"],
                "status": obj["status"],
                "timestamp": obj["timestamp"],
                "metrics": obj["metrics"],
                "metadata": obj["metadata"],
                "state_snapshot": {
                    "data": state["data"],
                    "version": state["version"],
                    "metadata": state["metadata"],
                },
            },
            strict=False,
        )
    except ValidationError as exc:
        raise CheckpointCorruptedError(
            f"invalid record fields: {exc.error_count()} error(s)"
        ) from exc
