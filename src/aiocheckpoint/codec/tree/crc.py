"""CRC-32 of joined texts from the CRC-32s of their parts, without reading them again.

The arithmetic is zlib's ``crc32_combine``: a CRC-32 shifted past ``n`` bytes of zeros is a
product modulo the polynomial, by an operator that depends on ``n`` only.
"""

from __future__ import annotations

from typing import Final

__all__ = ["crc_combine", "crc_shift"]

_POLY: Final = 0xEDB88320


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the CRC-32 polynomial (bit-reflected; ``a`` non-zero)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N: Final = [1 << 30]  # x^(2^k) modulo the polynomial, k = 0..31
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def _bits_shift(length: int) -> int:
    """:func:`crc_shift` by the bits of ``length``: a product per bit set."""
    p, k = 1 << 31, 3
    while length:
        if length & 1:
            p = _multmodp(_X2N[k & 31], p)
        length >>= 1
        k += 1
    return p


#: :func:`_bits_shift` of ``b << 8 * j`` for the bytes ``b`` of lengths seen (at most 256
#: per byte position): a length's operator is the product of its bytes' (~10 products per
#: length by its bits, ~5 us each, against at most one per byte beyond the first).
_BYTE_SHIFTS: Final[dict[int, int]] = {}


def crc_shift(length: int) -> int:
    """The operator that :func:`crc_combine` needs for a text of ``length`` bytes."""
    p = 0
    at = 0
    while length:
        digit = (length & 0xFF) << at
        if digit:
            factor = _BYTE_SHIFTS.get(digit)
            if factor is None:
                factor = _BYTE_SHIFTS[digit] = _bits_shift(digit)
            p = _multmodp(factor, p) if p else factor
        length >>= 8
        at += 8
    return p or 1 << 31  # 1 << 31: the operator of no bytes (x^0)


def crc_combine(crc1: int, crc2: int, shift2: int) -> int:
    """CRC-32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``crc_shift(len(b))``."""
    return _multmodp(shift2, crc1) ^ crc2
