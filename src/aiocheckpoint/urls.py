"""Store URLs: one string names a storage backend and its location."""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import InvalidArgumentError
from .storage.base import CheckpointStorage
from .storage.memory import InMemoryCheckpointStorage

__all__ = ["URL_FORMS", "open_storage"]

URL_FORMS = (
    "memory://",
    "file:///abs/dir or file:relative/dir",
    "sqlite:///abs/path.db or sqlite:relative/path.db",
    "postgresql://user@host:port/db[?schema=NAME]",
)


def _bad(url: str, why: str) -> InvalidArgumentError:
    forms = "; ".join(URL_FORMS)
    return InvalidArgumentError(f"bad store URL {url!r}: {why} (accepted forms: {forms})")


def _path_part(url: str, scheme: str) -> str:
    rest = url[len(scheme) + 1 :]
    if rest.startswith("//"):
        rest = rest[2:]
        if not rest.startswith("/"):
            raise _bad(url, "a host is not allowed here; use three slashes for an absolute path")
    if not rest:
        raise _bad(url, "the path is empty")
    return rest


def _split_schema(url: str) -> tuple[str, str | None]:
    """Take ``schema=NAME`` out of a PostgreSQL URL's query: it names the store's schema."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    if not schemas:
        return url, None
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schemas[-1]


def _load(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"aiocheckpoint.storage.{module}"), name)


def open_storage(url: str, **options: Any) -> CheckpointStorage:
    """Create the storage that ``url`` names; ``options`` go to the backend's constructor.

    Accepted forms: ``memory://``; ``file:///abs/dir`` or ``file:relative/dir``;
    ``sqlite:///abs/path.db`` or ``sqlite:relative/path.db``; ``postgresql://...`` (or
    ``postgres://``), passed to the PostgreSQL backend as its DSN; a ``schema=NAME`` query
    parameter picks the store's PostgreSQL schema. Anything else raises
    :class:`~aiocheckpoint.InvalidArgumentError` naming the accepted forms. Storage opens
    lazily, so this never touches the disk or the network.
    """
    try:
        return _open(url, options)
    except TypeError as exc:  # an option the backend does not take
        raise InvalidArgumentError(f"bad option for store URL {url!r}: {exc}") from exc


def _open(url: str, options: dict[str, Any]) -> CheckpointStorage:
    if not isinstance(url, str) or ":" not in url:
        raise _bad(str(url), "no scheme")
    scheme = url.split(":", 1)[0].lower()
    if scheme == "memory":
        if url.lower() not in ("memory://", "memory:"):
            raise _bad(url, "memory:// takes no path")
        return InMemoryCheckpointStorage(**options)
    if scheme in ("file", "sqlite"):
        path = _path_part(url, scheme)
        module, name = (
            ("file", "FileCheckpointStorage")
            if scheme == "file"
            else (
                "sqlite",
                "SQLiteCheckpointStorage",
            )
        )
        storage: CheckpointStorage = _load(module, name)(path, **options)
        return storage
    if scheme in ("postgresql", "postgres"):
        dsn, schema = _split_schema(url)
        if schema is not None:
            options = {"schema": schema, **options}
        pg: CheckpointStorage = _load("postgres", "PostgresCheckpointStorage")(dsn, **options)
        return pg
    raise _bad(url, f"unknown scheme {scheme!r}")
