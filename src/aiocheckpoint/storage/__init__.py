"""Storage backends and the protocol they implement."""

from .base import BaseStorage, CheckpointStorage, StoredCheckpoint, WorkflowStorage
from .memory import InMemoryCheckpointStorage

__all__ = [
    "BaseStorage",
    "CheckpointStorage",
    "InMemoryCheckpointStorage",
    "StoredCheckpoint",
    "WorkflowStorage",
]
