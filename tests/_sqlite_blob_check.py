"""Ground truth for the reference counts of a SQLite store, read straight from the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from aiocheckpoint.codec.tree.v2 import decode_checkpoint_v2
from aiocheckpoint.format.tree import record_root_refs
from tests._blob_refs import true_counts


def sql(path: Path, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Run one statement on its own connection (autocommit) and return its rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def check_refcounts(path: Path) -> dict[tuple[str, int], Any]:
    """Check every invariant of the blob scheme; return ``{(wf, step): state}``.

    Every record decodes (all its blobs are there and verify), every stored blob is reachable
    from a record (none leaked), every count equals the number of records and parent nodes
    referencing it, each record's ``refs`` column names exactly its root references, and no
    release is left queued.
    """
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT workflow_id, step, data, refs FROM checkpoints").fetchall()
        blobs = {h: (refs, data) for h, refs, data in conn.execute("SELECT * FROM blobs")}
        queued = conn.execute("SELECT count(*) FROM blob_releases").fetchall()[0][0]
    finally:
        conn.close()
    assert queued == 0, "releases left queued after a commit"

    def fetch(hashes: Any) -> dict[bytes, bytes]:
        return {h: blobs[h][1] for h in hashes if h in blobs}

    states: dict[tuple[str, int], Any] = {}
    roots = []
    for wf, step, data, held in rows:
        states[wf, step] = decode_checkpoint_v2(
            data, fetch, workflow_id=wf, step=step
        ).state_snapshot.data
        refs = record_root_refs(data)
        assert held == (bytes([len(refs[0])]) + b"".join(refs) if refs else None)
        roots.append(refs)
    reachable, counts = true_counts(roots, {h: data for h, (_refs, data) in blobs.items()})
    assert set(blobs) == reachable, "leaked blobs"
    assert {h: refs for h, (refs, _data) in blobs.items()} == dict(counts), "wrong counts"
    return states
