"""Store URLs: one string names a storage backend and its location.

A URL may carry credentials (``postgresql://user:PASSWORD@host/db``), so every message that
shows one shows :func:`redacted` of it.
"""

from __future__ import annotations

import importlib
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import InvalidArgumentError
from .storage.base import CheckpointStorage
from .storage.memory import InMemoryCheckpointStorage

__all__ = ["URL_FORMS", "open_storage", "redacted"]

URL_FORMS = (
    "memory://",
    "file:///abs/dir or file:relative/dir",
    "sqlite:///abs/path.db or sqlite:relative/path.db",
    "postgresql://user@host:port/db[?schema=NAME]",
)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
#: ``password=...`` in a query or a key/value connection string (``sslpassword`` too).
_PASSWORD_FIELD = re.compile(r"(?i)(password=)[^&;#\s]*")
_MASK = "***"


def redacted(url: object) -> str:
    """``url`` fit for a message or a log: every password in it replaced by ``***``.

    Masked: the password of the user part (``scheme://user:PASSWORD@host``: everything from
    the first ``:`` of the user part to the last ``@`` before the path, so a password holding
    ``@``, ``?`` or ``#`` is masked whole) and the value of every ``password=`` or
    ``sslpassword=`` field. Works on any text, URL or not: a mistyped URL is where a password
    is most likely to be printed, so when in doubt more is masked, never less.
    """
    text = str(url)
    scheme = _SCHEME.match(text)
    # Without "//" after the scheme ("app:PW@host", a scheme forgotten), the whole text
    # before the "@" may be the user part.
    start = scheme.end() + 2 if scheme and text.startswith("//", scheme.end()) else 0
    first_at = text.find("@", start)
    if first_at >= 0:
        slash = text.find("/", first_at)
        end = text.rfind("@", start, slash if slash >= 0 else len(text))
        user = text[start:end]
        if ":" in user:
            text = f"{text[:start]}{user.split(':', 1)[0]}:{_MASK}{text[end:]}"
    return _PASSWORD_FIELD.sub(rf"\g<1>{_MASK}", text)


def _bad(url: object, why: str) -> InvalidArgumentError:
    forms = "; ".join(URL_FORMS)
    return InvalidArgumentError(f"bad store URL {redacted(url)!r}: {why} (accepted forms: {forms})")


def _path_part(url: str, scheme: str) -> str:
    rest = url[len(scheme) + 1 :]
    if rest.startswith("//"):
        rest = rest[2:]
        if not rest.startswith("/"):
            raise _bad(url, "a host is not allowed here; use three slashes for an absolute path")
    if not rest:
        raise _bad(url, "the path is empty")
    if "?" in rest or "#" in rest:
        raise _bad(url, "a query or fragment is not accepted; pass options as keyword arguments")
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
    parameter picks the store's PostgreSQL schema. Anything else (an unknown scheme, a host
    or port that cannot be used, a query where none is taken, an option the backend does not
    take) raises :class:`~aiocheckpoint.InvalidArgumentError` here, naming the accepted forms;
    its message shows the URL :func:`redacted`. Storage opens lazily, so this never touches
    the disk or the network.
    """
    try:
        return _open(url, options)
    except TypeError as exc:  # an option the backend does not take
        raise InvalidArgumentError(f"bad option for store URL {redacted(url)!r}: {exc}") from exc


def _open(url: str, options: dict[str, Any]) -> CheckpointStorage:
    if not isinstance(url, str) or ":" not in url:
        raise _bad(url, "no scheme")
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
        return _open_postgres(url, options)
    raise _bad(url, f"unknown scheme {scheme!r}")


def _open_postgres(url: str, options: dict[str, Any]) -> CheckpointStorage:
    check_dsn = _load("postgres.dsn", "check_dsn")
    try:
        check_dsn(url)  # before _split_schema rewrites the query
    except InvalidArgumentError as exc:
        raise _bad(url, str(exc)) from None
    dsn, schema = _split_schema(url)
    if schema is not None:
        options = {"schema": schema, **options}
    storage: CheckpointStorage = _load("postgres", "PostgresCheckpointStorage")(dsn, **options)
    return storage
