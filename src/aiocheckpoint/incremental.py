"""Incremental checkpoints: a state stored as a tree of content-addressed blobs.

A façade kept for its documented names; the code lives where each job is done:

* the node and record formats, :class:`TreeParams`, :class:`SplitResult` and what
  backends parse: :mod:`aiocheckpoint.format.tree`;
* cutting a state into blobs: :mod:`aiocheckpoint.codec.tree.split`; rebuilding it:
  :mod:`aiocheckpoint.codec.tree.join`; version-2 records: :mod:`aiocheckpoint.codec.tree.v2`;
* a split's memory and its recovery: :mod:`aiocheckpoint.codec.tree.splitmemory`.

``docs/incremental.md`` describes the format, the garbage collection scheme and the write
ordering backends must follow.
"""

from __future__ import annotations

from .codec.tree.join import (
    AsyncFetch,
    Fetch,
    ajoin_state,
    areferenced_hashes,
    join_state,
    referenced_hashes,
)
from .codec.tree.split import split_state
from .codec.tree.splitmemory import recovered_memory
from .codec.tree.v2 import (
    adecode_checkpoint_v2,
    decode_checkpoint_v2,
    encode_checkpoint_v2,
    encode_v2_work,
)
from .format.header import FORMAT_VERSION_2, record_format_version
from .format.tree import (
    DEFAULT_PARAMS,
    SplitMemory,
    SplitResult,
    TreeParams,
    node_children,
    record_root_refs,
)

__all__ = [
    "DEFAULT_PARAMS",
    "FORMAT_VERSION_2",
    "AsyncFetch",
    "Fetch",
    "SplitMemory",
    "SplitResult",
    "TreeParams",
    "adecode_checkpoint_v2",
    "ajoin_state",
    "areferenced_hashes",
    "decode_checkpoint_v2",
    "encode_checkpoint_v2",
    "encode_v2_work",
    "join_state",
    "node_children",
    "record_format_version",
    "record_root_refs",
    "recovered_memory",
    "referenced_hashes",
    "split_state",
]
