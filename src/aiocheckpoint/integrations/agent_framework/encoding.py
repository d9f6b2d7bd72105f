"""The framework's own checkpoint encoding, the one boundary with its private module.

A ``WorkflowCheckpoint`` holds framework objects (messages, events) that only the
framework's encoding turns into JSON: JSON values pass through and everything else is
pickled, under a marker. Reading it back unpickles with the framework's restricted
unpickler, limited to its safe set and the ``allowed_types`` given, exactly as its own
``FileCheckpointStorage`` does. aiocheckpoint verifies the record (its checksum, and its
seal when the manager encrypts) before this decoder sees a byte of it, so a tampered or
forged record never reaches the unpickler.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from agent_framework import WorkflowCheckpoint
from agent_framework._workflows._checkpoint_encoding import (
    decode_checkpoint_value,
    encode_checkpoint_value,
)
from agent_framework.exceptions import WorkflowCheckpointException

__all__ = ["decode", "encode"]


def encode(checkpoint: WorkflowCheckpoint, allowed: frozenset[str]) -> dict[str, Any]:
    """The checkpoint's JSON form; refused if it would not decode under ``allowed``."""
    try:
        encoded = cast(dict[str, Any], encode_checkpoint_value(checkpoint.to_dict()))
        decode_checkpoint_value(encoded, allowed_types=allowed)
    except WorkflowCheckpointException:
        raise
    except Exception as exc:
        raise WorkflowCheckpointException(
            f"checkpoint {checkpoint.checkpoint_id} cannot be encoded or restored under "
            "this storage's allowed types; refusing to save"
        ) from exc
    return encoded


def decode(encoded: Mapping[str, Any], allowed: frozenset[str]) -> WorkflowCheckpoint:
    """The checkpoint back from its JSON form (framework types and ``allowed`` only)."""
    decoded = decode_checkpoint_value(dict(encoded), allowed_types=allowed)
    return WorkflowCheckpoint.from_dict(decoded)
