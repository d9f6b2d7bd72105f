"""Where a LangGraph checkpoint lives in an aiocheckpoint store: workflow ids and steps.

Every ``(thread_id, checkpoint_ns)`` pair is one aiocheckpoint workflow, so a store's
tools (``aiocheckpoint ls``, ``verify``, ``copy``) see one workflow per thread and
namespace. A checkpoint's step is derived from its id: LangGraph's ids are UUIDs whose
first 60 bits are a timestamp, and every LangGraph saver orders checkpoints by their id,
so the step keeps that order. The checkpoint is stored at the even step ``2 * t`` and its
pending writes at the odd step ``2 * t + 1``, so one indexed range read returns both.
The full pages of a thread's long lists are records of one more workflow per thread,
``lgp:...``, at steps taken from their content hashes.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Final

from ...errors import InvalidArgumentError

__all__ = [
    "PREFIX",
    "checkpoint_step",
    "is_checkpoint_step",
    "page_step",
    "pages_workflow",
    "thread_prefix",
    "workflow_id",
    "writes_step",
]

#: Every workflow id of a LangGraph thread starts with this.
PREFIX: Final = "lg:"
# A part longer than this (or containing NUL) is replaced by its digest, so that the
# workflow id stays within aiocheckpoint's 255 UTF-8 bytes whatever LangGraph passes.
_MAX_PART_BYTES: Final = 100
# A UUID in its canonical form (what str(uuid.UUID(...)) gives): lowercase, 8-4-4-4-12.
_CANONICAL_UUID: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"
)


def _part(text: str) -> str:
    if not isinstance(text, str):
        raise InvalidArgumentError(f"thread ids and namespaces must be str, not {type(text)!r}")
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= _MAX_PART_BYTES and "\x00" not in text and not text.startswith("#"):
        return text
    return "#" + hashlib.sha256(raw).hexdigest()[:40]


def thread_prefix(thread_id: str) -> str:
    """The prefix shared by the workflow ids of every namespace of ``thread_id``."""
    part = _part(thread_id)
    return f"{PREFIX}{len(part)}:{part}:"


def pages_workflow(thread_id: str) -> str:
    """The workflow that holds the pages of a thread's long lists (``records.py``)."""
    part = _part(thread_id)
    return f"lgp:{len(part)}:{part}"


def page_step(page_hash: str) -> int:
    """The step of a page: the first 60 bits of its (hex) content hash."""
    return int(page_hash[:15], 16)


@functools.lru_cache(maxsize=4096)  # every put asks, with the same few pairs
def workflow_id(thread_id: str, checkpoint_ns: str) -> str:
    """The workflow that holds one thread's namespace (``""`` is the root graph)."""
    return thread_prefix(thread_id) + _part(checkpoint_ns)


def checkpoint_step(checkpoint_id: str) -> int:
    """The (even) step of a checkpoint id: twice the UUID's 60-bit timestamp field.

    Raises :class:`~aiocheckpoint.InvalidArgumentError` for an id that is not a UUID in
    its canonical lowercase form (LangGraph's ids always are).
    """
    if type(checkpoint_id) is not str:
        raise _not_an_id(checkpoint_id)
    return _step_of(checkpoint_id)


@functools.lru_cache(maxsize=4096)  # each id is asked for by its aput and by its writes
def _step_of(checkpoint_id: str) -> int:
    if _CANONICAL_UUID.match(checkpoint_id) is None:
        raise _not_an_id(checkpoint_id)
    # The UUID's high 64 bits: its first three groups.
    high = int(checkpoint_id[:8] + checkpoint_id[9:13] + checkpoint_id[14:18], 16)
    # time_high and time_mid, then time_low without the version nibble between them.
    stamp = ((high >> 16) << 12) | (high & 0xFFF)
    return stamp * 2


def _not_an_id(checkpoint_id: object) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"checkpoint ids must be canonical UUID strings (LangGraph's uuid6), got {checkpoint_id!r}"
    )


def writes_step(checkpoint_id: str) -> int:
    """The (odd) step holding the pending writes of a checkpoint."""
    return checkpoint_step(checkpoint_id) + 1


def is_checkpoint_step(step: int) -> bool:
    """Whether ``step`` holds a checkpoint (even) rather than pending writes (odd)."""
    return step % 2 == 0
