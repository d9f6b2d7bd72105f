"""Shared pieces of the conformance suites: tricky ids, records, states, managers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from ..manager import CheckpointManager
from ..storage.base import CheckpointStorage, WorkflowStorage

#: Workflow ids that naive backends confuse: separators, traversal, quoting, unicode.
TRICKY_IDS = (
    "a/b",
    "a_b",
    "a%2Fb",
    "..",
    "../x",
    "/etc/passwd",
    "C:\\Windows",
    " spaced ",
    "wf:1",
    "日本語",
    "'; DROP TABLE checkpoints; --",
    "CON",
    "a.b",
    "A/B",
    "é" * 127,
)

#: The ``reopen`` fixture's type: opens a new storage object on the same location.
Reopen = Callable[[], Awaitable[CheckpointStorage]]


def rec(n: int, size: int = 16) -> bytes:
    """Record ``n``'s bytes, ``size`` of them: distinct per ``n``, the same on every call."""
    return (f"record-{n}-".encode() * (size // 8 + 1))[:size]


class Boom(RuntimeError):
    """The error a test's workflow raises on purpose."""


def new_manager(storage: WorkflowStorage) -> CheckpointManager:
    """A manager with default settings over ``storage``."""
    return CheckpointManager(storage)


def big_state(seed: int, tag: str = "", docs: int = 60) -> dict[str, Any]:
    """A state well over the inline limit: ~1 KB documents (same for one ``tag``), a counter."""
    return {
        "counter": seed,
        "docs": [{"id": i, "body": f"{tag} doc {i} " + "lorem ipsum " * 80} for i in range(docs)],
        "plan": ["step one", "step two"],
    }


#: How far past a TTL a sweep's clock is set, so every expiry has passed.
LATER = timedelta(days=2)
