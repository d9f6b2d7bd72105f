from collections.abc import AsyncIterator

import pytest

from aiocheckpoint import InMemoryCheckpointStorage
from aiocheckpoint.testing import (
    BlobRetentionConformance,
    BlobStorageConformance,
    EffectListingConformance,
    EffectStorageConformance,
    EventStorageConformance,
    RetentionConformance,
    StorageConformance,
    WorkflowControlConformance,
    WorkflowEffectJournalConformance,
    WorkflowRetentionConformance,
    WorkflowStorageConformance,
)


class TestInMemoryConformance(
    StorageConformance,
    WorkflowStorageConformance,
    EffectListingConformance,
    EffectStorageConformance,
    WorkflowEffectJournalConformance,
    RetentionConformance,
    WorkflowRetentionConformance,
    WorkflowControlConformance,
    EventStorageConformance,
):
    @pytest.fixture
    async def storage(self) -> AsyncIterator[InMemoryCheckpointStorage]:
        store = InMemoryCheckpointStorage()
        yield store
        await store.close()


class TestInMemoryBlobConformance(BlobStorageConformance, BlobRetentionConformance):
    @pytest.fixture
    async def storage(self) -> AsyncIterator[InMemoryCheckpointStorage]:
        store = InMemoryCheckpointStorage()
        yield store
        await store.close()
