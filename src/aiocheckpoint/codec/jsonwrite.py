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
from collections.abc import Callable
from typing import Any, Final

import orjson

from ..format.jsonread import BIG_INT_BITS, is_digit_limit

__all__ = ["dumps", "int_to_decimal", "with_long_ints"]

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
    return with_long_ints(obj, _ENCODER.encode).encode()


def with_long_ints(
    obj: Any, encode: Callable[[Any], str], text_of: Callable[[int], str] = int_to_decimal
) -> str:
    """``encode(obj)`` where ``obj`` holds ints past Python's digit limit for ``str()``.

    Each int beyond :data:`BIG_INT_BITS` becomes a unique placeholder string, which is
    replaced in the encoded text by ``text_of`` of the int (its digits by default).
    ``encode`` must write the placeholders as they are (``ensure_ascii=False``).
    """
    nonce = uuid.uuid4().hex
    texts: dict[str, str] = {}

    def swap(value: Any) -> Any:
        if type(value) is int and value.bit_length() > BIG_INT_BITS:
            token = f"\ue000int-{nonce}-{len(texts)}"
            texts[token] = text_of(value)
            return token
        if type(value) is dict:
            return {k: swap(v) for k, v in value.items()}
        if type(value) is list:
            return [swap(v) for v in value]
        return value

    text = encode(swap(obj))
    for token, number in texts.items():
        text = text.replace(f'"{token}"', number, 1)
    return text
