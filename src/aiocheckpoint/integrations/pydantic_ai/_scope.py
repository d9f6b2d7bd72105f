"""The run in progress: its workflow, and the stable effect keys of its durable units."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from pydantic_ai.tools import RunContext

from ...workflow import ResumableWorkflow

#: An effect key is at most this many UTF-8 bytes (the journal's limit).
_MAX_KEY_BYTES = 255


@dataclass
class RunScope:
    """One durable agent run: the workflow its units are recorded in, and its key counters."""

    workflow: ResumableWorkflow
    _counters: dict[str, int] = field(default_factory=dict)
    _used: set[str] = field(default_factory=set)

    def next_number(self, name: str) -> int:
        """The next ordinal of ``name`` in this run (0, 1, ...), in the order calls start."""
        number = self._counters.get(name, 0)
        self._counters[name] = number + 1
        return number

    def key_for(self, name: str, cache_key: tuple[object, ...]) -> str:
        """The effect key of one unit: its name with its tool call's id, or with its ordinal.

        A tool call is keyed by the tool call id of the model response that asked for it
        (replayed from the journal, so the same on every run), so parallel tool calls keep
        their keys whatever order they start in; every other unit by its name's ordinal, as
        they run one after another. A key already taken in this run gets ``~2``, ``~3``...
        """
        call_id = _tool_call_id(cache_key)
        key = f"{name}@{call_id}" if call_id else f"{name}/{self.next_number(name)}"
        key = _bounded(key)
        unique, n = key, 1
        while unique in self._used:
            n += 1
            unique = _bounded(f"{key}~{n}")
        self._used.add(unique)
        return unique


_CURRENT: ContextVar[RunScope | None] = ContextVar("aiocheckpoint_pydantic_ai_run", default=None)
_IDEMPOTENCY_KEY: ContextVar[str | None] = ContextVar(
    "aiocheckpoint_pydantic_ai_idempotency_key", default=None
)


def current_scope() -> RunScope | None:
    """The durable run this task is in, if any."""
    return _CURRENT.get()


@contextmanager
def run_scope(workflow: ResumableWorkflow) -> Iterator[RunScope]:
    """Make the code inside a durable run recorded in ``workflow``."""
    scope = RunScope(workflow)
    token = _CURRENT.set(scope)
    try:
        yield scope
    finally:
        _CURRENT.reset(token)


@contextmanager
def idempotency_scope(key: str | None) -> Iterator[None]:
    """Expose the unit's idempotency key to the tool running in it."""
    token = _IDEMPOTENCY_KEY.set(key)
    try:
        yield
    finally:
        _IDEMPOTENCY_KEY.reset(token)


def current_idempotency_key() -> str | None:
    """The idempotency key of the durable unit running now (None outside an idempotent one).

    A tool configured as idempotent reads it and hands it to a provider that deduplicates on
    it: the same on every attempt of that tool call, so a call made again after a crash is
    performed once by the provider.
    """
    return _IDEMPOTENCY_KEY.get()


def _tool_call_id(cache_key: tuple[object, ...]) -> str | None:
    for part in cache_key:
        if isinstance(part, RunContext) and isinstance(part.tool_call_id, str):
            return part.tool_call_id
    return None


def _bounded(key: str) -> str:
    """``key``, or its head and a digest of it when it is over the journal's limit."""
    if len(key.encode("utf-8")) <= _MAX_KEY_BYTES:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    head = key.encode("utf-8")[:180].decode("utf-8", "ignore")
    return f"{head}~{digest}"
