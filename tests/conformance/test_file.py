from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.testing import (
    BlobReadsConformance,
    BlobRetentionConformance,
    BlobStorageConformance,
    EffectJournalConformance,
    EffectListingConformance,
    EffectStorageConformance,
    PersistentEffectConformance,
    PersistentStorageConformance,
    RetentionConformance,
    StorageConformance,
)


class TestFileConformance(
    StorageConformance,
    PersistentStorageConformance,
    EffectListingConformance,
    EffectStorageConformance,
    EffectJournalConformance,
    PersistentEffectConformance,
    RetentionConformance,
):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[FileCheckpointStorage]:
        store = FileCheckpointStorage(tmp_path / "store")
        yield store
        await store.close()

    @pytest.fixture
    async def reopen(self, tmp_path: Path) -> Callable[[], Awaitable[FileCheckpointStorage]]:
        async def _reopen() -> FileCheckpointStorage:
            return FileCheckpointStorage(tmp_path / "store")

        return _reopen


class TestFileBlobConformance(
    BlobStorageConformance, BlobReadsConformance, BlobRetentionConformance
):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[FileCheckpointStorage]:
        store = FileCheckpointStorage(tmp_path / "store", blob_grace_seconds=1e-9)
        yield store
        await store.close()
