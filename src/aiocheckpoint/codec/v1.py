"""Version-1 records: the whole checkpoint as one JSON body after the header.

The header is :mod:`aiocheckpoint.format.header`'s (version 1, flags 0). The body is one
JSON object with the keys ``workflow_id``, ``step``, ``agent_id``, ``status``,
``timestamp``, ``metrics``, ``metadata`` and ``state`` (``data``, ``version``,
``metadata``), and ``app_version`` when the writer had one. Values are in the tagged form
of :mod:`aiocheckpoint.format.tags`. Nothing in a record is ever unpickled or evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Final

import orjson
from pydantic import ValidationError

from .._validation import check_step, check_workflow_id
from ..errors import CheckpointCorruptedError, CheckpointSerializationError, InvalidArgumentError
from ..format.checksum import crc32
from ..format.header import FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC, read_header
from ..format.jsonread import loads
from ..models import METRICS_DEFAULTS, Checkpoint, CheckpointFields
from .copy import child_path
from .jsonwrite import dumps
from .verify import check_depth, may_nest_deeply

__all__ = ["build_checkpoint", "check_owner", "decode_checkpoint", "encode_checkpoint"]


def encode_checkpoint(checkpoint: Checkpoint, *, finite: bool = False) -> bytes:
    """Encode a checkpoint as a version-1 record (header, checksum, JSON body).

    The checkpoint's state and metadata must already be storable (see
    :func:`~aiocheckpoint.codec.copy.to_storable`). ``finite=True`` promises that state and
    metadata hold no NaN or infinite float (as :func:`~aiocheckpoint.codec.copy.storable_copy`
    reports), which allows the fast encoder.
    """
    body = None
    metrics = checkpoint.metrics
    if finite and math.isfinite(metrics.total_cost + metrics.elapsed_seconds):
        body = _fast_body(checkpoint)
    if body is None:
        try:
            body = dumps(_body(checkpoint, _iso_time), False)
        except UnicodeEncodeError as exc:
            raise CheckpointSerializationError(_bad_text_path(checkpoint), str(exc)) from exc
        except (TypeError, ValueError, RecursionError) as exc:
            raise CheckpointSerializationError("checkpoint", str(exc)) from exc
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0, len(body), crc32(body)) + body


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


def encode_fields(fields: CheckpointFields, finite: bool) -> bytes | None:
    """:func:`encode_checkpoint` of ``fields.checkpoint()``, without building its models.

    Only by the fast encoder: None where the exact one is needed (then encode the built
    checkpoint, which also names a value that cannot be written).
    """
    workflow_id, step, agent_id, status, data, metrics, timestamp, metadata, app_version = fields
    if not finite or (
        metrics is not None
        and not math.isfinite(metrics["total_cost"] + metrics["elapsed_seconds"])
    ):
        return None
    # As _native_time, inline: every save on the event loop comes here.
    zone = timestamp.tzinfo
    now: datetime | str = timestamp
    if type(timestamp) is not datetime or (zone is not timezone.utc and zone is not None):
        now = timestamp.isoformat()
    # _layout's body around _state's, written out: two calls less per save.
    body: dict[str, Any] = {
        "workflow_id": workflow_id,
        "step": step,
        "agent_id": agent_id,
        "status": status._value_,
        "timestamp": now,
        "metrics": _DEFAULT_METRICS if metrics is None else _metrics_json(metrics, _native_time),
        "metadata": metadata,
        "state": {
            "data": data,
            "version": {"version": 0, "timestamp": now, "agent_id": None, "changed_fields": []},
            "metadata": {},
        },
    }
    if app_version is not None:
        body["app_version"] = app_version
    try:
        text = orjson.dumps(body)
    except TypeError:
        return None
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0, len(text), crc32(text)) + text


def _body(checkpoint: Checkpoint, time_: Callable[[datetime], datetime | str]) -> dict[str, Any]:
    """The record body as one JSON-ready dict; ``time_`` renders the datetimes."""
    snapshot = checkpoint.state_snapshot
    version = snapshot.version
    state = _state(
        snapshot.data,
        version.version,
        time_(version.timestamp),
        version.agent_id,
        list(version.changed_fields),
        snapshot.metadata,
    )
    metrics = _metrics_json(checkpoint.metrics.__dict__, time_)
    return _layout(checkpoint, metrics, state, time_(checkpoint.timestamp))


def _state(
    data: Any,
    version: int,
    timestamp: datetime | str,
    agent_id: str | None,
    changed_fields: list[str],
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """The record body's ``state``: the snapshot's data, version and metadata."""
    return {
        "data": data,
        "version": {
            "version": version,
            "timestamp": timestamp,
            "agent_id": agent_id,
            "changed_fields": changed_fields,
        },
        "metadata": metadata,
    }


def _metrics_json(
    metrics: Mapping[str, Any], time_: Callable[[datetime], datetime | str]
) -> dict[str, Any]:
    """The record body's ``metrics``: ``metrics``' fields, ``start_time`` rendered."""
    fields = dict(metrics)
    start = fields.get("start_time")
    if start is not None:
        fields["start_time"] = time_(start)
    return fields


#: ``ExecutionMetrics()``'s ``metrics`` as orjson writes them, written once: most saves
#: have no metrics, and orjson copies a fragment as it is (the same bytes).
_DEFAULT_METRICS: Final = orjson.Fragment(orjson.dumps(METRICS_DEFAULTS))


def _layout(
    top: Checkpoint | CheckpointFields,
    metrics: dict[str, Any] | orjson.Fragment,
    state: dict[str, Any],
    timestamp: datetime | str,
) -> dict[str, Any]:
    """The record body: ``top``'s fields around ``state`` (the snapshot's JSON-ready dict).

    ``metrics`` and ``timestamp`` are already rendered (:func:`_metrics_json`).
    """
    body: dict[str, Any] = {
        "workflow_id": top.workflow_id,
        "step": top.step,
        "agent_id": top.agent_id,
        "status": top.status._value_,
        "timestamp": timestamp,
        "metrics": metrics,
        "metadata": top.metadata,
        "state": state,
    }
    if top.app_version is not None:
        body["app_version"] = top.app_version
    return body


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
            child = child_path(path, key)
            if _find_bad_text(key, child) is not None:
                return f"{path}[{key!r}]"
            found = _find_bad_text(item, child)
            if found is not None:
                return found
    elif type(value) is list:
        for index, item in enumerate(value):
            found = _find_bad_text(item, child_path(path, index))
            if found is not None:
                return found
    return None


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
        if crc32(body) != crc:
            raise CheckpointCorruptedError("checksum mismatch")
        text = bytes(body)
        checkpoint = build_checkpoint(loads(text), nested=may_nest_deeply(text))
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


def build_checkpoint(obj: Any, *, nested: bool = True) -> Checkpoint:
    """The checkpoint a decoded record body describes (its fields validated).

    What the writer refuses is corruption here too: an invalid workflow id or step, and
    (unless ``nested`` is False: the text has too few brackets) values nested too deeply.
    """
    if type(obj) is not dict:
        raise CheckpointCorruptedError("body is not a JSON object")
    state = obj["state"]
    try:
        check_workflow_id(obj["workflow_id"])
        check_step(obj["step"])
    except InvalidArgumentError as exc:
        raise CheckpointCorruptedError(f"the record holds an invalid id: {exc}") from None
    data = state["data"]
    if type(data) is not dict:  # what the model would refuse; its keys are JSON's strings
        raise CheckpointCorruptedError("invalid record fields: state data is not an object")
    if nested:
        check_depth(data, "state")
        check_depth(obj["metadata"], "metadata")
        check_depth(state["metadata"], "state.metadata")
    try:
        checkpoint = Checkpoint.model_validate(
            {
                "workflow_id": obj["workflow_id"],
                "step": obj["step"],
                "agent_id": obj["agent_id"],
                "status": obj["status"],
                "timestamp": obj["timestamp"],
                "metrics": obj["metrics"],
                "metadata": obj["metadata"],
                "app_version": obj.get("app_version"),
                "state_snapshot": {
                    # Validated apart: the model would copy a dict of many keys key by key
                    # (a 100,000-key state: ~16 ms) to check what JSON guarantees.
                    "data": {},
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
    checkpoint.state_snapshot.__dict__["data"] = data
    return checkpoint
