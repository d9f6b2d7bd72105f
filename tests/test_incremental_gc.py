"""The reference-counting scheme of docs/incremental.md §8, on the SQLite backend.

A random sequence of saves, replacements, deletes, ``keep_last`` retention and version-1
overwrites (``tests/_blob_refs.py``), checked after every operation against the ground
truth read from the file: every record decodes, no blob is leaked or missing, every count
is exact.
"""

from pathlib import Path
from typing import Any

from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests._blob_refs import PARAMS, random_history
from tests._sqlite_blob_check import check_refcounts, sql


async def test_reference_counts_free_exactly_the_unreferenced_blobs(tmp_path: Path) -> None:
    """Saves, replacements, deletes and keep_last leave no leaked and no missing blob."""
    path = tmp_path / "refs.db"
    store = SQLiteCheckpointStorage(path, blob_params=PARAMS)
    most_blobs = 0

    async def check() -> dict[tuple[str, int], Any]:
        nonlocal most_blobs
        most_blobs = max(most_blobs, _blob_count(path))
        return check_refcounts(path)

    await random_history(store, check)
    await store.close()
    assert most_blobs > 20
    assert _blob_count(path) == 0


def _blob_count(path: Path) -> int:
    return int(sql(path, "SELECT count(*) FROM blobs")[0][0])
