"""Reading the JSON text records hold: ints of any size, ``NaN`` and the infinities.

Records are UTF-8 JSON as Python's ``json`` module writes it with ``ensure_ascii=False``:
``NaN``/``Infinity``/``-Infinity`` stand for the non-finite floats, and ints are written in
full whatever their size (Python refuses to convert ints of more than 4300 digits by
default; these functions do not). Writers never store a string that is not valid Unicode
(a lone surrogate), so :func:`loads` refuses one, raw or escaped. The writing side is
:mod:`aiocheckpoint.codec.jsontext`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import orjson

from ..errors import CheckpointCorruptedError

__all__ = ["BIG_INT_BITS", "decimal_to_int", "is_digit_limit", "loads", "loads_fast"]

#: Ints up to this bit length convert to and from text with ``int``/``str`` directly (the
#: interpreter's digit limit never applies below it).
BIG_INT_BITS: Final = 14_000
# An escaped surrogate, or something that looks like one (an escaped backslash before "u").
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


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


def is_digit_limit(exc: ValueError) -> bool:
    """Whether ``exc`` is the interpreter refusing a long int conversion."""
    return "integer string conversion" in str(exc) or "Exceeds the limit" in str(exc)


def loads(body: bytes | bytearray) -> Any:
    """Parse UTF-8 JSON text, ints of any length included.

    Text that is not UTF-8 (raw surrogates included) raises ``UnicodeDecodeError``; a
    string holding an escaped lone surrogate raises :class:`CheckpointCorruptedError`.
    """
    text = body.decode("utf-8")  # what json.loads would do, but strict
    try:
        value = json.loads(text)
    except ValueError as exc:
        if not is_digit_limit(exc):
            raise
        value = json.loads(text, parse_int=decimal_to_int)
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
