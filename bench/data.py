"""The states every system writes: the same Python values for all of them.

Text is pseudo-random words from a fixed seed, so that it compresses about as well as real
prose (PostgreSQL's TOAST and any compressing store see realistic input) and every run writes
the same bytes. Unchanged parts of a state are the *same objects* from step to step, which is
how a real workflow hands its state over and lets a store that diffs by channel (LangGraph's
PostgreSQL saver) skip what did not change.
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["ChatStates", "DocStates", "encoded_size", "small_state", "text"]

_WORDS = (
    "agent plan tool call result search answer context user model token step memory "
    "retrieve summary draft review cost retry error state message system reply note"
).split()


def text(n_bytes: int, seed: int) -> str:
    """About ``n_bytes`` of deterministic word salad."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < n_bytes:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:n_bytes]


def encoded_size(value: Any) -> int:
    """Bytes of the compact JSON form of ``value``: the payload every store must keep."""
    return len(json.dumps(value, separators=(",", ":")).encode())


_SMALL_NOTE = text(760, seed=1)


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
    """A state of ``n_docs`` ~1 KB documents plus a counter that changes every step."""

    def __init__(self, total_bytes: int) -> None:
        n_docs = max(1, total_bytes // 1050)
        self.documents = [{"id": i, "text": text(1000, seed=1000 + i)} for i in range(n_docs)]

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
