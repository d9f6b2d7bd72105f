"""The PostgreSQL store's connections: asyncpg imported lazily, the pool, driver errors, retries.

asyncpg is an optional dependency (``pip install aiocheckpoint[postgres]``): it is imported
the first time a store is used, never when this package is imported, and its absence is a
:class:`~aiocheckpoint.StorageBackendError` naming the extra.

:class:`Connection` opens the pool on the first call (and creates or migrates the schema,
:mod:`.schema`), runs each operation on a pooled connection, discards connections that died,
and retries an idempotent operation after a lost connection or a lost deadlock. Each call
holds a slot of :mod:`.ceiling` (so a server that refuses new connections makes it wait for
a pooled one) and stays within its :mod:`.budget` (``command_timeout``, all tries included).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, TypeVar

import anyio

from ...errors import (
    InvalidArgumentError,
    StorageBackendError,
    StorageClosedError,
    StorageTimeoutError,
)
from ..diskfull import storage_error
from .budget import Budget
from .ceiling import REGROW_AFTER, Ceiling, NoConnection, refused
from .schema import migrate
from .stats import WriteStats

__all__ = [
    "Connection",
    "Raced",
    "conflict",
    "connection_lost",
    "describe",
    "driver_errors",
    "failure",
    "import_asyncpg",
    "is_transient",
    "on_connection",
    "timeout_cause",
]

T = TypeVar("T")

_asyncpg: ModuleType | None = None

#: What asyncpg raises, on connecting, for an argument it cannot use that the store's checks
#: (:mod:`.dsn`) let through, such as ``command_timeout="x"``: the caller's mistake.
_BAD_ARGUMENT = (TypeError, ValueError, OverflowError, IndexError)


def import_asyncpg() -> ModuleType:
    """asyncpg, imported now if it was not yet; :class:`StorageBackendError` without it."""
    global _asyncpg
    if _asyncpg is None:
        try:
            _asyncpg = importlib.import_module("asyncpg")
        except ImportError as exc:
            raise StorageBackendError(
                "PostgresCheckpointStorage needs asyncpg, which is not installed: "
                "pip install 'aiocheckpoint[postgres]'"
            ) from exc
    return _asyncpg


def driver_errors(pg: ModuleType) -> tuple[type[BaseException], ...]:
    """The exceptions that mean the driver, the network or the server failed a call."""
    return (
        pg.PostgresError,
        pg.InterfaceError,
        pg.InternalClientError,
        OSError,
        asyncio.TimeoutError,
    )


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is dead or its protocol state is unusable."""
    if isinstance(exc, (OSError, asyncio.TimeoutError)):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    if state.startswith(("08", "57P")):
        return True
    pg = _asyncpg
    if pg is None:
        return False
    # asyncpg can be left in a confused protocol state by a server-side termination
    # (MagicStack/asyncpg#1069): such a connection must be discarded, like a dead one.
    if isinstance(exc, pg.InternalClientError):
        return True
    if isinstance(exc, pg.InterfaceError):
        text = str(exc).lower()
        return "connection" in text and "closed" in text
    return False


class Raced(Exception):
    """A record appeared after the batch statement's snapshot: run the transaction again."""


def conflict(exc: BaseException) -> bool:
    """A deadlock or serialization failure, or a race the batch detected: retry it whole."""
    return isinstance(exc, Raced) or getattr(exc, "sqlstate", None) in ("40001", "40P01")


def is_transient(exc: BaseException) -> bool:
    """Whether running the same idempotent operation again may well succeed."""
    if connection_lost(exc) or conflict(exc):
        return True
    pg = _asyncpg
    # A concurrent ALTER TABLE invalidated a cached statement; asyncpg has dropped it.
    return pg is not None and isinstance(exc, pg.InvalidCachedStatementError)


def failure(what: str, exc: BaseException) -> StorageBackendError:
    """The error of ``what`` failing on ``exc``: :class:`StorageFullError` for ``53100``."""
    return storage_error(f"PostgreSQL {what} failed", describe(exc), exc)


def describe(exc: BaseException) -> str:
    """``Type: message`` of a driver error, for the messages of the errors it becomes."""
    return f"{type(exc).__name__}: {exc}"


async def on_connection(
    pool: Any,
    op: Callable[[Any], Awaitable[T]],
    within: float | None = None,
    *,
    wait: float | None = None,
) -> T:
    """Run ``op`` on a connection of ``pool``; a connection found dead is not handed back.

    With ``within``, the acquire and ``op`` together get that many seconds; a connection
    interrupted by it is terminated (its statement's fate is unknown to the protocol).
    Without it, the acquire alone gets ``wait`` seconds: a connection the pool's other
    users hold must not make the call wait for ever. Either way an acquire that timed out
    raises :class:`NoConnection` (``op`` timing out raises ``asyncio.TimeoutError``).
    """
    deadline = None if within is None else anyio.current_time() + within
    acquired = False
    try:
        async with pool.acquire(timeout=within if within is not None else wait) as con:
            acquired = True
            return await _run_on(con, op, deadline)
    except asyncio.TimeoutError as exc:
        if acquired:
            raise
        raise NoConnection from exc


async def _run_on(con: Any, op: Callable[[Any], Awaitable[T]], deadline: float | None) -> T:
    try:
        if deadline is None:
            return await op(con)
        with anyio.fail_after(deadline - anyio.current_time()):
            return await op(con)
    except Exception as exc:
        if connection_lost(exc):
            # If asyncpg already saw it close, it has detached it from the proxy and
            # terminate() raises; the original error is the one to report (and retry on).
            with contextlib.suppress(Exception):
                con.terminate()
        raise


class Connection:
    """A store's pool: opened on first use, its schema migrated, its calls retried.

    ``dsn_or_pool`` is a DSN (the pool is created with ``pool_options``, owned and closed
    here) or an asyncpg pool (used as is, never closed). ``check_open`` raises when the store
    (named ``owner`` in errors) is closed; a failed open is retried by the next call.
    """

    def __init__(
        self,
        dsn_or_pool: Any,
        *,
        schema: str,
        quoted: str,
        pool_options: dict[str, Any],
        retries: int,
        stats: WriteStats,
        owner: str,
        check_open: Callable[[], None],
    ) -> None:
        self._dsn: str | None = dsn_or_pool if isinstance(dsn_or_pool, str) else None
        self._given_pool: Any = None if self._dsn is not None else dsn_or_pool
        self._schema = schema
        self._quoted = quoted
        self._pool_options = pool_options
        self._retries = retries
        self._stats = stats
        self._owner = owner
        self._check_open = check_open
        self._pool: Any = None
        self._ceiling = Ceiling(int(pool_options.get("max_size", 10)))
        self._timeout: float | None = _seconds(pool_options.get("command_timeout"))
        self._wait_limit = _seconds(pool_options.get("timeout")) or 60.0
        self._closed = False
        self._open_lock = asyncio.Lock()

    @property
    def retries(self) -> int:
        """How many times an idempotent call is run again after a lost connection."""
        return self._retries

    async def pool(self) -> Any:
        """The open pool; the first call opens it and creates or migrates the schema."""
        pool = self._pool
        if pool is not None:
            return pool
        async with self._open_lock:
            self._check_open()
            if self._pool is None:
                self._pool = await self._open()
                max_size = getattr(self._pool, "get_max_size", None)
                if self._dsn is None and callable(max_size):  # a given pool: its own size
                    self._ceiling = Ceiling(int(max_size()))
            return self._pool

    def budget(self) -> Budget:
        """A new operation's clock: ``command_timeout`` for all its tries and waits."""
        return Budget(self._timeout, self._wait_limit)

    async def run(self, what: str, op: Callable[[Any], Awaitable[T]], *, retry: bool = True) -> T:
        """Run ``op`` on a pooled connection; map driver errors; retry a lost connection."""
        pool = await self.pool()
        errors = driver_errors(import_asyncpg())
        budget = self.budget()
        while True:
            try:
                return await self.attempt(pool, what, op, budget)
            except errors as exc:
                if self._closed and self._pool is None:
                    raise StorageClosedError(f"{self._owner} is closed") from exc
                if budget.expired() and is_transient(exc):  # a real error is reported as it is
                    raise budget.timed_out(what, timeout_cause(exc)) from exc
                if retry and budget.attempts <= self._retries and is_transient(exc):
                    self._stats.retries += 1
                    continue
                raise failure(what, exc) from exc

    async def attempt(
        self, pool: Any, what: str, op: Callable[[Any], Awaitable[T]], budget: Budget
    ) -> T:
        """One try of ``op``: a slot under the ceiling, a connection, ``op``, all in budget.

        A connection the server refuses (too many connections) lowers the ceiling and the
        try waits for a pooled connection instead; :class:`StorageTimeoutError` when none
        comes within the budget (or the connect ``timeout`` without one), naming the
        refusal whichever wait ran out: the slot's or the pool's acquire.
        """
        budget.attempts += 1
        last: BaseException | None = None
        while True:
            try:
                async with self._ceiling.slot(budget.wait_deadline):
                    wait = budget.wait_left()
                    return await on_connection(pool, op, budget.remaining(), wait=wait)
            except NoConnection:
                raise budget.timed_out(what, _waited(last, self._ceiling.cap)) from last
            except Exception as exc:
                if not refused(exc):
                    raise
                self._ceiling.lower(pool.get_size() if hasattr(pool, "get_size") else 0)
                last = exc

    async def close(self) -> None:
        """Close the pool if this store created it; later calls raise ``StorageClosedError``."""
        self._closed = True
        async with self._open_lock:
            pool, self._pool = self._pool, None
            if pool is not None and self._dsn is not None:
                await pool.close()

    async def _open(self) -> Any:
        limit = self._timeout or self._wait_limit
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            try:
                return await self._open_once()
            except StorageBackendError as exc:
                if not refused(exc.__cause__):
                    raise
                if loop.time() - start >= limit:
                    raise StorageTimeoutError(
                        f"{exc}; the server refused every connection for "
                        f"{loop.time() - start:.2f} s (the wait is bounded by {limit:g} s)"
                    ) from exc.__cause__
            # The server has no connection for this role or database yet: wait for one.
            await asyncio.sleep(min(REGROW_AFTER, max(start + limit - loop.time(), 0.0)))

    async def _open_once(self) -> Any:
        pg = import_asyncpg()
        errors = driver_errors(pg)
        pool: Any = None
        try:
            if self._dsn is None:
                pool = self._given_pool
            else:
                pool = await pg.create_pool(self._dsn, **self._pool_options)
            # A given pool's connections may all be held by its other users: bounded.
            async with pool.acquire(timeout=self._timeout or self._wait_limit) as con:
                await migrate(con, self._quoted, self._schema)
        except BaseException as exc:
            if pool is not None and self._dsn is not None:
                pool.terminate()
            where = f"cannot open PostgreSQL store (schema {self._schema!r})"
            if isinstance(exc, asyncio.TimeoutError):
                limit = self._timeout or self._wait_limit
                raise StorageTimeoutError(
                    f"{where}: no pooled connection came free (or the migration did not "
                    f"finish) within {limit:g} s"
                ) from exc
            if isinstance(exc, errors):
                raise storage_error(where, describe(exc), exc) from exc
            if isinstance(exc, _BAD_ARGUMENT) and self._dsn is not None:
                raise InvalidArgumentError(
                    f"{where}: a connection argument: {describe(exc)}"
                ) from exc
            raise
        return pool


def _seconds(value: Any) -> float | None:
    """A timeout option as seconds; ``None`` when absent (or not a finite positive number)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number and math.isfinite(value) and value > 0 else None


def timeout_cause(exc: BaseException) -> str:
    """What the last try ran into, unless it was only the timeout itself."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc):
        return ""
    return f"last error {describe(exc)}"


def _waited(refusal: BaseException | None, cap: int) -> str:
    """Why no connection came: the server's refusal and what the pool held, or a full pool."""
    if refusal is None:
        return f"no pooled connection was free (the pool holds at most {cap})"
    return (
        f"no pooled connection came free ({describe(refusal)}; the pool holds {cap} "
        "connection(s) the server allowed)"
    )
