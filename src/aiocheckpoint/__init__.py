"""aiocheckpoint: durable, asyncio-native checkpoints for agent workflows.

Save a workflow's progress and resume it after a crash, without blocking the event loop.
This module is the map of the public API: everything in ``__all__`` is supported.
"""

from typing import TYPE_CHECKING, Any

from .codec import (
    EffectRecord,
    EffectState,
    KeyProvider,
    Keyring,
    Reconciled,
    TaggedValue,
    TypeRegistry,
)
from .errors import (
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointSerializationError,
    CheckpointTypeError,
    DecryptionError,
    EffectError,
    EffectInDoubtError,
    EffectOrderError,
    EncryptionError,
    InvalidArgumentError,
    InvalidStepError,
    InvalidWorkflowIdError,
    LeaseError,
    LeaseHeldError,
    LeaseLostError,
    PlaintextRecordError,
    StorageBackendError,
    StorageClosedError,
    StorageFullError,
    StoragePermissionError,
    StorageSchemaError,
    StorageTimeoutError,
    TypeVersionError,
    UnknownKeyError,
    UnknownTypeError,
    UnsupportedOperationError,
    WorkflowBusyError,
    WorkflowCancelledError,
    WorkflowExistsError,
    WorkflowTransferError,
)
from .history import WorkflowEvent
from .leases import Lease, Page, RetryPolicy, WorkflowRecord, WorkflowStatus
from .manager import CheckpointManager, ResumePoint
from .models import AgentStatus, Checkpoint, ExecutionMetrics, StateSnapshot, StateVersion
from .retention import RetentionPolicy, SweepReport
from .state import SharedState
from .storage import (
    BlobCheckpointStorage,
    BlobReads,
    CheckpointStorage,
    EffectListingStorage,
    EffectStorage,
    InMemoryCheckpointStorage,
    StoredCheckpoint,
    StoredEffect,
    WorkflowStorage,
)
from .storage.events import EventKind, EventStorage, StoredEvent
from .urls import open_storage
from .workflow import ResumableWorkflow

if TYPE_CHECKING:
    from .storage.file import FileCheckpointStorage
    from .storage.postgres import PostgresCheckpointStorage
    from .storage.sqlite import SQLiteCheckpointStorage

__version__ = "0.1.0"

# Backends are imported on first use, so that importing aiocheckpoint stays light and never
# pulls in a platform module (fcntl) or an optional driver (asyncpg) it does not need.
_BACKENDS = {
    "FileCheckpointStorage": "aiocheckpoint.storage.file",
    "PostgresCheckpointStorage": "aiocheckpoint.storage.postgres",
    "SQLiteCheckpointStorage": "aiocheckpoint.storage.sqlite",
}


def __getattr__(name: str) -> Any:
    module = _BACKENDS.get(name)
    if module is None:
        raise AttributeError(f"module 'aiocheckpoint' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AgentStatus",
    "BlobCheckpointStorage",
    "BlobReads",
    "Checkpoint",
    "CheckpointCorruptedError",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CheckpointSerializationError",
    "CheckpointStorage",
    "CheckpointTypeError",
    "DecryptionError",
    "EffectError",
    "EffectInDoubtError",
    "EffectListingStorage",
    "EffectOrderError",
    "EffectRecord",
    "EffectState",
    "EffectStorage",
    "EncryptionError",
    "EventKind",
    "EventStorage",
    "ExecutionMetrics",
    "FileCheckpointStorage",
    "InMemoryCheckpointStorage",
    "InvalidArgumentError",
    "InvalidStepError",
    "InvalidWorkflowIdError",
    "KeyProvider",
    "Keyring",
    "Lease",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "Page",
    "PlaintextRecordError",
    "PostgresCheckpointStorage",
    "Reconciled",
    "ResumableWorkflow",
    "ResumePoint",
    "RetentionPolicy",
    "RetryPolicy",
    "SQLiteCheckpointStorage",
    "SharedState",
    "StateSnapshot",
    "StateVersion",
    "StorageBackendError",
    "StorageClosedError",
    "StorageFullError",
    "StoragePermissionError",
    "StorageSchemaError",
    "StorageTimeoutError",
    "StoredCheckpoint",
    "StoredEffect",
    "StoredEvent",
    "SweepReport",
    "TaggedValue",
    "TypeRegistry",
    "TypeVersionError",
    "UnknownKeyError",
    "UnknownTypeError",
    "UnsupportedOperationError",
    "WorkflowBusyError",
    "WorkflowCancelledError",
    "WorkflowEvent",
    "WorkflowExistsError",
    "WorkflowRecord",
    "WorkflowStatus",
    "WorkflowStorage",
    "WorkflowTransferError",
    "__version__",
    "open_storage",
]
