"""Storage backends and the protocol they implement."""

from .base import (
    BaseStorage,
    BlobCheckpointStorage,
    BlobReads,
    CheckpointStorage,
    EffectListingStorage,
    EffectStorage,
    StoredCheckpoint,
    StoredEffect,
    WorkflowStorage,
)
from .memory import InMemoryCheckpointStorage

__all__ = [
    "BaseStorage",
    "BlobCheckpointStorage",
    "BlobReads",
    "CheckpointStorage",
    "EffectListingStorage",
    "EffectStorage",
    "InMemoryCheckpointStorage",
    "StoredCheckpoint",
    "StoredEffect",
    "WorkflowStorage",
]
