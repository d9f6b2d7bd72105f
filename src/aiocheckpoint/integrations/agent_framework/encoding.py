"""Agent Framework checkpoints <-> aiocheckpoint's typed values, without pickle.

The framework's own encoding pickles every value that is not JSON (its messages, its
request events, a tuple) and unpickles them on load. Here a ``WorkflowCheckpoint`` becomes
a dict of the typed values a :class:`~aiocheckpoint.CheckpointManager` stores
(``docs/serialization.md``): the framework's workflow objects are written by this module as
:class:`~aiocheckpoint.TaggedValue` under reserved names and rebuilt by it from a fixed
table, and every other value goes to the manager's own encoder, which stores the standard
types and the classes of the manager's :class:`~aiocheckpoint.TypeRegistry` and refuses
the rest. Nothing is pickled, imported or looked up by a stored name outside those tables.

What is built here: ``WorkflowMessage`` (and its ``MessageType``), a ``request_info``
``WorkflowEvent`` (its request and response types stored as a standard type's name or a
registered type's registered name). Anything else of the framework's is refused when it is
saved, with :class:`~aiocheckpoint.CheckpointSerializationError` naming its path.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from agent_framework import WorkflowCheckpoint, WorkflowEvent, WorkflowEventSource, WorkflowMessage

from ...codec import TaggedValue, TypeRegistry
from ...errors import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    TypeVersionError,
    UnknownTypeError,
)

__all__ = ["RESERVED_PREFIX", "Encoding"]

#: The names of the framework's objects as stored; a registry may not use them.
RESERVED_PREFIX: Final = "aiocheckpoint.agent_framework."
_MESSAGE: Final = RESERVED_PREFIX + "WorkflowMessage"
_REQUEST: Final = RESERVED_PREFIX + "RequestInfoEvent"
_VERSION: Final = 1
#: ``WorkflowMessage.type``'s enum (the framework does not export its name).
MessageType: Final[Any] = type(WorkflowMessage(data=None, source_id="").type)
#: The format of the stored dict (its "format" key), for a later change of shape.
FORMAT: Final = 1

#: Request and response types that need no registration, by their stored name.
_STANDARD_TYPES: Final[dict[str, type]] = {
    f"builtins.{cls.__qualname__}": cls
    for cls in (str, int, float, bool, bytes, bytearray, dict, list, tuple, set, frozenset)
} | {
    "builtins.NoneType": type(None),
    "datetime.datetime": datetime.datetime,
    "datetime.date": datetime.date,
    "datetime.time": datetime.time,
    "datetime.timedelta": datetime.timedelta,
    "uuid.UUID": uuid.UUID,
    "decimal.Decimal": decimal.Decimal,
}
_STANDARD_NAMES: Final[dict[type, str]] = {cls: name for name, cls in _STANDARD_TYPES.items()}

_TEXT: Final = (str,)
_MAYBE_TEXT: Final = (str, type(None))
_MAYBE_INT: Final = (int, type(None))
#: The checkpoint's own fields of plain values, stored as they are, and their types.
_PLAIN_FIELDS: Final[dict[str, tuple[type, ...]]] = {
    "workflow_name": _TEXT,
    "graph_signature_hash": _TEXT,
    "checkpoint_id": _TEXT,
    "previous_checkpoint_id": _MAYBE_TEXT,
    "timestamp": _TEXT,
    "iteration_count": (int,),
    "version": _TEXT,
}


class Encoding:
    """Writes and reads checkpoints for one manager's :class:`~aiocheckpoint.TypeRegistry`."""

    def __init__(self, types: TypeRegistry | None) -> None:
        self.types = types if types is not None else TypeRegistry()

    # -- writing ---------------------------------------------------------------------------

    def encode(self, checkpoint: WorkflowCheckpoint) -> dict[str, Any]:
        """The checkpoint as a dict of storable values (framework objects tagged)."""
        out: dict[str, Any] = {"format": FORMAT}
        for name, kinds in _PLAIN_FIELDS.items():
            out[name] = _plain(getattr(checkpoint, name), kinds, f"checkpoint.{name}")
        out["messages"] = self._value(checkpoint.messages, "checkpoint.messages")
        out["state"] = self._value(checkpoint.state, "checkpoint.state")
        out["pending_request_info_events"] = self._value(
            checkpoint.pending_request_info_events, "checkpoint.pending_request_info_events"
        )
        out["metadata"] = self._value(checkpoint.metadata, "checkpoint.metadata")
        return out

    def _value(self, value: Any, path: str) -> Any:
        kind = type(value)
        if kind is dict:
            return {key: self._value(item, _child(path, key)) for key, item in value.items()}
        if kind is list or kind is tuple:
            items = [self._value(item, f"{path}[{i}]") for i, item in enumerate(value)]
            return items if kind is list else tuple(items)
        if kind is WorkflowMessage:
            return self._message(value, path)
        if kind is WorkflowEvent:
            return self._event(value, path)
        if kind is TaggedValue and value.type_name.startswith(RESERVED_PREFIX):
            raise CheckpointSerializationError(
                path, f"a TaggedValue may not use the reserved name {value.type_name!r}"
            )
        if kind.__module__.split(".")[0] == "agent_framework" and kind not in self.types:
            raise CheckpointSerializationError(
                path,
                f"{kind.__module__}.{kind.__qualname__} is an Agent Framework object this "
                "storage does not write (it would need pickle); register it in the manager's "
                "TypeRegistry (with encode= and decode=) or keep it out of checkpoints",
            )
        # Anything else is the manager's to store or refuse (standard and registered types).
        return value

    def _message(self, message: WorkflowMessage, path: str) -> TaggedValue:
        original = message.original_request_info_event
        data = {
            "data": self._value(message.data, f"{path}.data"),
            "source_id": _plain(message.source_id, _TEXT, f"{path}.source_id"),
            "target_id": _plain(message.target_id, _MAYBE_TEXT, f"{path}.target_id"),
            "type": _plain(message.type, (MessageType,), f"{path}.type").value,
            "trace_contexts": self._value(message.trace_contexts, f"{path}.trace_contexts"),
            "source_span_ids": self._value(message.source_span_ids, f"{path}.source_span_ids"),
            "original_request_info_event": (
                None if original is None else self._event(original, f"{path}.original")
            ),
        }
        return TaggedValue(_MESSAGE, _VERSION, data)

    def _event(self, event: WorkflowEvent[Any], path: str) -> TaggedValue:
        if event.type != "request_info":
            raise CheckpointSerializationError(
                path, f"a WorkflowEvent of type {event.type!r} (only request_info events are kept)"
            )
        if event.state is not None or event.details is not None:
            raise CheckpointSerializationError(
                path, "a request_info event with a state or error details"
            )
        data = {
            "data": self._value(event.data, f"{path}.data"),
            "origin": _plain(event.origin, (WorkflowEventSource,), f"{path}.origin").value,
            "request_id": _plain(event.request_id, _TEXT, f"{path}.request_id"),
            "source_executor_id": _plain(
                event.source_executor_id, _TEXT, f"{path}.source_executor_id"
            ),
            "request_type": self._type_name(event.request_type, f"{path}.request_type"),
            "response_type": self._type_name(event.response_type, f"{path}.response_type"),
            "executor_id": _plain(event.executor_id, _MAYBE_TEXT, f"{path}.executor_id"),
            "iteration": _plain(event.iteration, _MAYBE_INT, f"{path}.iteration"),
        }
        return TaggedValue(_REQUEST, _VERSION, data)

    def _type_name(self, cls: Any, path: str) -> list[str]:
        """A request or response type by name: a standard type's, or a registered one's."""
        if isinstance(cls, type):
            standard = _STANDARD_NAMES.get(cls)
            if standard is not None:
                return ["standard", standard]
            entry = self.types.by_class(cls)
            if entry is not None:
                return ["registered", entry.name]
        raise CheckpointSerializationError(
            path,
            f"the type {cls!r} is neither a standard type nor registered in the manager's "
            "TypeRegistry (a type is stored by name, never imported)",
        )

    # -- reading ---------------------------------------------------------------------------

    def decode(self, data: Mapping[str, Any], where: Where) -> WorkflowCheckpoint:
        """The checkpoint back from what :meth:`encode` made (read with ``view="raw"``)."""
        if data.get("format") != FORMAT:
            raise where.corrupted(f"not an Agent Framework checkpoint of format {FORMAT}")
        fields: dict[str, Any] = {name: data.get(name) for name in _PLAIN_FIELDS}
        for name, kinds in _PLAIN_FIELDS.items():
            where.expect(fields[name], kinds, name)
        for name in ("messages", "state", "pending_request_info_events", "metadata"):
            value = data.get(name)
            where.expect(value, dict, name)
            fields[name] = self._read(value, f"checkpoint.{name}", where)
        return WorkflowCheckpoint(**fields)

    def _read(self, value: Any, path: str, where: Where) -> Any:
        kind = type(value)
        if kind is dict:
            return {key: self._read(item, _child(path, key), where) for key, item in value.items()}
        if kind is list or kind is tuple:
            items = [self._read(item, f"{path}[{i}]", where) for i, item in enumerate(value)]
            return items if kind is list else tuple(items)
        if kind is TaggedValue:
            return self._tagged(value, path, where)
        return value

    def _tagged(self, value: TaggedValue, path: str, where: Where) -> Any:
        known = _READERS.get(value.type_name)
        if known is not None and value.version == _VERSION:
            reader, keys = known
            stored = value.data
            where.expect(stored, dict, path)
            if stored.keys() != keys:
                raise where.corrupted(f"{path}: not the fields of a {value.type_name}")
            return reader(self, {k: self._read(v, path, where) for k, v in stored.items()}, where)
        if known is not None or self.types.by_name(value.type_name) is not None:
            raise TypeVersionError(path, value.type_name, f"version {value.version} is unknown")
        raise UnknownTypeError(path, value.type_name, "the type is not registered")

    def _read_message(self, data: dict[str, Any], where: Where) -> WorkflowMessage:
        where.expect(data.get("source_id"), str, "a message's source_id")
        where.expect(data.get("target_id"), (str, type(None)), "a message's target_id")
        original = data.get("original_request_info_event")
        where.expect(original, (WorkflowEvent, type(None)), "a message's request event")
        return WorkflowMessage(
            data=data.get("data"),
            source_id=data["source_id"],
            target_id=data["target_id"],
            type=where.member(MessageType, data.get("type")),
            trace_contexts=data.get("trace_contexts"),
            source_span_ids=data.get("source_span_ids"),
            original_request_info_event=original,
        )

    def _read_event(self, data: dict[str, Any], where: Where) -> WorkflowEvent[Any]:
        for name in ("request_id", "source_executor_id"):
            where.expect(data.get(name), str, f"a request event's {name}")
        where.expect(data.get("executor_id"), (str, type(None)), "a request event's executor_id")
        where.expect(data.get("iteration"), (int, type(None)), "a request event's iteration")
        request_type = self._type(data.get("request_type"), where)
        if type(data.get("data")) is not request_type:
            raise where.corrupted("a request event's data is not of its request type")
        return WorkflowEvent(
            "request_info",
            data=data.get("data"),
            origin=where.member(WorkflowEventSource, data.get("origin")),
            request_id=data["request_id"],
            source_executor_id=data["source_executor_id"],
            request_type=request_type,
            response_type=self._type(data.get("response_type"), where),
            executor_id=data["executor_id"],
            iteration=data["iteration"],
        )

    def _type(self, stored: Any, where: Where) -> type:
        if type(stored) is not list or len(stored) != 2:
            raise where.corrupted("a request event's type is not [kind, name]")
        kind, name = stored
        if kind == "standard" and name in _STANDARD_TYPES:
            return _STANDARD_TYPES[name]
        entry = self.types.by_name(name) if kind == "registered" and type(name) is str else None
        if entry is None:
            raise UnknownTypeError(
                "a request event's type", str(name), "the type is not registered"
            )
        return entry.cls


def _plain(value: Any, kinds: tuple[type, ...], path: str) -> Any:
    """``value`` if it is of one of ``kinds`` exactly (what :meth:`Encoding.decode` reads)."""
    if type(value) not in kinds:
        names = " or ".join("None" if kind is type(None) else kind.__name__ for kind in kinds)
        raise CheckpointSerializationError(path, f"a {type(value).__name__}, not {names}")
    return value


def _child(path: str, key: Any) -> str:
    """The path of ``key`` in the dict at ``path``, named as the manager's errors name it."""
    if type(key) is str and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


_MESSAGE_KEYS: Final = frozenset(
    (
        "data",
        "source_id",
        "target_id",
        "type",
        "trace_contexts",
        "source_span_ids",
        "original_request_info_event",
    )
)
_REQUEST_KEYS: Final = frozenset(
    (
        "data",
        "origin",
        "request_id",
        "source_executor_id",
        "request_type",
        "response_type",
        "executor_id",
        "iteration",
    )
)
#: Each reserved name's reader and the exact fields its stored data has.
_READERS: Final[
    dict[str, tuple[Callable[[Encoding, dict[str, Any], Where], Any], frozenset[str]]]
] = {
    _MESSAGE: (Encoding._read_message, _MESSAGE_KEYS),
    _REQUEST: (Encoding._read_event, _REQUEST_KEYS),
}


@dataclasses.dataclass(frozen=True)
class Where:
    """The record being read, for errors that name it."""

    workflow_id: str
    step: int

    def corrupted(self, reason: str) -> CheckpointCorruptedError:
        """The error for a record of the wrong shape."""
        return CheckpointCorruptedError(reason, workflow_id=self.workflow_id, step=self.step)

    def expect(self, value: Any, kinds: type | tuple[type, ...], what: str) -> None:
        """Refuse ``value`` unless it is of one of ``kinds`` (``bool`` is not an ``int``)."""
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if type(value) not in allowed:
            raise self.corrupted(f"{what} is a {type(value).__name__}")

    def member(self, enum: Any, value: Any) -> Any:
        """The member of ``enum`` whose value is ``value``."""
        try:
            return enum(value)
        except ValueError:
            raise self.corrupted(f"{value!r} is not a {enum.__name__}") from None
