"""What stored bytes look like: record headers, version-2 trees, blobs, limits and tags.

The tags of typed values are in :mod:`aiocheckpoint.format.tags`.

Shared by the record pipeline (:mod:`aiocheckpoint.codec`), which turns checkpoints into
these bytes and back, and by the storage backends, which read just enough of them to keep
blobs and reference counts. Definitions and parsing only: no encoding policy, and nothing
here imports the codec, the storage or the manager.
"""

from .blob import FLAG_ZSTD, Unwrapper
from .header import (
    FORMAT_VERSION,
    FORMAT_VERSION_2,
    HEADER_SIZE,
    MAGIC,
    read_header,
    record_format_version,
)
from .limits import DEFAULT_MAX_RECORD_BYTES, MAX_DEPTH, MAX_INT_DIGITS, MAX_SHARED_HASH
from .tree import (
    DEFAULT_PARAMS,
    SplitMemory,
    SplitResult,
    TreeParams,
    node_children,
    open_record_v2,
    record_root_refs,
)

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_PARAMS",
    "FLAG_ZSTD",
    "FORMAT_VERSION",
    "FORMAT_VERSION_2",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_SHARED_HASH",
    "SplitMemory",
    "SplitResult",
    "TreeParams",
    "Unwrapper",
    "node_children",
    "open_record_v2",
    "read_header",
    "record_format_version",
    "record_root_refs",
]
