"""Sliced work: generator steps that yield between slices, and what drives them.

A step of large-state work (a split, a copy's encoding) is a generator: it yields ``None``
between slices of CPU work so that an event loop can run it a slice at a time, or a
:data:`Job` (a call to run, in a worker thread where its driver has one) and is sent the
job's result. :func:`finish` drives such work to its end in one go; the record pipeline's
``cooperate`` drives it on the loop. The encoders here hold the GIL for about a slice at a
time (``docs/incremental.md``, "Where the split runs").
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Generator
from typing import Any, Final, TypeVar

import orjson

from ..format.checksum import crc32

__all__ = [
    "LIST_SLICE",
    "OFFLOAD_BYTES",
    "SLICED",
    "SLICE_BYTES",
    "Job",
    "Work",
    "crc_work",
    "dumps_work",
    "fast_dumps",
    "finish",
    "job",
]

_T = TypeVar("_T")
#: A call a split step hands to its driver (:func:`finish`, or the pipeline's
#: ``cooperate``, which runs it in a worker thread) and is sent the result of.
Job = Callable[[], Any]
#: A step: yields None between slices of work, or a Job to run; returns its result.
Work = Generator[Job | None, Any, _T]

#: Texts from this size on are hashed, checksummed and copied by jobs, not on the caller's
#: thread: hashlib, crc32 and bytes.join release the GIL for them (~1-2 ms per MB here).
OFFLOAD_BYTES: Final = 1024 * 1024

# How many bytes of JSON text a cooperative split handles between two yields: ~0.1-0.2 ms of
# CPU here (docs/incremental.md, "Where the split runs").
SLICE_BYTES: Final = 32 * 1024
#: Lists longer than this are encoded a run of items at a time (see dumps_work).
LIST_SLICE: Final = 64
#: The kinds of values dumps_work may slice.
SLICED: Final = frozenset((str, list))

# orjson, refusing what it would encode differently from the exact encoder: values of
# other types raise TypeError (as do ints beyond 64 bits), and the caller falls back to it.
fast_dumps: Final = functools.partial(
    orjson.dumps,
    option=orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS,
)


def finish(work: Work[_T]) -> _T:
    """Run split work to its end in one go (its jobs too, in this thread)."""
    try:
        job = next(work)
        while True:
            job = work.send(None if job is None else job())
    except StopIteration as stop:
        result: _T = stop.value
        return result


def job(call: Callable[..., _T], *args: Any) -> Generator[Job, Any, _T]:
    """Have the driver run ``call(*args)`` (in a worker thread) and return its result."""
    result: _T = yield functools.partial(call, *args)
    return result


def crc_work(text: bytes, crc: int = 0) -> Generator[Job | None, Any, int]:
    """``crc32(text, crc)``, as a job when ``text`` is large."""
    if len(text) < OFFLOAD_BYTES:
        return crc32(text, crc)
    return (yield from job(crc32, text, crc))


def dumps_work(value: Any) -> Generator[Job | None, Any, bytes]:
    """``fast_dumps(value)``; a long string or list is encoded in slices, joined by a job.

    JSON escapes a string character by character and separates a list's items by commas,
    so the slices' texts joined are the whole value's text. One orjson call holds the GIL
    for as long as it runs (~1-2 ms per MB): a slice is about a megabyte of string, or
    about ``SLICE_BYTES`` of a list's items.
    """
    kind = type(value)
    if kind is str and len(value) >= 2 * OFFLOAD_BYTES:
        parts = yield from _string_parts(value)
        separator = b""
    elif kind is list and len(value) > LIST_SLICE:
        parts = yield from _list_parts(value)
        separator = b","
    else:
        return fast_dumps(value)
    opening, closing = (b'"', b'"') if kind is str else (b"[", b"]")
    pieces = [opening, parts[0]]
    for part in itertools.islice(parts, 1, None):
        pieces += (separator, part)
    pieces.append(closing)
    return (yield from job(b"".join, pieces))


def _string_parts(value: str) -> Generator[None, Any, list[bytes]]:
    """The JSON texts of ``value``'s slices, without their quotes."""
    parts = []
    for start in range(0, len(value), OFFLOAD_BYTES):
        parts.append(fast_dumps(value[start : start + OFFLOAD_BYTES])[1:-1])
        yield None
    return parts


def _list_parts(value: list[Any]) -> Generator[None, Any, list[bytes]]:
    """The JSON texts of runs of ``value``'s items, without their brackets."""
    parts = []
    start, count = 0, LIST_SLICE
    while start < len(value):
        text = fast_dumps(value[start : start + count])
        parts.append(text[1:-1])
        start += count
        # Aim the next run at about SLICE_BYTES of text.
        count = max(1, min(4 * count, count * SLICE_BYTES // len(text)))
        yield None
    return parts
