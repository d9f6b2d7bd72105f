"""Forks of version-2 records: the same tree of blobs under another workflow's record.

A fork shares its state's blobs with the source (they are content-addressed): only the
record, whose fields name the workflow, is written again. The blobs are not read for their
content (but for the root's children, which some stores' reference counting wants),
only walked for their hashes, so that the store can count (or, for the file store,
keep fresh) every blob the new record relies on, as it does for a new tree.
"""

from __future__ import annotations

from ...errors import CheckpointCorruptedError
from ...format.tree import SplitResult, node_children, record_tree
from ...storage.base import BlobCheckpointStorage
from .v2 import rehomed_record

__all__ = ["fork_tree"]

#: Hashes fetched per round trip while walking a tree.
_BATCH = 256


async def fork_tree(
    blobs: BlobCheckpointStorage, record: bytes, workflow_id: str
) -> tuple[bytes, SplitResult] | None:
    """``record`` rewritten for ``workflow_id`` and the split naming the blobs it shares.

    None when ``record`` is not a version-2 record with a root (nothing to share). A blob
    the store lacks, or one that does not parse, raises :class:`CheckpointCorruptedError`.
    """
    tree = record_tree(record)
    if tree is None:
        return None
    meta, digest, root = tree
    refs = node_children(root, digest)
    children, top = await _walk(blobs, refs, digest)
    # The root's children go along (they are stored already, so nothing is written): a
    # store's count update may want the bytes of every blob the root references.
    split = SplitResult(root, top, children, refs)
    return rehomed_record(meta, digest, root, workflow_id), split


async def _walk(
    blobs: BlobCheckpointStorage, refs: tuple[bytes, ...], digest: int
) -> tuple[dict[bytes, tuple[bytes, ...]], dict[bytes, bytes]]:
    """Each node below the root with the hashes it references; the root's children's bytes.

    Level by level, ``_BATCH`` hashes per fetch: only hashes are kept, never the state.
    """
    children: dict[bytes, tuple[bytes, ...]] = {}
    top: dict[bytes, bytes] = {}
    level = list(refs)
    while level:
        following: dict[bytes, None] = {}
        for start in range(0, len(level), _BATCH):
            batch = level[start : start + _BATCH]
            found = await blobs.fetch_blobs(batch)
            for h in batch:
                blob = found.get(h)
                if blob is None:
                    raise CheckpointCorruptedError(f"blob {h.hex()} is missing")
                if h in refs:
                    top[h] = blob
                children[h] = kids = node_children(blob, digest)
                following.update((kid, None) for kid in kids if kid not in children)
        level = [h for h in following if h not in children]
    return children, top
