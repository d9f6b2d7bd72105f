"""The reference-counting scheme of docs/incremental.md, run on a real SQLite file.

This is not a backend: it is the documented algorithm (add_ref / release in the same
transaction as the record) in a few lines, so that the SQLite and PostgreSQL backends can
take it over, checked against the ground truth after every operation.
"""

import random
import sqlite3
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from aiocheckpoint import AgentStatus, Checkpoint, StateSnapshot
from aiocheckpoint.incremental import (
    SplitResult,
    TreeParams,
    decode_checkpoint_v2,
    encode_checkpoint_v2,
    node_children,
    record_root_refs,
    referenced_hashes,
)
from aiocheckpoint.serde import to_storable

PARAMS = TreeParams(inline_limit=128, root_inline_limit=512, chunk_min=64, chunk_avg=256)


class RefcountedStore:
    """Records and blobs with reference counts, kept in one SQLite transaction per write."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.executescript(
            """
            PRAGMA journal_mode=WAL;
            PRAGMA synchronous=FULL;
            CREATE TABLE blobs (hash BLOB PRIMARY KEY, refs INTEGER NOT NULL, data BLOB NOT NULL);
            CREATE TABLE records (wf TEXT, step INTEGER, data BLOB, PRIMARY KEY (wf, step));
            """
        )

    def save(self, checkpoint: Checkpoint, keep_last: int | None = None) -> None:
        record, split = encode_checkpoint_v2(checkpoint, PARAMS)
        wf, step = checkpoint.workflow_id, checkpoint.step
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for h in split.root_refs:  # adds first: a blob shared with the old record stays > 0
                self._add_ref(h, split)
            old = self.db.execute(
                "SELECT data FROM records WHERE wf = ? AND step = ?", (wf, step)
            ).fetchone()
            self.db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?)", (wf, step, record))
            if old is not None:
                self._release_record(old[0])
            if keep_last is not None:
                doomed = self.db.execute(
                    "SELECT step, data FROM records WHERE wf = ? ORDER BY step DESC LIMIT -1 "
                    "OFFSET ?",
                    (wf, keep_last),
                ).fetchall()
                for old_step, data in doomed:
                    self.db.execute("DELETE FROM records WHERE wf = ? AND step = ?", (wf, old_step))
                    self._release_record(data)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def delete(self, wf: str, step: int) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        row = self.db.execute(
            "DELETE FROM records WHERE wf = ? AND step = ? RETURNING data", (wf, step)
        ).fetchone()
        if row is not None:
            self._release_record(row[0])
        self.db.execute("COMMIT")

    def _add_ref(self, h: bytes, split: SplitResult) -> None:
        cur = self.db.execute("UPDATE blobs SET refs = refs + 1 WHERE hash = ?", (h,))
        if cur.rowcount == 0:
            self.db.execute("INSERT INTO blobs VALUES (?, 1, ?)", (h, split.blobs[h]))
            for child in split.children[h]:
                self._add_ref(child, split)

    def _release_record(self, record: bytes) -> None:
        for h in record_root_refs(record):
            self._release(h)

    def _release(self, h: bytes) -> None:
        refs, data = self.db.execute(
            "UPDATE blobs SET refs = refs - 1 WHERE hash = ? RETURNING refs, data", (h,)
        ).fetchone()
        if refs == 0:
            self.db.execute("DELETE FROM blobs WHERE hash = ?", (h,))
            for child in node_children(data):
                self._release(child)

    def fetch(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        marks = ",".join("?" * len(hashes))
        rows = self.db.execute(f"SELECT hash, data FROM blobs WHERE hash IN ({marks})", [*hashes])
        return dict(rows.fetchall())

    def records(self) -> list[tuple[str, int, bytes]]:
        return self.db.execute("SELECT wf, step, data FROM records").fetchall()

    def blobs(self) -> dict[bytes, tuple[int, bytes]]:
        rows = self.db.execute("SELECT hash, refs, data FROM blobs").fetchall()
        return {h: (refs, data) for h, refs, data in rows}


def _checkpoint(wf: str, step: int, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        workflow_id=wf,
        step=step,
        agent_id="a",
        status=AgentStatus.RUNNING,
        state_snapshot=StateSnapshot(data=to_storable(state)),
    )


def _check(store: RefcountedStore, expected: dict[tuple[str, int], dict[str, Any]]) -> None:
    records = store.records()
    assert {(wf, step) for wf, step, _ in records} == set(expected)
    for wf, step, data in records:
        cp = decode_checkpoint_v2(data, store.fetch, workflow_id=wf, step=step)
        assert cp.state_snapshot.data == expected[wf, step]
    blobs = store.blobs()
    reachable = set()
    for _, _, data in records:
        reachable |= _reachable(data, store)
    assert set(blobs) == reachable, "leaked or dangling blobs"
    counts: Counter[bytes] = Counter()
    for _, _, data in records:
        counts.update(record_root_refs(data))
    for _, data in blobs.values():
        counts.update(node_children(data))
    assert {h: refs for h, (refs, _) in blobs.items()} == dict(counts)


def _reachable(record: bytes, store: RefcountedStore) -> set[bytes]:
    refs = record_root_refs(record)
    if not refs:
        return set()
    # referenced_hashes takes roots; a record's direct refs are the roots' children.
    found = set(refs)
    for h in refs:
        found |= referenced_hashes([store.fetch([h])[h]], store.fetch)
    return found


def test_reference_counts_free_exactly_the_unreferenced_blobs(tmp_path: Path) -> None:
    """Saves, replacements, deletes and keep_last leave no leaked and no missing blob."""
    rng = random.Random(7)
    store = RefcountedStore(tmp_path / "refs.db")
    shared_docs = {f"doc{i}": "lorem ipsum " * rng.randint(5, 30) for i in range(12)}
    states = {wf: {"docs": dict(shared_docs), "log": [], "n": 0} for wf in ("a", "b")}
    expected: dict[tuple[str, int], dict[str, Any]] = {}
    steps = {"a": 0, "b": 0}
    for op in range(120):
        wf = rng.choice(["a", "b"])
        state = states[wf]
        action = rng.random()
        if action < 0.1 and any(k[0] == wf for k in expected):
            victim = rng.choice([k for k in expected if k[0] == wf])
            store.delete(*victim)
            del expected[victim]
        else:
            state["n"] += 1
            state["log"].append({"op": op, "text": f"entry {op} " * rng.randint(1, 8)})
            if action < 0.4:
                key = rng.choice(list(state["docs"]))
                state["docs"][key] += " edit"
            replace = action > 0.9 and steps[wf] > 0
            step = steps[wf] if replace else steps[wf] + 1
            steps[wf] = step
            keep = 4 if wf == "a" else None
            store.save(_checkpoint(wf, step, state), keep_last=keep)
            expected[wf, step] = to_storable(state)
            if keep is not None:
                for old in sorted(k for k in expected if k[0] == wf)[:-keep]:
                    del expected[old]
        _check(store, expected)
    assert len(store.blobs()) > 20
    for wf, step in list(expected):
        store.delete(wf, step)
    assert store.blobs() == {}
