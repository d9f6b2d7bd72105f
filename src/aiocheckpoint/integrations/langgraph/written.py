"""A task's written items, serialized once for its writes and for the next checkpoint.

A task that returns a message for a list channel (LangGraph's ``messages``) writes it, and
the checkpoint LangGraph makes next holds that very object in the channel's list. The
write's encoding is remembered for such an item, so the checkpoint's list reuses it rather
than serializing the message a second time. Only where the two encodings are provably the
same bytes:

* the write's value is the item itself (the same serializer call on the same object), or a
  list of that one item serialized by LangGraph's ``JsonPlusSerializer`` as msgpack: an
  array of one is the byte ``0x91`` followed by the item's own encoding (msgpack encodes
  an array's items one after the other, each as it would be alone);
* the item takes a weak reference (nothing here keeps it alive) and has a ``str`` ``id``
  that is still the same object when the checkpoint is saved. LangGraph's ``add_messages``
  changes a written message in place only to give it an id when it has none; such an item
  is not remembered. As for the list's items between checkpoints (``docs/langgraph.md``),
  an item is not expected to change in place after it is handed over.
"""

from __future__ import annotations

import binascii
import weakref
from typing import Any, Final

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

__all__ = ["Noted", "note", "reused"]

#: A namespace's remembered items: ``id(item)`` -> (weak reference, its id, its encoding).
Noted = dict[int, tuple[Any, str, str]]

#: Items remembered per namespace (a step writes one or two; the rest are stale).
_KEPT: Final = 16
_ARRAY_OF_ONE: Final = b"\x91"


def note(
    noted: Noted, serde: SerializerProtocol, value: Any, kind: str, data: bytes, code: str
) -> None:
    """Remember the item a write's ``value`` stands for, if its own encoding is known.

    ``kind`` and ``data`` are ``serde.dumps_typed(value)``, ``code`` their stored text.
    """
    if type(value) is list:
        if len(value) != 1 or kind != "msgpack" or data[:1] != _ARRAY_OF_ONE:
            return
        if type(serde) is not JsonPlusSerializer:
            return
        item = value[0]
        ident = getattr(item, "id", None)
        if type(ident) is not str:
            return
        body = binascii.b2a_base64(memoryview(data)[1:], newline=False).decode("ascii")
        code = f"msgpack:{body}"
    else:
        item = value
        ident = getattr(item, "id", None)
        if type(ident) is not str:
            return
    try:
        ref = weakref.ref(item)
    except TypeError:
        return
    noted[id(item)] = (ref, ident, code)
    while len(noted) > _KEPT:
        del noted[next(iter(noted))]


def reused(noted: Noted, item: Any) -> str | None:
    """The encoding remembered for ``item`` (taken: each is used once), or None."""
    entry = noted.pop(id(item), None)
    if entry is None or entry[0]() is not item or getattr(item, "id", None) is not entry[1]:
        return None
    return entry[2]
