from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.testing import (
    BatchRetentionConformance,
    BlobReadsConformance,
    BlobRetentionConformance,
    BlobStorageConformance,
    EffectListingConformance,
    EffectStorageConformance,
    EventStorageConformance,
    PersistentEffectConformance,
    PersistentStorageConformance,
    SpaceConformance,
    StorageConformance,
    WorkflowControlConformance,
    WorkflowEffectJournalConformance,
    WorkflowRetentionConformance,
    WorkflowStorageConformance,
)


class TestSQLiteConformance(
    StorageConformance,
    PersistentStorageConformance,
    WorkflowStorageConformance,
    EffectListingConformance,
    EffectStorageConformance,
    WorkflowEffectJournalConformance,
    PersistentEffectConformance,
    BatchRetentionConformance,
    WorkflowRetentionConformance,
    WorkflowControlConformance,
    EventStorageConformance,
    SpaceConformance,
):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[SQLiteCheckpointStorage]:
        store = SQLiteCheckpointStorage(tmp_path / "checkpoints.db")
        yield store
        await store.close()

    @pytest.fixture
    async def reopen(
        self, tmp_path: Path
    ) -> AsyncIterator[Callable[[], Awaitable[SQLiteCheckpointStorage]]]:
        opened: list[SQLiteCheckpointStorage] = []

        async def open_again() -> SQLiteCheckpointStorage:
            store = SQLiteCheckpointStorage(tmp_path / "checkpoints.db")
            opened.append(store)
            return store

        yield open_again
        for store in opened:
            await store.close()


class TestSQLiteBlobConformance(
    BlobStorageConformance, BlobReadsConformance, BlobRetentionConformance
):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[SQLiteCheckpointStorage]:
        store = SQLiteCheckpointStorage(tmp_path / "checkpoints.db")
        yield store
        await store.close()
