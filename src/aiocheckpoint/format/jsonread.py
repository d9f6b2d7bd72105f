"""Reading the JSON text records hold: ints of any size, ``NaN`` and the infinities.

Records are UTF-8 JSON as Python's ``json`` module writes it with ``ensure_ascii=False``:
``NaN``/``Infinity``/``-Infinity`` stand for the non-finite floats, and ints are written in
full up to :data:`~aiocheckpoint.format.limits.MAX_INT_DIGITS` digits (Python refuses to
convert ints of more than 4300 digits by default; :func:`loads` reads them up to that limit
whatever the interpreter's setting, and refuses a longer one as corruption before it
converts it).
Writers never store a string that is not valid Unicode (a lone surrogate), so :func:`loads`
refuses one, raw or escaped. The writing side is :mod:`aiocheckpoint.codec.jsonwrite`.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from typing import Any, Final

import orjson

from ..errors import CheckpointCorruptedError
from .limits import MAX_INT_DIGITS

__all__ = [
    "BIG_INT_BITS",
    "SHORT_INT_BOUND",
    "decimal_to_int",
    "int_too_long",
    "is_digit_limit",
    "loads",
    "loads_fast",
]

#: Ints up to this bit length convert to and from text with ``int``/``str`` directly (the
#: interpreter's digit limit never applies below it).
BIG_INT_BITS: Final = 14_000
# An escaped surrogate, or something that looks like one (an escaped backslash before "u").
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
#: An int strictly between ``-SHORT_INT_BOUND`` and ``SHORT_INT_BOUND`` has at most
#: ``MAX_INT_DIGITS`` digits (a power of two: ``10**MAX_INT_DIGITS`` takes milliseconds to
#: compute, so only an int this large needs it).
SHORT_INT_BOUND: Final = 1 << int((MAX_INT_DIGITS - 1) * 3.321928094887362)
_NEGATIVE_BOUND: Final = -SHORT_INT_BOUND
_digit_limit: Callable[[], int] | None = getattr(sys, "get_int_max_str_digits", None)


def decimal_to_int(text: str) -> int:
    """Parse decimal digits of any length (divide and conquer; no digit limit applies)."""
    if len(text) <= 4000:
        return int(text)
    if text[0] == "-":
        return -decimal_to_int(text[1:])
    half = len(text) // 2
    low_len = len(text) - half
    scale: int = 10**low_len
    return decimal_to_int(text[:half]) * scale + decimal_to_int(text[half:])


def int_too_long(n: int) -> bool:
    """Whether ``n`` has more than :data:`~aiocheckpoint.format.limits.MAX_INT_DIGITS` digits."""
    if _NEGATIVE_BOUND < n < SHORT_INT_BOUND:
        return False
    return abs(n) >= _ten_to_the_limit()


@functools.cache
def _ten_to_the_limit() -> int:
    bound: int = 10**MAX_INT_DIGITS
    return bound


def _bounded_int(text: str) -> int:
    """An int's decimal text (as JSON has it) to an int; too many digits is corruption."""
    digits = len(text) - (text[:1] == "-")
    if digits > MAX_INT_DIGITS:
        raise CheckpointCorruptedError(
            f"an int of {digits} digits (writers store at most {MAX_INT_DIGITS})"
        )
    return decimal_to_int(text)


def _interpreter_bounds_ints() -> bool:
    """Whether ``int()`` refuses, before converting them, ints longer than writers store."""
    limit = 0 if _digit_limit is None else _digit_limit()
    return 0 < limit <= MAX_INT_DIGITS


def is_digit_limit(exc: ValueError) -> bool:
    """Whether ``exc`` is the interpreter refusing a long int conversion."""
    return "integer string conversion" in str(exc) or "Exceeds the limit" in str(exc)


def loads(body: bytes | bytearray) -> Any:
    """Parse UTF-8 JSON text, ints of up to ``MAX_INT_DIGITS`` digits included.

    Text that is not UTF-8 (raw surrogates included) raises ``UnicodeDecodeError``; a
    string holding an escaped lone surrogate, or an int of more than
    :data:`~aiocheckpoint.format.limits.MAX_INT_DIGITS` digits, raises
    :class:`CheckpointCorruptedError`.
    """
    text = body.decode("utf-8")  # what json.loads would do, but strict
    if not _interpreter_bounds_ints():  # int() would convert any int, in quadratic time
        value = json.loads(text, parse_int=_bounded_int)
    else:
        try:
            value = json.loads(text)
        except ValueError as exc:
            if not is_digit_limit(exc):
                raise
            value = json.loads(text, parse_int=_bounded_int)
    # A backslash is found at memchr speed; most texts have none, and escapes of
    # surrogates are rarer still: only then is every string looked at.
    if b"\\" in body and _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(value):
        raise CheckpointCorruptedError("a string holds a lone surrogate (not valid Unicode)")
    return value


def loads_fast(body: bytes | bytearray) -> Any:
    """:func:`loads` for text the fast encoder wrote: no ``NaN``, no int beyond 64 bits.

    orjson reads such text exactly, up to 1.5x faster than :func:`loads` on number-heavy
    states (and as fast on long strings); it reads an int beyond 64 bits as a float, which
    is why only text known to hold none may come here. Whatever orjson refuses (a lone
    surrogate, invalid UTF-8, a ``NaN``, deep nesting) goes to :func:`loads`, which
    reads it exactly or raises as it would for any text.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return loads(body)


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string in a parsed value, keys included, is not valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item)
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is str and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False
