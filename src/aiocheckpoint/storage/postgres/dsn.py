"""What the PostgreSQL store accepts as its DSN and connection options, checked up front.

asyncpg parses the DSN and takes the options only when the first connection is made, and
refuses some of them with a raw ``ValueError``, ``TypeError`` or ``IndexError`` (a port that
is not a number, an option it does not know, an empty host in a list). These checks make
the same cases an :class:`~aiocheckpoint.InvalidArgumentError` when the store is built (so
from :func:`~aiocheckpoint.open_storage`), before anything connects. Their messages name
the part at fault but never show the DSN or its pieces: a malformed DSN may carry a password
where a host or port was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ...errors import InvalidArgumentError

__all__ = ["CONNECT_OPTIONS", "check_connect_options", "check_dsn"]

#: The keyword arguments ``asyncpg.create_pool`` takes (itself and for ``asyncpg.connect``),
#: from asyncpg 0.29 on, less those the store sets itself (``min_size``, ``max_size``).
CONNECT_OPTIONS = frozenset(
    {
        # asyncpg.connect
        "command_timeout",
        "connection_class",
        "database",
        "direct_tls",
        "gsslib",
        "host",
        "krbsrvname",
        "max_cacheable_statement_size",
        "max_cached_statement_lifetime",
        "passfile",
        "password",
        "port",
        "record_class",
        "server_settings",
        "service",
        "servicefile",
        "ssl",
        "statement_cache_size",
        "target_session_attrs",
        "timeout",
        "user",
        # asyncpg.create_pool
        "connect",
        "init",
        "init_size",
        "max_inactive_connection_lifetime",
        "max_queries",
        "reset",
        "setup",
    }
)

#: libpq's ``sslmode`` values, which asyncpg takes in a DSN's query.
_SSL_MODES = frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"})
_IPV6 = re.compile(r"\[[^\]]+\](?::(?P<port>[^:]*))?")


def check_dsn(dsn: str) -> None:
    """Refuse a ``postgresql://`` DSN that asyncpg could not parse: bad host, port or query."""
    try:
        parts = urlsplit(dsn)
    except ValueError:  # an unclosed IPv6 bracket
        raise InvalidArgumentError("the host is not valid (an unclosed '[')") from None
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise InvalidArgumentError("the scheme must be postgresql:// or postgres://")
    hosts = parts.netloc.rpartition("@")[2]
    if hosts:
        _check_hosts(hosts.split(","), unquoted=True)
    if parts.query:
        _check_query(parts.query)


def check_connect_options(options: Mapping[str, Any]) -> None:
    """Refuse options ``asyncpg.create_pool`` does not take; check ``server_settings``, ``port``."""
    unknown = sorted(set(options) - CONNECT_OPTIONS)
    if unknown:
        raise InvalidArgumentError(
            f"unknown PostgreSQL connection option(s) {', '.join(map(repr, unknown))}; "
            f"accepted: the store's own and asyncpg's: {', '.join(sorted(CONNECT_OPTIONS))}"
        )
    settings = options.get("server_settings", {})
    if not isinstance(settings, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in settings.items()
    ):
        raise InvalidArgumentError("server_settings must be a mapping of str to str")
    port = options.get("port")
    ports = port if isinstance(port, list) else [port]
    if port is not None and not all(type(p) is int and 0 < p < 65536 for p in ports):
        raise InvalidArgumentError(f"port must be an int from 1 to 65535 (or a list), not {port!r}")


def _check_hosts(specs: list[str], *, unquoted: bool) -> None:
    for spec in specs:
        if not spec:
            raise InvalidArgumentError("a host in the host list is empty")
        if spec.startswith("/"):  # a Unix socket directory
            continue
        if spec.startswith("["):
            match = _IPV6.fullmatch(spec)
            if match is None:
                raise InvalidArgumentError(
                    "an IPv6 host is not valid: '[address]' or '[address]:port'"
                )
            port = match["port"] or ""
        else:
            port = spec.partition(":")[2]
        if port:  # "host:" is the default port, as for asyncpg
            _check_port(unquote(port) if unquoted else port)


def _check_port(port: str) -> None:
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise InvalidArgumentError("a port is not a number from 1 to 65535")


def _check_query(query: str) -> None:
    try:
        fields = parse_qs(query, strict_parsing=True)
    except ValueError:
        raise InvalidArgumentError("the query is not name=value pairs joined by '&'") from None
    last = {name: values[-1] for name, values in fields.items()}
    if "port" in last:
        for port in last["port"].split(","):
            _check_port(port)
    if "host" in last:
        _check_hosts(last["host"].split(","), unquoted=False)
    if "sslmode" in last and last["sslmode"] not in _SSL_MODES:
        modes = ", ".join(sorted(_SSL_MODES))
        raise InvalidArgumentError(f"sslmode {last['sslmode']!r} is not one of {modes}")
