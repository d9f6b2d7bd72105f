"""Helpers shared by the reliability tests: store dumps, value comparison, soak scaling."""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from aiocheckpoint import CheckpointStorage
from aiocheckpoint.codec.tree.v2 import adecode_checkpoint_v2
from aiocheckpoint.format.header import FORMAT_VERSION, MAGIC
from aiocheckpoint.models import Checkpoint
from aiocheckpoint.storage.base import BlobCheckpointStorage

#: ``AIOCHECKPOINT_SOAK=1`` turns every count in the suite up for a long run.
SOAK = os.environ.get("AIOCHECKPOINT_SOAK") == "1"


def scaled(default: int, soak: int) -> int:
    """``default`` normally, ``soak`` under ``AIOCHECKPOINT_SOAK=1``."""
    return soak if SOAK else default


def hypothesis_settings(default: int, soak: int | None = None) -> settings:
    """Settings for a property test: few examples by default, many under soak."""
    return settings(
        max_examples=scaled(default, soak if soak is not None else default * 20),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


#: What the suite did (kills dealt, faults injected, ...); printed at the end of the run.
TALLY: collections.Counter[str] = collections.Counter()

Dump = dict[tuple[str, int], bytes]


async def dump_store(storage: CheckpointStorage) -> Dump:
    """Every record of the store, keyed by ``(workflow_id, step)``."""
    out: Dump = {}
    for wf in await storage.list_workflows():
        for record in await storage.scan(wf):
            out[(wf, record.step)] = record.data
    return out


async def decode_stored(
    storage: CheckpointStorage, data: bytes, workflow_id: str, step: int
) -> Checkpoint:
    """Decode a stored record of either format version, fetching blobs from ``storage``."""

    async def fetch(hashes: Any) -> Any:
        if isinstance(storage, BlobCheckpointStorage):
            return await storage.fetch_blobs(hashes)
        return {}

    return await adecode_checkpoint_v2(data, fetch, workflow_id=workflow_id, step=step)


def tree(root: Path) -> set[str]:
    """Every file and directory under ``root``, as paths relative to it."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.add(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def outside(root: Path, store_dir: Path) -> set[str]:
    """Entries under ``root`` that are neither ``store_dir``, its contents nor its parents."""
    store_rel = os.path.relpath(store_dir, root)
    allowed_parents = {os.path.relpath(p, root) for p in store_dir.parents if root in p.parents}
    return {
        p
        for p in tree(root)
        if p != store_rel and not p.startswith(store_rel + os.sep) and p not in allowed_parents
    }


def same(a: Any, b: Any) -> bool:
    """Exact equality of JSON-like values: types must match, NaN equals NaN, -0.0 keeps its sign."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def digest(value: Any) -> str:
    """A stable digest of a JSON-compatible value (NaN-safe)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def record(body: bytes, *, version: int = FORMAT_VERSION, length: int | None = None) -> bytes:
    """A record with a valid checksum around an arbitrary body (for crafted stores)."""
    size = len(body) if length is None else length
    header = struct.pack(">4sBBHQI", MAGIC, version, 0, 0, size, zlib.crc32(body))
    return header + body
