"""The tagged JSON form of typed values, as records store it (docs/serialization.md).

A typed value is stored as a JSON object with exactly one key, the *tag*, which starts with
``$``; the tag says how to read the value under it:

=========  =====================================  =======================================
tag        value                                  stored data
=========  =====================================  =======================================
``$dt``    ``datetime``                           ``isoformat()`` text
``$date``  ``date``                               ``isoformat()`` text
``$time``  ``time``                               ``isoformat()`` text
``$td``    ``timedelta``                          ``[days, seconds, microseconds]``
``$uuid``  ``uuid.UUID``                          32 hex digits
``$dec``   ``decimal.Decimal``                    ``str()`` text (exact digits)
``$b``     ``bytes``                              base64 text
``$ba``    ``bytearray``                          base64 text
``$tup``   ``tuple``                              array of its items
``$set``   ``set``                                array of its items
``$fset``  ``frozenset``                          array of its items
``$map``   ``dict`` with a non-``str`` key, or    array of ``[key, value]`` pairs
           one that would read as a tag
``$``      a registered type                      ``[name, version, data]``
=========  =====================================  =======================================

The data under a tag is itself in this form (a tuple of datetimes nests). A user's dict
that has exactly one key starting with ``$`` is stored under ``$map``, so no user data is
ever read as a tag, and any other ``$`` key of a one-key object is corruption. In the
compact text writers produce, every tag opens with the bytes ``{"$``, which no JSON string
can hold unescaped: text without them holds no tag, which lets readers skip the walk.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BYTEARRAY",
    "BYTES",
    "DATE",
    "DATETIME",
    "DECIMAL",
    "FROZENSET",
    "MAP",
    "MARK",
    "SET",
    "TAG_START",
    "TIME",
    "TIMEDELTA",
    "TUPLE",
    "TYPED",
    "UUID",
    "may_hold_tag",
]

#: Every tag starts with this character.
TAG_START: Final = "$"
#: The bytes every tag opens with in compact JSON text.
MARK: Final = b'{"$'


def may_hold_tag(text: bytes | bytearray | memoryview) -> bool:
    """Whether compact JSON text may hold a tag (it does unless this is False)."""
    # Looking for one byte is a memchr (~0.04 ms per MB); for the three-byte mark, CPython
    # scans at ~0.6 GB/s (~1.5-2.5 ms per MB). Most states hold no "$" at all.
    return b"$" in text and MARK in text


DATETIME: Final = "$dt"
DATE: Final = "$date"
TIME: Final = "$time"
TIMEDELTA: Final = "$td"
UUID: Final = "$uuid"
DECIMAL: Final = "$dec"
BYTES: Final = "$b"
BYTEARRAY: Final = "$ba"
TUPLE: Final = "$tup"
SET: Final = "$set"
FROZENSET: Final = "$fset"
MAP: Final = "$map"
TYPED: Final = "$"
