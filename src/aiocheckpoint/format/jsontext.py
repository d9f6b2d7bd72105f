"""Reading the JSON text records hold: ints of any size, ``NaN`` and the infinities.

Records are UTF-8 JSON as Python's ``json`` module writes it with ``ensure_ascii=False``:
``NaN``/``Infinity``/``-Infinity`` stand for the non-finite floats, and ints are written in
full whatever their size (Python refuses to convert ints of more than 4300 digits by
default; these functions do not). The writing side is :mod:`aiocheckpoint.codec.jsontext`.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["BIG_INT_BITS", "decimal_to_int", "is_digit_limit", "loads"]

#: Ints up to this bit length convert to and from text with ``int``/``str`` directly (the
#: interpreter's digit limit never applies below it).
BIG_INT_BITS: Final = 14_000


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
    """Parse JSON text, ints of any length included."""
    try:
        return json.loads(body)
    except ValueError as exc:
        if not is_digit_limit(exc):
            raise
    return json.loads(body, parse_int=decimal_to_int)
