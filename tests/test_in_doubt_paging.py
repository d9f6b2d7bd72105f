"""``InDoubtPagingStorage``: the workflows in doubt a page at a time (SQLite, PostgreSQL).

Pages follow one another without a gap or a repeat, in the order ``in_doubt_workflows``
lists them; a settled effect leaves the listing; bad arguments are typed errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiocheckpoint import InvalidArgumentError
from aiocheckpoint.storage.base import InDoubtPagingStorage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

IDS = ["a", "b/ü", "b\u00e9", "c 'q'", "z", "\u4e2d"]


@pytest.fixture(params=["sqlite", "postgres"])
async def storage(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[InDoubtPagingStorage]:
    if request.param == "sqlite":
        store: object = SQLiteCheckpointStorage(tmp_path / "db.sqlite")
    else:
        store = PostgresCheckpointStorage(DSN, schema=pg_schema)
    assert isinstance(store, InDoubtPagingStorage)
    try:
        yield store
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_pages_follow_one_another_in_the_listing_order(
    storage: InDoubtPagingStorage,
) -> None:
    for n, workflow_id in enumerate(IDS):
        await storage.put_effect(workflow_id, n, "k", b"intent", in_doubt=True)
        await storage.put_effect(workflow_id, n, "j", b"intent", in_doubt=True)
    await storage.put_effect("settled", 0, "k", b"done", in_doubt=False)
    whole = await storage.in_doubt_workflows()
    assert sorted(whole) == sorted(IDS)
    for size in (1, 2, 4, 100):
        seen: list[str] = []
        after = None
        while page := await storage.in_doubt_page(after, size):
            assert len(page) <= size
            seen += page
            after = page[-1]
        assert seen == whole
    await storage.put_effect("z", 4, "k", b"done", in_doubt=False)
    await storage.put_effect("z", 4, "j", b"done", in_doubt=False)
    assert "z" not in await storage.in_doubt_page(None, 100)


@pytest.mark.parametrize(("after", "limit"), [(None, 0), (None, -1), (None, True), ("", 5)])
async def test_bad_arguments_are_typed_errors(
    storage: InDoubtPagingStorage, after: str | None, limit: int
) -> None:
    with pytest.raises(InvalidArgumentError):
        await storage.in_doubt_page(after, limit)
