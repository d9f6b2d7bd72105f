"""Writing the JSON text records hold: exact, with orjson where it writes the same bytes.

The text is what Python's ``json`` module writes with ``ensure_ascii=False`` and compact
separators: ``NaN``/``Infinity`` for non-finite floats, ints of any size in full. orjson
writes the same bytes 10-90x faster (docs/serialization.md) for everything else, so it is
tried first when the caller promises finite floats. Reading is
:mod:`aiocheckpoint.format.jsonread`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

import orjson

from ..format.jsonread import BIG_INT_BITS, is_digit_limit

__all__ = ["dumps", "int_to_decimal"]

_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def int_to_decimal(n: int) -> str:
    """Decimal text of an int of any size (divide and conquer; no digit limit applies)."""
    if n < 0:
        return "-" + int_to_decimal(-n)
    if n.bit_length() <= BIG_INT_BITS:
        return str(n)
    half = len(hex(n)) * 3 // 5  # about half the number of decimal digits
    high, low = divmod(n, 10**half)
    return int_to_decimal(high) + int_to_decimal(low).rjust(half, "0")


def dumps(obj: Any, finite: bool) -> bytes:
    """The exact JSON text of ``obj``; ``finite=True`` promises no NaN or infinity in it."""
    if finite:
        # orjson would turn NaN into null and refuses ints beyond 64 bits: those take the
        # slow path.
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    try:
        return _ENCODER.encode(obj).encode()
    except ValueError as exc:
        if not is_digit_limit(exc):
            raise
    # Replace each huge int by a unique placeholder string, then splice in its digits.
    nonce = uuid.uuid4().hex
    digits: dict[str, str] = {}

    def swap(value: Any) -> Any:
        if type(value) is int and value.bit_length() > BIG_INT_BITS:
            token = f"\ue000bigint-{nonce}-{len(digits)}"
            digits[token] = int_to_decimal(value)
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
