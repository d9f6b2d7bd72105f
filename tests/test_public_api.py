import inspect
import re
from pathlib import Path

import aiocheckpoint

DOCS = Path(__file__).resolve().parent.parent / "docs"

EXPECTED = {
    "AgentStatus",
    "BlobCheckpointStorage",
    "Checkpoint",
    "CheckpointCorruptedError",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CheckpointSerializationError",
    "CheckpointStorage",
    "EffectError",
    "EffectInDoubtError",
    "EffectOrderError",
    "EffectRecord",
    "EffectState",
    "EffectStorage",
    "WorkflowEvent",
    "StoredEvent",
    "EventStorage",
    "EventKind",
    "ExecutionMetrics",
    "FileCheckpointStorage",
    "InMemoryCheckpointStorage",
    "InvalidArgumentError",
    "InvalidStepError",
    "InvalidWorkflowIdError",
    "Lease",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "PostgresCheckpointStorage",
    "Reconciled",
    "ResumableWorkflow",
    "ResumePoint",
    "SQLiteCheckpointStorage",
    "SharedState",
    "StateSnapshot",
    "StateVersion",
    "StorageBackendError",
    "StorageClosedError",
    "StorageFullError",
    "StorageSchemaError",
    "StorageTimeoutError",
    "StoredCheckpoint",
    "StoredEffect",
    "UnsupportedOperationError",
    "WorkflowBusyError",
    "WorkflowCancelledError",
    "WorkflowExistsError",
    "WorkflowTransferError",
    "WorkflowRecord",
    "Page",
    "RetryPolicy",
    "RetentionPolicy",
    "SweepReport",
    "WorkflowStatus",
    "WorkflowStorage",
    "__version__",
    "open_storage",
    "CheckpointTypeError",
    "TaggedValue",
    "TypeRegistry",
    "TypeVersionError",
    "UnknownTypeError",
    "DecryptionError",
    "EncryptionError",
    "KeyProvider",
    "Keyring",
    "PlaintextRecordError",
    "UnknownKeyError",
    "StoragePermissionError",
    "BlobReads",
    "EffectListingStorage",
}


def test_all_lists_exactly_the_public_names() -> None:
    """__all__ is the map of the API: exactly the expected names, each importable."""
    assert set(aiocheckpoint.__all__) == EXPECTED
    assert len(aiocheckpoint.__all__) == len(EXPECTED)
    for name in aiocheckpoint.__all__:
        assert hasattr(aiocheckpoint, name), name


def test_all_is_sorted() -> None:
    """__all__ reads in order, so that a name is found (and a missing one seen) at a glance."""
    assert aiocheckpoint.__all__ == sorted(aiocheckpoint.__all__)


def _documented_names() -> set[str]:
    """Names the docs use as ``aiocheckpoint.X`` (X a class, error or function)."""
    names: set[str] = set()
    for page in DOCS.rglob("*.md"):
        names.update(re.findall(r"\baiocheckpoint\.([A-Za-z_]\w*)\b(?!\.)", page.read_text()))
    return names


def test_every_name_the_docs_use_at_the_top_is_exported() -> None:
    """A class or error written ``aiocheckpoint.X`` in the docs is in __all__."""
    documented = {name for name in _documented_names() if name[0].isupper()}
    assert {"CheckpointManager", "StoragePermissionError", "BlobReads"} <= documented
    assert documented <= set(aiocheckpoint.__all__)


def test_public_names_have_docstrings() -> None:
    """Every public class and function, and each public method of the classes, is documented."""
    for name in aiocheckpoint.__all__:
        obj = getattr(aiocheckpoint, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not callable(member):
                    continue
                assert inspect.getdoc(member), f"{name}.{attr}"


def test_error_tree() -> None:
    """Every library error derives from CheckpointError; argument errors are ValueErrors."""
    for name in aiocheckpoint.__all__:
        obj = getattr(aiocheckpoint, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, aiocheckpoint.CheckpointError), name
    assert issubclass(aiocheckpoint.InvalidWorkflowIdError, ValueError)
    assert issubclass(aiocheckpoint.InvalidStepError, ValueError)
    assert issubclass(aiocheckpoint.CheckpointNotFoundError, LookupError)


def test_importing_does_not_import_optional_drivers() -> None:
    """Importing the package never imports asyncpg (an optional extra)."""
    import subprocess
    import sys

    code = "import sys, aiocheckpoint; print('asyncpg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
