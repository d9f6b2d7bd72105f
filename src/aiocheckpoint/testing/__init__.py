"""The storage conformance suite, for the bundled backends and third-party ones alike.

Subclass :class:`StorageConformance` in a pytest module and provide an async fixture named
``storage`` that yields a fresh, empty, open storage; every test then runs against it::

    import pytest
    from aiocheckpoint.testing import StorageConformance

    class TestMyBackend(StorageConformance):
        @pytest.fixture
        async def storage(self, tmp_path):
            store = MyStorage(tmp_path)
            yield store
            await store.close()

Durable backends also subclass :class:`PersistentStorageConformance` and provide
``reopen``, an async fixture returning a coroutine function that opens a *new* storage
object on the same location. Backends with workflow records and leases also subclass
:class:`WorkflowStorageConformance`; backends that keep content-addressed blobs
(:class:`~aiocheckpoint.storage.base.BlobCheckpointStorage`) subclass
:class:`BlobStorageConformance`, whose ``storage`` fixture should make
``collect_garbage()`` free unreferenced blobs at once (e.g. a near-zero grace period), and
those that read trees in their own thread (``BlobReads``) :class:`BlobReadsConformance`.
Backends with an effect journal (:class:`~aiocheckpoint.storage.base.EffectStorage`)
subclass :class:`EffectStorageConformance` and :class:`EffectJournalConformance` (and, if
durable, :class:`PersistentEffectConformance`); those whose journal lists itself
(:class:`~aiocheckpoint.storage.base.EffectListingStorage`, what ``copy`` and ``export``
need) :class:`EffectListingConformance`. Backends that keep event histories
(:class:`~aiocheckpoint.storage.events.EventStorage`) subclass
:class:`EventStorageConformance`. Sweeps (``docs/retention.md``) are checked by
:class:`RetentionConformance` (every backend), :class:`WorkflowRetentionConformance`
(workflow TTLs, with records and effects) and :class:`BlobRetentionConformance` (blobs);
stores that give space back (``reclaim_space``, ``compact``) by :class:`SpaceConformance`.
The suite needs pytest and pytest-asyncio. Each protocol's suites live in their own
module of this package, and the package exports them all, so that a backend's tests import
everything from one place.
"""

from __future__ import annotations

from ._support import TRICKY_IDS as TRICKY_IDS
from ._support import Reopen as Reopen
from .blobs import BlobReadsConformance, BlobStorageConformance
from .control import WorkflowControlConformance
from .effects import (
    EffectJournalConformance,
    EffectListingConformance,
    EffectStorageConformance,
    PersistentEffectConformance,
    WorkflowEffectJournalConformance,
)
from .events import EventStorageConformance
from .retention import (
    BatchRetentionConformance,
    BlobRetentionConformance,
    RetentionConformance,
    WorkflowRetentionConformance,
)
from .space import SpaceConformance
from .storage import PersistentStorageConformance, StorageConformance
from .workflows import WorkflowLifecycleConformance, WorkflowStorageConformance

__all__ = [
    "BatchRetentionConformance",
    "BlobReadsConformance",
    "BlobRetentionConformance",
    "BlobStorageConformance",
    "EffectJournalConformance",
    "EffectListingConformance",
    "EffectStorageConformance",
    "EventStorageConformance",
    "PersistentEffectConformance",
    "PersistentStorageConformance",
    "RetentionConformance",
    "SpaceConformance",
    "StorageConformance",
    "WorkflowControlConformance",
    "WorkflowEffectJournalConformance",
    "WorkflowLifecycleConformance",
    "WorkflowRetentionConformance",
    "WorkflowStorageConformance",
]
