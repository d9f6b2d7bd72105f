"""The states every system writes: the same Python values for all of them.

Text is pseudo-random words from a fixed seed, so that it compresses about as well as real
prose (PostgreSQL's TOAST and any compressing store see realistic input) and every run writes
the same bytes. Unchanged parts of a state are the *same objects* from step to step, which is
how a real workflow hands its state over and lets a store that diffs by channel (LangGraph's
PostgreSQL saver) skip what did not change.
"""

from __future__ import annotations

import functools
import json
import random
from typing import Any

__all__ = ["ChatStates", "DocStates", "encoded_size", "small_state", "text"]

_WORDS = [
    "agent",
    "plan",
    "tool",
    "call",
    "result",
    "search",
    "answer",
    "context",
    "user",
    "model",
    "token",
    "step",
    "memory",
    "retrieve",
    "summary",
    "draft",
    "review",
    "cost",
    "retry",
    "error",
    "state",
    "message",
    "system",
    "reply",
    "note",
    "",
]


def text(n_bytes: int, seed: int) -> str:
    """Exactly ``n_bytes`` of deterministic word salad."""
    rng = random.Random(seed)
    return " ".join(rng.choices(_WORDS, k=n_bytes // 4 + 1))[:n_bytes]


def encoded_size(value: Any) -> int:
    """Bytes of the compact JSON form of ``value``: the payload every store must keep."""
    return len(json.dumps(value, separators=(",", ":")).encode())


_SMALL_NOTE = text(850, seed=1)


def small_state(step: int) -> dict[str, Any]:
    """A ~1 KB state of a typical agent step."""
    return {
        "step": step,
        "agent": "researcher",
        "query": "compare durable checkpoint stores for async python",
        "notes": _SMALL_NOTE,
        "scores": [0.91, 0.42, 0.77, 0.13],
        "done": False,
    }


class DocStates:
    """A state of ~1 KB documents (``total_bytes`` in all) plus a counter that changes every step.

    Use :meth:`of` to share one instance per size: the documents are never modified.
    """

    def __init__(self, total_bytes: int) -> None:
        n_docs = max(1, total_bytes // 1027)
        self.documents = [{"id": i, "text": text(1000, seed=1000 + i)} for i in range(n_docs)]

    @staticmethod
    @functools.cache
    def of(total_bytes: int) -> DocStates:
        """The shared instance for ``total_bytes``."""
        return DocStates(total_bytes)

    def at(self, step: int) -> dict[str, Any]:
        """The state after ``step``: the same document list, a new counter."""
        return {"documents": self.documents, "counter": step}


class ChatStates:
    """A chat whose message list grows by one ~1 KB message per step."""

    def __init__(self, message_bytes: int = 1000) -> None:
        self.message_bytes = message_bytes
        self.messages: list[dict[str, Any]] = []

    def next(self, step: int) -> dict[str, Any]:
        """Append one message and return the state (a new list object, as a reducer makes)."""
        role = "user" if step % 2 == 0 else "assistant"
        message = {"role": role, "content": text(self.message_bytes, seed=50_000 + step)}
        self.messages = [*self.messages, message]
        return {"messages": self.messages, "turn": step}
