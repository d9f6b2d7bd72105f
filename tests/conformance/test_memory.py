from collections.abc import AsyncIterator

import pytest

from aiocheckpoint import InMemoryCheckpointStorage
from aiocheckpoint.testing import (
    EffectStorageConformance,
    RetentionConformance,
    StorageConformance,
    WorkflowRetentionConformance,
    WorkflowStorageConformance,
)


class TestInMemoryConformance(
    StorageConformance,
    WorkflowStorageConformance,
    EffectStorageConformance,
    RetentionConformance,
    WorkflowRetentionConformance,
):
    @pytest.fixture
    async def storage(self) -> AsyncIterator[InMemoryCheckpointStorage]:
        store = InMemoryCheckpointStorage()
        yield store
        await store.close()
