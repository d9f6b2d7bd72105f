"""Exceptions raised by aiocheckpoint.

Every error the library raises on purpose derives from :class:`CheckpointError`::

    CheckpointError
    ├── CheckpointNotFoundError       a requested step does not exist
    ├── CheckpointCorruptedError      stored bytes fail to decode or verify
    │   └── DecryptionError           an encrypted record fails authentication
    │       └── PlaintextRecordError  plaintext where an encrypted manager needs ciphertext
    ├── CheckpointSerializationError  a state that cannot be stored (nothing is written)
    ├── CheckpointTypeError           a stored typed value this registry cannot read
    │   ├── UnknownTypeError          its type name is not registered
    │   └── TypeVersionError          written by a newer version, or no upgrade from its own
    ├── InvalidArgumentError          a bad argument (also a ValueError)
    │   ├── InvalidWorkflowIdError    not a non-empty str of <= 255 UTF-8 bytes without NUL
    │   ├── InvalidStepError          not an int in [0, 2**63)
    │   ├── WorkflowExistsError       a new workflow's id is taken (fork_workflow)
    │   └── CheckpointIdCollisionError  two LangGraph checkpoint ids would share a step
    ├── StorageClosedError            the storage (or manager) was used after close()
    ├── StorageSchemaError            a store written by a newer, unknown version
    ├── StorageBackendError           the backend failed (OSError, sqlite3.Error, ...)
    │   ├── StoragePermissionError    the store's files belong to another user or are shared
    │   ├── StorageTimeoutError       an operation outlasted its timeout (the store's budget)
    │   └── StorageFullError          the disk (or the database server's disk) is full
    ├── UnsupportedOperationError     the backend lacks a capability (also NotImplementedError)
    ├── WorkflowBusyError             a second driver for a workflow this manager drives
    ├── WorkflowCancelledError        the workflow was cancelled: its driver stops
    ├── WorkflowTransferError         copy/export/import cannot carry a workflow whole
    ├── EncryptionError               this process cannot read or seal (no keys, no cryptography)
    │   └── UnknownKeyError           sealed under a key id the keyring does not hold
    ├── EffectError
    │   ├── EffectInDoubtError        an effect's call may or may not have happened
    │   └── EffectOrderError          a step's effects no longer match its journal
    └── LeaseError
        ├── LeaseHeldError            another live owner holds the workflow's lease
        └── LeaseLostError            the lease expired or was taken over (fencing)

A record this process cannot read (an :class:`EncryptionError`, such as an
:class:`UnknownKeyError`) is not a :class:`CheckpointCorruptedError`: what skips damaged
records (resuming from an older checkpoint, a sweep, ``verify``) never skips one of those,
whose bytes may be sound. Resuming past it would run completed steps again.

Driver and OS errors are translated at the backend boundary; the original exception is
always chained as ``__cause__``.
"""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "CheckpointCorruptedError",
    "CheckpointIdCollisionError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointSerializationError",
    "CheckpointTypeError",
    "DecryptionError",
    "EffectError",
    "EffectInDoubtError",
    "EffectOrderError",
    "EncryptionError",
    "InvalidArgumentError",
    "InvalidStepError",
    "InvalidWorkflowIdError",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "PlaintextRecordError",
    "StorageBackendError",
    "StorageClosedError",
    "StorageFullError",
    "StoragePermissionError",
    "StorageSchemaError",
    "StorageTimeoutError",
    "TypeVersionError",
    "UnknownKeyError",
    "UnknownTypeError",
    "UnsupportedOperationError",
    "WorkflowBusyError",
    "WorkflowCancelledError",
    "WorkflowExistsError",
    "WorkflowTransferError",
]


class CheckpointError(Exception):
    """Base class of every error raised by aiocheckpoint."""


class CheckpointNotFoundError(CheckpointError, LookupError):
    """The requested checkpoint does not exist."""

    def __init__(self, workflow_id: str, step: int | None = None) -> None:
        self.workflow_id = workflow_id
        self.step = step
        where = f"step {step} of " if step is not None else ""
        super().__init__(f"no checkpoint for {where}workflow {workflow_id!r}")


class CheckpointCorruptedError(CheckpointError):
    """Stored bytes failed to decode or did not match their checksum."""

    def __init__(
        self, reason: str, *, workflow_id: str | None = None, step: int | None = None
    ) -> None:
        self.reason = reason
        self.workflow_id = workflow_id
        self.step = step
        where = ""
        if workflow_id is not None:
            where = f"workflow {workflow_id!r}"
            if step is not None:
                where += f" step {step}"
            where += ": "
        super().__init__(f"corrupted checkpoint: {where}{reason}")


class DecryptionError(CheckpointCorruptedError):
    """An encrypted record or effect failed authentication (``docs/encryption.md``).

    Its bytes were changed, it was moved from another workflow, step or key, or it was
    sealed under a key other than the one its key id names (a key the keyring holds).
    Resuming skips it, as it skips any corrupted checkpoint.
    """


class PlaintextRecordError(DecryptionError):
    """A plaintext record where an encrypted manager requires ciphertext (fail closed).

    A manager made with ``allow_plaintext=True`` reads such records (while migrating).
    """


class EncryptionError(CheckpointError):
    """Encryption cannot run: an encrypted record read without keys, or no ``cryptography``.

    Not a corruption: the record may be sound, this process lacks what reads it. Nothing
    that skips corrupted records skips it.
    """


class UnknownKeyError(EncryptionError):
    """A record is sealed under a key id that the keyring (or key provider) does not hold.

    Not a corruption: the record may be sound and readable by a process with that key (a
    runner not yet given the new key of a rolling rotation, say). Resuming raises it and
    writes nothing, rather than resume from an older checkpoint and run a completed step
    again; a step whose effect record it cannot read raises it instead of calling the
    effect again. ``key_id`` names the key, ``workflow_id`` and ``step`` the record (None
    where unknown), ``effect_key`` the effect when the record is an effect record.

    A :class:`~aiocheckpoint.KeyProvider` may raise it with a message alone: the reader
    raises its own, naming the key id it asked for.
    """

    def __init__(
        self,
        key_id: str,
        *,
        workflow_id: str | None = None,
        step: int | None = None,
        effect_key: str | None = None,
    ) -> None:
        self.key_id = key_id
        self.workflow_id = workflow_id
        self.step = step
        self.effect_key = effect_key
        what = "record" if effect_key is None else f"effect {effect_key!r}"
        where = ""
        if workflow_id is not None:
            where = f"workflow {workflow_id!r}" + (f" step {step}" if step is not None else "")
            where += f": {what} "
        elif effect_key is not None:
            where = f"{what} "
        super().__init__(f"{where}sealed under key {key_id!r}, which is not in the keyring")

    def located(
        self, workflow_id: str, step: int, effect_key: str | None = None
    ) -> UnknownKeyError:
        """The same error naming the record it was raised for."""
        return UnknownKeyError(
            self.key_id, workflow_id=workflow_id, step=step, effect_key=effect_key
        )


class CheckpointSerializationError(CheckpointError, TypeError):
    """A state (or metadata) value cannot be stored faithfully.

    ``path`` names the offending value, for example ``state.plan.items[3]``.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot store {path}: {reason}")


class CheckpointTypeError(CheckpointError, TypeError):
    """A stored typed value cannot be read back with the manager's type registry.

    ``path`` names the value (``state.messages[3]``), ``type_name`` its registered name.
    Nothing is constructed; read with ``raw=True`` to get it as a
    :class:`~aiocheckpoint.TaggedValue` instead.
    """

    def __init__(self, path: str, type_name: str, reason: str) -> None:
        self.path = path
        self.type_name = type_name
        self.reason = reason
        super().__init__(f"cannot read {path} (type {type_name!r}): {reason}")


class UnknownTypeError(CheckpointTypeError):
    """A stored value names a type that is not registered (nothing is imported)."""


class TypeVersionError(CheckpointTypeError):
    """A stored value's type version is newer than the registry's, or cannot be upgraded."""


class InvalidArgumentError(CheckpointError, ValueError):
    """An argument is out of its documented range (a status, a limit, an agent id, ...)."""


class InvalidWorkflowIdError(InvalidArgumentError):
    """A workflow id is not a non-empty str of at most 255 UTF-8 bytes without NUL."""


class InvalidStepError(InvalidArgumentError):
    """A step is not an int in ``[0, 2**63)`` (``bool`` is refused)."""


class WorkflowExistsError(InvalidArgumentError):
    """A workflow that must be new (the target of a fork) already exists.

    It has checkpoints, a workflow record or effect records; ``holds`` names what was found,
    when known.
    """

    def __init__(self, workflow_id: str, holds: str | None = None) -> None:
        self.workflow_id = workflow_id
        self.holds = holds
        found = "" if holds is None else f" (it has {holds})"
        super().__init__(f"workflow {workflow_id!r} already exists{found}")


class CheckpointIdCollisionError(InvalidArgumentError):
    """Two checkpoint ids of a LangGraph thread namespace map to one step.

    The LangGraph saver stores a checkpoint at a step taken from its id's timestamp; ids
    with the same timestamp (differing only in the UUID's version digit or its last 64
    bits) would share it. The one the saver met second is refused: nothing is written.
    """

    def __init__(self, workflow_id: str, checkpoint_id: str, stored_id: str) -> None:
        self.workflow_id = workflow_id
        self.checkpoint_id = checkpoint_id
        self.stored_id = stored_id
        super().__init__(
            f"checkpoint id {checkpoint_id!r} has the timestamp of {stored_id!r}, stored in "
            f"{workflow_id!r}: the two would share one step; nothing was written"
        )


class WorkflowBusyError(CheckpointError):
    """A ``ResumableWorkflow`` block already drives this workflow on this manager.

    Two drivers would run every step twice; the second is refused while the first is active.
    """

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id
        super().__init__(
            f"workflow {workflow_id!r} is already driven by an active ResumableWorkflow "
            "block on this manager"
        )


class WorkflowCancelledError(CheckpointError):
    """The workflow was cancelled (:meth:`~aiocheckpoint.CheckpointManager.cancel_workflow`).

    Raised by the driver (``ResumableWorkflow``) at its next step boundary or ``wf.effect``
    call after the cancel is stored, and on entry to a cancelled workflow. ``reason`` is
    the reason given to the cancel (None if none).
    """

    def __init__(self, workflow_id: str, reason: str | None = None) -> None:
        self.workflow_id = workflow_id
        self.reason = reason
        why = f": {reason}" if reason else ""
        super().__init__(f"workflow {workflow_id!r} was cancelled{why}")


class WorkflowTransferError(CheckpointError):
    """``copy``, ``export`` or ``import`` cannot carry a workflow whole: nothing is written.

    A workflow travels with its effect journal (``docs/effects.md``): one of its effect
    records that does not verify, cannot be read without keys, differs at the destination
    or has nowhere to go refuses the whole workflow, so that no store ends up with its
    checkpoints but without the record of a call already made. ``workflow_id`` names it,
    ``reason`` says why.
    """

    def __init__(self, workflow_id: str, reason: str) -> None:
        self.workflow_id = workflow_id
        self.reason = reason
        super().__init__(f"workflow {workflow_id!r} not carried: {reason}")


class StorageClosedError(CheckpointError):
    """The storage or manager was used after it was closed."""


class StorageSchemaError(CheckpointError):
    """The store was written by a newer version of aiocheckpoint, or has an unknown schema."""


class StorageBackendError(CheckpointError):
    """The storage backend failed; the driver's or OS's exception is the ``__cause__``."""


class StoragePermissionError(StorageBackendError):
    """The store's files are not private to the current user; the store was not opened.

    A file owned by another user, or readable or writable by group or others, may have been
    planted to feed this process forged state or to read what it writes. ``path`` names the
    file. Backends that raise it take an explicit opt-out for deliberately shared setups.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"refusing to open {path!r}: {reason}")


class StorageTimeoutError(StorageBackendError):
    """An operation did not finish within its timeout; the message names both and the wait.

    For PostgreSQL the timeout is ``command_timeout``: the whole time the caller waits,
    retries and the wait for a pooled connection included.
    """


class StorageFullError(StorageBackendError):
    """The disk is full (``ENOSPC``, SQLite's ``SQLITE_FULL``, PostgreSQL's ``53100``).

    Nothing of the failed write is stored; what was stored before stays readable, and writes
    work again once space is freed.
    """


class UnsupportedOperationError(CheckpointError, NotImplementedError):
    """The storage backend does not support this operation (for example leases)."""


class LeaseError(CheckpointError):
    """Base class of lease errors."""


class LeaseHeldError(LeaseError):
    """Another live owner holds the lease of this workflow."""


class LeaseLostError(LeaseError):
    """The lease expired or was taken over; writes under it are refused (fencing)."""


class EffectError(CheckpointError):
    """Base class of the errors of durable effects (``docs/effects.md``)."""


class EffectInDoubtError(EffectError):
    """An effect's intent is recorded but not its outcome: the call may have happened.

    Raised instead of calling the function again. ``key`` and ``step`` name the effect,
    ``intent_at`` is when its intent was recorded. Resolve it with
    :meth:`~aiocheckpoint.CheckpointManager.resolve_effect`, or call the effect with
    ``idempotent=True`` or a ``reconcile`` callback.
    """

    def __init__(self, workflow_id: str, step: int, key: str, intent_at: datetime) -> None:
        self.workflow_id = workflow_id
        self.step = step
        self.key = key
        self.intent_at = intent_at
        super().__init__(
            f"effect {key!r} of step {step} of workflow {workflow_id!r} is in doubt: its "
            f"intent was recorded at {intent_at.isoformat()} but no outcome; it may or may "
            "not have happened"
        )


class EffectOrderError(EffectError):
    """A step's effect does not match the one its journal recorded under the same key.

    Raised when a re-run step calls effects in another order (keys derived from the call
    order) or calls another function under a recorded key: the recorded result is never
    handed to the wrong call.
    """
