"""Content-addressed blobs in SQLite, with reference counts: code for the database threads.

The scheme is :mod:`aiocheckpoint.storage.refcounts` (docs/incremental.md §8) over the ``blobs``
table of schema version 3. Every function that writes runs inside the writer's ``BEGIN
IMMEDIATE`` transaction, so blobs, record, retention and releases commit (or vanish)
together. Releases are driven by triggers: any statement that deletes or replaces a record
holding references queues them in ``blob_releases``, and :func:`drain_releases` applies
them before the transaction commits.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Final, TypeVar, cast

from ...errors import CheckpointCorruptedError, CheckpointError
from ...format import SplitResult, record_root_refs
from ..base import BlobFetch
from ..queries import StepInfo
from ..refcounts import Rows, add_references, blob_children, missing_blob, release_references
from . import records
from .sql import _PRUNE

T = TypeVar("T")

#: Hashes per ``IN (...)`` list: well under SQLite's host-parameter limit.
_CHUNK: Final = 500
#: The database's page size (SQLite's default), for the writer's estimate of the WAL's growth.
PAGE_SIZE: Final = 4096

_UPSERT_TREE: Final = (
    "INSERT INTO checkpoints (workflow_id, step, data, refs) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (workflow_id, step) DO UPDATE SET data = excluded.data, refs = excluded.refs"
)
_ADD: Final = "UPDATE blobs SET refs = refs + ? WHERE hash = ?"
_SUBTRACT: Final = "UPDATE blobs SET refs = refs - ? WHERE hash = ?"
_INSERT: Final = "INSERT INTO blobs (hash, refs, data) VALUES (?, ?, ?)"
_DRAIN: Final = "DELETE FROM blob_releases RETURNING refs"


@dataclass(frozen=True, slots=True)
class SaveTreeOp:
    """Store a version-2 record and count its references, then keep ``keep_last`` steps.

    ``split`` holds the blobs to insert where missing; ``None`` (a version-2 record given to
    plain ``save``) counts only the referenced blobs that are stored, and the record holds
    references on those alone (the others are missing: the record reads as corrupted).
    """

    workflow_id: str
    step: int
    data: bytes
    root_refs: tuple[bytes, ...]
    split: SplitResult | None
    keep_last: int | None
    token: int | None = None
    step_info: StepInfo | None = None


def _chunks(items: Sequence[bytes]) -> Iterable[Sequence[bytes]]:
    it = iter(items)
    while chunk := list(islice(it, _CHUNK)):
        yield chunk


def _marks(n: int) -> str:
    return ",".join("?" * n)


class BlobTable:
    """:class:`~aiocheckpoint.storage.refcounts.RefCounts` over one connection's ``blobs`` table."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        #: The bytes of the blobs :meth:`upsert` inserted, and the rows it changed.
        self.inserted_bytes = self.rows = 0

    def _stored(self, hashes: Sequence[bytes]) -> set[bytes]:
        found: set[bytes] = set()
        for chunk in _chunks(hashes):
            sql = f"SELECT hash FROM blobs WHERE hash IN ({_marks(len(chunk))})"
            found.update(row[0] for row in self.conn.execute(sql, chunk).fetchall())
        return found

    def add(self, counts: Mapping[bytes, int]) -> list[bytes]:
        """Add to the stored blobs' counts; return the hashes not stored."""
        stored = self._stored(list(counts))
        self.conn.executemany(_ADD, [(counts[h], h) for h in stored])
        self.rows += len(stored)
        return [h for h in counts if h not in stored]

    def upsert(self, rows: Rows) -> Collection[bytes]:
        """Add to the stored blobs' counts, insert the missing ones; return those inserted.

        The one writer holds the lock: no blob can appear between the two statements.
        """
        missing = self.add({h: n for h, (n, _) in rows.items()})
        inserts: list[tuple[bytes, int, bytes]] = []
        for h in missing:
            n, data = rows[h]
            if data is None:
                raise missing_blob(h)
            inserts.append((h, n, data))
            self.inserted_bytes += len(data)
        large = [row for row in inserts if len(row[2]) >= _LARGE_BLOB]
        if large and hasattr(self.conn, "blobopen"):  # Python 3.11+
            inserts = [row for row in inserts if len(row[2]) < _LARGE_BLOB]
            for h, n, data in large:
                _insert_large(self.conn, h, n, data)
        self.conn.executemany(_INSERT, inserts)
        self.rows += len(missing)
        return missing

    def subtract(self, counts: Mapping[bytes, int]) -> Mapping[bytes, bytes]:
        """Subtract from the counts; delete and return the blobs that reach 0."""
        self.conn.executemany(_SUBTRACT, [(n, h) for h, n in counts.items()])
        freed: dict[bytes, bytes] = {}
        for chunk in _chunks(list(counts)):
            marks = _marks(len(chunk))
            rows = self.conn.execute(
                f"DELETE FROM blobs WHERE hash IN ({marks}) AND refs <= 0 RETURNING hash, data",
                chunk,
            ).fetchall()
            # A value stored as another type is damaged: no children can be named from it.
            freed.update((h, data if isinstance(data, bytes) else b"") for h, data in rows)
        return freed


def encode_refs(hashes: Sequence[bytes]) -> bytes | None:
    """The ``refs`` column of a record: the digest size, then the hashes (None if none)."""
    if not hashes:
        return None
    return bytes([len(hashes[0])]) + b"".join(hashes)


def _decode_refs(value: bytes) -> list[bytes]:
    return _refs_or_none(value) or []  # a damaged column: leak its blobs, free no one's


def _refs_or_none(value: bytes) -> list[bytes] | None:
    """A ``refs`` column's hashes; None if it is damaged."""
    digest = value[0] if value else 0
    if not 16 <= digest <= 32 or (len(value) - 1) % digest:
        return None
    return [value[i : i + digest] for i in range(1, len(value), digest)]


def _counted_refs(conn: sqlite3.Connection) -> Counter[bytes]:
    """Every record's references, from its ``refs`` column or, that damaged, its record.

    Raises :class:`~aiocheckpoint.CheckpointCorruptedError` when neither can be read: that
    record might name any blob, so none may be deleted.
    """
    counts: Counter[bytes] = Counter()
    rows = "SELECT workflow_id, step, refs FROM checkpoints WHERE refs IS NOT NULL"
    for wf, step, value in conn.execute(rows):
        refs = _refs_or_none(bytes(value))
        if refs is None:
            (data,) = conn.execute(
                "SELECT data FROM checkpoints WHERE workflow_id = ? AND step = ?", (wf, step)
            ).fetchone()
            try:
                refs = list(record_root_refs(bytes(data)))
            except (CheckpointError, TypeError) as exc:
                raise CheckpointCorruptedError(
                    "its blob references cannot be read, and it might name any blob: "
                    "no blob was deleted (repair or delete the checkpoint)",
                    workflow_id=wf,
                    step=step,
                ) from exc
        counts.update(refs)
    return counts


def drain_releases(conn: sqlite3.Connection) -> int:
    """Release the references of every record removed in this transaction; return blobs freed."""
    rows = conn.execute(_DRAIN).fetchall()
    if not rows:
        return 0
    released: list[bytes] = []
    for (value,) in rows:
        released.extend(_decode_refs(bytes(value)))
    return len(release_references(released, BlobTable(conn)))


def recount(conn: sqlite3.Connection) -> int:
    """Recompute every count from the records; delete unreachable blobs; return how many.

    Only damage needs it: a blob deleted or altered behind the store's back cannot name its
    children, which then keep counts nobody will release. Reads every reachable blob once, in
    the caller's write transaction. A record whose references cannot be read raises
    :class:`~aiocheckpoint.CheckpointCorruptedError` (the transaction rolls back).
    """
    freed = drain_releases(conn)
    counts = _counted_refs(conn)
    seen: set[bytes] = set()
    level = list(counts)
    while level:
        seen.update(level)
        found = read_blobs(conn, level, 2**62)
        children: list[bytes] = []
        for h, data in found.items():
            kids = blob_children(data, len(h))
            counts.update(kids)
            for kid in kids:
                if kid not in seen:
                    children.append(kid)
        level = list(dict.fromkeys(children))
    doomed: list[bytes] = []
    fixes: list[tuple[int, bytes]] = []
    for h, refs in conn.execute("SELECT hash, refs FROM blobs").fetchall():
        if h not in seen:
            doomed.append(h)
        elif refs != counts[h]:
            fixes.append((counts[h], h))
    conn.executemany("DELETE FROM blobs WHERE hash = ?", [(h,) for h in doomed])
    conn.executemany("UPDATE blobs SET refs = ? WHERE hash = ?", fixes)
    return freed + len(doomed)


def save_tree(conn: sqlite3.Connection, op: SaveTreeOp) -> int:
    """Apply ``op`` in the open transaction: fence, blobs and counts, record, retention.

    Adds come before the releases (the replaced and pruned records' references, queued by
    the triggers and applied by :func:`drain_releases` at the end of the batch), so a blob
    shared by the old and the new record never reaches 0 in between. Returns the WAL pages
    its blobs take, roughly: those of the bytes inserted, and one per blob row changed
    (the rows lie where their hashes put them: a step of a growing chat updates the counts
    of ~30 blobs on as many pages, and inserts ~1 KB).
    """
    wf = op.workflow_id
    if op.token is not None and records.current_tokens(conn, [wf]).get(wf) != op.token:
        raise records.lost(wf, op.token)  # before any write: only this caller fails
    table = BlobTable(conn)
    held: Sequence[bytes] = op.root_refs
    if op.split is not None:
        add_references([op.split], table)
    elif op.root_refs:
        missing = set(table.add(dict.fromkeys(op.root_refs, 1)))
        held = [h for h in op.root_refs if h not in missing]
    records.note_saves(conn, time.time(), [(wf, op.step, op.step_info)])
    conn.execute(_UPSERT_TREE, (wf, op.step, op.data, encode_refs(held)))
    if op.keep_last is not None:
        conn.execute(_PRUNE, (wf, wf, op.keep_last - 1))
    return table.inserted_bytes // PAGE_SIZE + table.rows


def read_blobs(
    conn: sqlite3.Connection, hashes: Sequence[bytes], max_bytes: int
) -> dict[bytes, bytes]:
    """The stored blobs among ``hashes``; one over ``max_bytes`` is left out (as missing).

    One query per ~500 hashes gives ``hash -> data`` pairs straight into the result (no
    Python per row: a resume's leaf level is ~700 rows); a large blob comes as NULL and is
    then read a slice at a time (:func:`_read_large`), in the same read transaction, as is
    a value that is not a BLOB (a row damaged by hand: its bytes then fail their hash).
    """
    found: dict[bytes, object] = {}
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        for chunk in _chunks(hashes):
            sql = (
                "SELECT hash, CASE WHEN length(data) < ? THEN data END FROM blobs "
                f"WHERE hash IN ({_marks(len(chunk))}) AND length(data) <= ?"
            )
            found.update(conn.execute(sql, [_LARGE_BLOB, *chunk, max_bytes]).fetchall())
        if set(map(type, found.values())) != {bytes}:  # a large blob, or a damaged row
            for h in [h for h, data in found.items() if type(data) is not bytes]:
                found[h] = _read_large(conn, h)
    finally:
        if own:
            conn.execute("COMMIT")
    return cast("dict[bytes, bytes]", found)  # every value is bytes now


def in_one_read(conn: sqlite3.Connection, fn: Callable[[BlobFetch], T], max_bytes: int) -> T:
    """``fn(fetch)``, every ``fetch`` answered by :func:`read_blobs` in one read transaction.

    A tree is read from one snapshot of the database, level by level, without leaving the
    calling thread.
    """
    conn.execute("BEGIN")
    try:
        return fn(lambda hashes: read_blobs(conn, list(hashes), max_bytes))
    finally:
        conn.execute("COMMIT")


#: Blobs from this size on are read in slices: sqlite3 copies a column's value into Python
#: holding the GIL (~20-60 ms for 50 MB here), but releases it around each blob read.
_LARGE_BLOB: Final = 1024 * 1024


def _insert_large(conn: sqlite3.Connection, h: bytes, n: int, data: bytes) -> None:
    """Insert a large blob as zeros, then write it ``_LARGE_BLOB`` bytes at a time.

    sqlite3 binds a parameter holding the GIL while SQLite copies it; a blob write
    releases it. In the writer's transaction, like any insert.
    """
    cursor = conn.execute(_INSERT_ZEROS, (h, n, len(data)))
    view = memoryview(data)
    with conn.blobopen("blobs", "data", cursor.lastrowid) as blob:  # type: ignore[attr-defined]
        for start in range(0, len(data), _LARGE_BLOB):
            blob.write(view[start : start + _LARGE_BLOB])


_INSERT_ZEROS: Final = "INSERT INTO blobs (hash, refs, data) VALUES (?, ?, zeroblob(?))"


def _read_large(conn: sqlite3.Connection, h: bytes) -> bytes:
    """The data of blob ``h``, read ``_LARGE_BLOB`` bytes at a time (Python 3.11+)."""
    blobopen = getattr(conn, "blobopen", None)
    if blobopen is None:  # Python 3.10: in one piece
        row = conn.execute("SELECT data FROM blobs WHERE hash = ?", (h,)).fetchone()
        data: bytes = row[0]
        return data
    (rowid,) = conn.execute("SELECT rowid FROM blobs WHERE hash = ?", (h,)).fetchone()
    with blobopen("blobs", "data", rowid, readonly=True) as blob:
        return b"".join(list(iter(functools.partial(blob.read, _LARGE_BLOB), b"")))
