"""Storage backends and the protocol they implement.

A backend checks a save's arguments with :func:`check_save`, the gate every bundled backend
uses (the conformance suite holds third-party ones to the same rules).
"""

from .._validation import check_save
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
    "check_save",
]
