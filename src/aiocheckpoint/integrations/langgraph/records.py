"""LangGraph checkpoints and pending writes as aiocheckpoint states (JSON documents).

Values go through the saver's LangGraph serializer and are stored as its typed bytes,
``"type:base64"`` (a ``[type, base64]`` pair in stores written before), exactly as it
produced them. A list channel (LangGraph's messages) is
stored element by element, each element serialized once (while it stays the same object),
and a long list in pages (``pages.py``): a growing list costs what was appended, not the
whole list again (``docs/langgraph.md``). A large value of any other kind is stored once,
in a page of its own, and referenced by hash while its channel's version stays the same.
"""

from __future__ import annotations

import base64
import binascii
import operator
import weakref
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, Final

from langgraph.checkpoint.base import WRITES_IDX_MAP, Checkpoint, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol

from ...errors import CheckpointCorruptedError
from . import pages as paging

__all__ = [
    "ChannelCache",
    "Write",
    "checkpoint_state",
    "decode_checkpoint",
    "decode_metadata",
    "decode_writes",
    "flat_writes",
    "merge_writes",
    "page_hashes",
    "pending_writes",
    "typed",
    "unflat_writes",
    "untyped",
]

#: One stored write: task id, index, channel, typed value, task path.
Write = tuple[str, int, str, Any, str]
#: The encoded values of one namespace's last checkpoint: channel -> (version, stored
#: form, a list's items (weakly when they allow it), their encodings). The items are kept
#: so that they can be recognised (by identity) in the next checkpoint's list.
ChannelCache = dict[str, tuple[Any, Any, Any, Any]]


def typed(serde: SerializerProtocol, value: Any) -> str:
    """``value`` through the serializer, as the text ``"type:base64 bytes"``.

    One string rather than a pair: the manager's copy of a state takes a list of strings
    in one C call, and no container per value outlives the save.
    """
    kind, data = serde.dumps_typed(value)
    return f"{kind}:{binascii.b2a_base64(data, newline=False).decode('ascii')}"


def untyped(serde: SerializerProtocol, item: Any) -> Any:
    """The value of a ``"type:base64"`` text; a malformed one is corruption.

    Also reads the ``[type, base64]`` pairs of stores written before.
    """
    if type(item) is str:
        kind, colon, text = item.rpartition(":")
    elif isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
        kind, colon, text = item[0], ":", item[1]
    else:
        kind, colon, text = "", "", None
    if not (colon and isinstance(text, str)):
        raise CheckpointCorruptedError(f"a stored LangGraph value is malformed: {item!r:.80}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CheckpointCorruptedError("a stored LangGraph value is not base64") from exc
    return serde.loads_typed((kind, data))


def _same_pages(value: list[Any], items: list[Any], hashes: list[str]) -> list[str | None]:
    """Each parent page hash whose items are the very objects at that place in ``value``."""
    size = paging.PAGE_ITEMS
    return [
        digest
        if len(value) >= (i + 1) * size
        and all(map(operator.is_, value[i * size : (i + 1) * size], items[i * size :]))
        else None
        for i, digest in enumerate(hashes)
    ]


#: Stands for a parent's item that no longer exists (its weak reference died).
_DEAD: Final = object()
_deref: Final = weakref.ReferenceType.__call__


def _weak(value: list[Any]) -> tuple[Any, ...] | list[Any]:
    """What the cache keeps of a list's items to recognise them in the next checkpoint.

    Weak references when every item takes one (LangGraph's messages do): the cache then
    keeps no item alive once LangGraph drops it (the messages of a finished run, which a
    later run reads back as new objects anyway), so a thread's cache holds a few tracked
    objects rather than its whole message list. Otherwise the list itself.
    """
    try:
        return tuple(map(weakref.ref, value))
    except TypeError:  # None, str, dict, list... (and a weak reference itself)
        return value


def _alive(held: tuple[Any, ...] | list[Any]) -> list[Any]:
    """The parent's items that :func:`_weak` kept, :data:`_DEAD` for those gone."""
    if type(held) is list:
        return held
    items = list(map(_deref, held))
    if any(map(operator.is_, items, repeat(None))):  # no item held weakly is None
        items = [_DEAD if item is None else item for item in items]
    return items


def _channel(
    serde: SerializerProtocol,
    value: Any,
    known: tuple[Any, Any, Any, Any] | None,
    new_pages: dict[str, list[Any]],
    name: paging.PageHash,
) -> tuple[Any, Any, list[Any] | None]:
    """A channel's stored form, what the cache keeps of its items, their encodings."""
    if type(value) is not list:
        code = typed(serde, value)
        if len(code) > paging.BOX_BYTES:
            return paging.box(code, new_pages, name), None, None
        return code, None, None
    if known is None or known[3] is None:
        encoded = [typed(serde, item) for item in value]
        return paging.paginate(encoded, (), new_pages, name), _weak(value), encoded
    # An item that is the very object stored in the parent's list is reused as encoded
    # then: LangGraph's reducers (add_messages) build a new list around the same items.
    # Its id is stable while it lives: ``known`` holds it, strongly or weakly (a dead
    # item matches nothing).
    held, codes = known[2], known[3]
    items = _alive(held)
    hashes = paging.hashes_of(known[1])
    count = len(items)
    if len(value) >= count and all(map(operator.is_, value, items)):
        # The common case, checked at C speed: the parent's items, then appended ones.
        encoded = codes + [typed(serde, item) for item in value[count:]]
        # Every full page of the parent lies within its items: all are reused.
        stored = paging.paginate(encoded, hashes, new_pages, name)
        if type(held) is tuple:
            try:
                return stored, held + tuple(map(weakref.ref, value[count:])), encoded
            except TypeError:
                return stored, value, encoded
        return stored, _weak(value), encoded
    reuse = {id(item): code for item, code in zip(items, codes, strict=True)}
    encoded = [reuse.get(id(item)) or typed(serde, item) for item in value]
    reused = _same_pages(value, items, hashes)
    return paging.paginate(encoded, reused, new_pages, name), _weak(value), encoded


def _unchannel(serde: SerializerProtocol, stored: Any, pages: Mapping[str, list[Any]]) -> Any:
    if isinstance(stored, dict):
        if paging.is_box(stored):
            return untyped(serde, paging.unbox(stored, pages))
        return [untyped(serde, item) for item in paging.unpage(stored, pages)]
    return untyped(serde, stored)


def checkpoint_state(
    serde: SerializerProtocol,
    checkpoint: Checkpoint,
    metadata: Mapping[str, Any],
    previous: ChannelCache,
    new_pages: dict[str, list[Any]],
    name: paging.PageHash = paging.page_hash,
) -> tuple[dict[str, Any], ChannelCache]:
    """The state stored for one checkpoint, and its encoded channels for the next one.

    ``previous`` must be the encoded channels of this checkpoint's parent: a channel whose
    version is the parent's is unchanged (LangGraph bumps a channel's version whenever its
    value changes), so its encoding is reused rather than serialized again; so is each
    list item that is the same object as one in the parent's list. The pages of long lists
    that the parent did not have are added to ``new_pages`` (to be stored first), named
    by ``name``.
    """
    rest = {key: value for key, value in checkpoint.items() if key != "channel_values"}
    versions = checkpoint.get("channel_versions", {})
    values: dict[str, Any] = {}
    fresh: ChannelCache = {}
    for channel, value in checkpoint.get("channel_values", {}).items():
        version = versions.get(channel)
        known = previous.get(channel)
        if version is not None and known is not None and known[0] == version:
            fresh[channel] = known
        else:
            # Nothing of a value that is not a list is kept: a channel of text and
            # numbers is cached as a tuple of atoms, which the garbage collector stops
            # tracking instead of promoting it with each step's cache.
            fresh[channel] = (version, *_channel(serde, value, known, new_pages, name))
        values[channel] = fresh[channel][1]
    state = {
        "checkpoint": typed(serde, rest),
        "metadata": typed(serde, dict(metadata)),
        "values": values,
    }
    return state, fresh


def _field(state: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = state.get(name)
    if not isinstance(value, kind):
        raise CheckpointCorruptedError(f"a stored LangGraph checkpoint has no valid {name!r}")
    return value


def decode_metadata(serde: SerializerProtocol, state: Mapping[str, Any]) -> dict[str, Any]:
    """Only the metadata of a stored checkpoint (for filters over many checkpoints)."""
    metadata = untyped(serde, _field(state, "metadata", (str, list)))
    if not isinstance(metadata, dict):
        raise CheckpointCorruptedError("a stored LangGraph checkpoint's metadata is not a mapping")
    return metadata


def page_hashes(state: Mapping[str, Any]) -> set[str]:
    """The pages a stored checkpoint's list channels reference."""
    return paging.referenced(_field(state, "values", dict))


def decode_checkpoint(
    serde: SerializerProtocol, state: Mapping[str, Any], pages: Mapping[str, list[Any]]
) -> tuple[Checkpoint, dict[str, Any]]:
    """The checkpoint (with its channel values) and metadata of a stored state."""
    checkpoint = untyped(serde, _field(state, "checkpoint", (str, list)))
    metadata = decode_metadata(serde, state)
    if not isinstance(checkpoint, dict):
        raise CheckpointCorruptedError("a stored LangGraph checkpoint is not a mapping")
    values = _field(state, "values", dict)
    checkpoint["channel_values"] = {
        channel: _unchannel(serde, stored, pages) for channel, stored in values.items()
    }
    return checkpoint, metadata  # type: ignore[return-value]


def decode_writes(state: Mapping[str, Any]) -> list[Write]:
    """The stored writes of a writes state, checked for shape."""
    writes = _field(state, "writes", list)
    out: list[Write] = []
    for write in writes:
        # A list as stored now; a tuple in stores written while writes went in as tuples.
        if not (isinstance(write, (list, tuple)) and len(write) == 5 and type(write[1]) is int):
            raise CheckpointCorruptedError("a stored LangGraph write is malformed")
        task_id, idx, channel, value, path = write
        if not (isinstance(task_id, str) and isinstance(channel, str) and isinstance(path, str)):
            raise CheckpointCorruptedError("a stored LangGraph write is malformed")
        out.append((task_id, idx, channel, value, path))
    return out


def merge_writes(
    serde: SerializerProtocol,
    stored: Sequence[Write],
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> list[Write]:
    """``stored`` plus one task's new writes, as LangGraph's own savers merge them.

    A regular write whose ``(task_id, index)`` is already stored is ignored (a retried
    task writes the same thing); the special writes (errors, interrupts, resumes) replace.
    """
    if not stored and not any(channel in WRITES_IDX_MAP for channel, _ in writes):
        # The common call (a task's first writes, none special): indexes 0, 1, ... of one
        # task, already in LangGraph's order, so nothing to merge or sort.
        return [
            (task_id, index, channel, typed(serde, value), task_path)
            for index, (channel, value) in enumerate(writes)
        ]
    merged = {(write[0], write[1]): write for write in stored}
    for index, (channel, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(channel, index)
        if idx >= 0 and (task_id, idx) in merged:
            continue
        merged[(task_id, idx)] = (task_id, idx, channel, typed(serde, value), task_path)
    return sorted(merged.values(), key=lambda w: writes_sort_key(w[4], w[0], w[1]))


def flat_writes(checkpoint_id: str, writes: Sequence[Write]) -> tuple[Any, ...]:
    """The id and ``writes`` as one tuple, their fields in a row (see :func:`unflat_writes`)."""
    return (checkpoint_id, *[field for write in writes for field in write])


def unflat_writes(flat: tuple[Any, ...]) -> list[Write]:
    """The writes of a tuple :func:`flat_writes` made."""
    return [flat[i : i + 5] for i in range(1, len(flat), 5)]


def pending_writes(
    serde: SerializerProtocol, stored: Sequence[Write]
) -> list[tuple[str, str, Any]]:
    """LangGraph's ``pending_writes`` of a checkpoint: ``(task_id, channel, value)``."""
    return [(task_id, channel, untyped(serde, value)) for task_id, _, channel, value, _ in stored]
