"""Turning checkpoints into bytes and back: validation, the record format and its checksum.

A façade kept for its documented names; the code lives in the record pipeline:

* what can be stored, and the validated copy: :mod:`aiocheckpoint.codec.copy` (typed
  values: :mod:`aiocheckpoint.codec.typed`, their tags :mod:`aiocheckpoint.format.tags`);
* version-1 records (a 20-byte header, then the whole checkpoint as JSON):
  :mod:`aiocheckpoint.codec.v1`, with the header in :mod:`aiocheckpoint.format.header`;
* the nesting limit: :mod:`aiocheckpoint.format.limits`.
"""

from __future__ import annotations

from .codec.copy import json_copy, storable_copy, storable_copy_work, to_storable
from .codec.v1 import check_owner, decode_checkpoint, encode_checkpoint
from .format.header import FORMAT_VERSION, HEADER_SIZE, MAGIC, read_header
from .format.limits import MAX_DEPTH

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_DEPTH",
    "check_owner",
    "decode_checkpoint",
    "encode_checkpoint",
    "json_copy",
    "read_header",
    "storable_copy",
    "storable_copy_work",
    "to_storable",
]
