"""The limits a writer keeps, which readers and backends rely on too."""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_SHARED_HASH",
    "MAX_STEP",
    "MAX_WORKFLOW_ID_BYTES",
]

#: Records larger than this are refused by the durable backends (file, SQLite, PostgreSQL), on
#: write and on read, so that a damaged or hostile store cannot make a reader allocate
#: without bound.
DEFAULT_MAX_RECORD_BYTES: Final = 512 * 1024 * 1024
#: How deeply containers may nest in a state or its metadata (the top-level one is depth 0).
MAX_DEPTH: Final = 200
#: Ints have at most this many decimal digits (the sign aside) in a state, its metadata or an
#: effect's result. Turning decimal digits into an int takes time that grows faster than
#: their count (seconds for a million digits, minutes for eight million), so writers refuse
#: a longer int and readers refuse one as corruption: reading a record stays bounded by its
#: size (at this limit, about 0.3 s of CPU per MB of digits in the worst case).
MAX_INT_DIGITS: Final = 100_000
#: At most this many items of a set or frozenset, or keys of a dict stored as ``$map``, share
#: one hash value. Ints that differ by a multiple of ``2**61 - 1`` hash alike (and so do
#: tuples, floats and decimals made of them), and building a set of ``n`` such items takes
#: time quadratic in ``n``: minutes for the items an 8 MB record holds. Writers refuse a set
#: or dict that crowded, readers refuse one as corruption.
MAX_SHARED_HASH: Final = 32
#: Workflow ids are non-empty ``str`` of at most this many UTF-8 bytes.
MAX_WORKFLOW_ID_BYTES: Final = 255
#: Steps are stored as signed 64-bit integers by the database backends.
MAX_STEP: Final = 2**63 - 1
