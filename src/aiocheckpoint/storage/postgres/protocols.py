"""What the store's statement modules need of its connection, as protocols.

A module whose table the schema creates (its migration is imported by :mod:`.schema`,
which :mod:`.connection` imports) names the connection by what it does, not by its class:
so no import circle runs through the connection, not even one for types only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

__all__ = ["Runner"]

_T = TypeVar("_T")


class Runner(Protocol):
    """Runs an operation on a pooled connection (:class:`.connection.Connection` does)."""

    async def run(self, what: str, op: Callable[[Any], Awaitable[_T]], *, retry: bool = True) -> _T:
        """Run ``op`` on a pooled connection, mapping driver errors; ``what`` names it."""
        ...
