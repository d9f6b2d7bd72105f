from collections.abc import AsyncIterator

import pytest

from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.testing import (
    BatchRetentionConformance,
    BlobRetentionConformance,
    BlobStorageConformance,
    EffectListingConformance,
    EffectStorageConformance,
    EventStorageConformance,
    PersistentEffectConformance,
    PersistentStorageConformance,
    Reopen,
    SpaceConformance,
    StorageConformance,
    WorkflowControlConformance,
    WorkflowEffectJournalConformance,
    WorkflowRetentionConformance,
    WorkflowStorageConformance,
)
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]


class TestPostgresConformance(
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
    # An unfenced save finds the record before a racing delete takes it (its INSERT ... ON
    # CONFLICT DO NOTHING locks nothing): its checkpoint stays, its record may not.
    racing_save_keeps_record = False

    @pytest.fixture
    async def storage(self, pg_schema: str) -> AsyncIterator[PostgresCheckpointStorage]:
        store = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=4)
        yield store
        await store.close()

    @pytest.fixture
    async def reopen(self, pg_schema: str) -> AsyncIterator[Reopen]:
        opened: list[PostgresCheckpointStorage] = []

        async def again() -> PostgresCheckpointStorage:
            store = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=4)
            opened.append(store)
            return store

        yield again
        for store in opened:
            await store.close()


class TestPostgresBlobConformance(BlobStorageConformance, BlobRetentionConformance):
    @pytest.fixture
    async def storage(self, pg_schema: str) -> AsyncIterator[PostgresCheckpointStorage]:
        store = PostgresCheckpointStorage(DSN, schema=pg_schema, max_size=4)
        yield store
        await store.close()
