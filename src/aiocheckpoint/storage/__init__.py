"""Storage backends and the protocol they implement."""

from .base import (
    BaseStorage,
    BlobCheckpointStorage,
    CheckpointStorage,
    StoredCheckpoint,
    WorkflowStorage,
)
from .memory import InMemoryCheckpointStorage

__all__ = [
    "BaseStorage",
    "BlobCheckpointStorage",
    "CheckpointStorage",
    "InMemoryCheckpointStorage",
    "StoredCheckpoint",
    "WorkflowStorage",
]
