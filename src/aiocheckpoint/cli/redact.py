"""Credentials kept out of everything the command prints.

A store URL may carry a password (``postgresql://app:PW@host/db``, ``?password=PW``), and
error messages quote the URL they were given, mistyped ones included. Everything the command
prints that may hold a URL (error lines, hints, reasons) goes through :func:`redact`;
:func:`redact_url` masks one URL the way every message of the library does
(:func:`aiocheckpoint.urls.redacted`).
"""

from __future__ import annotations

import re

from ..urls import redacted

__all__ = ["redact", "redact_url"]


# A URL inside a message: a quoted one (as repr() quotes it, so a password with spaces or
# quotes stays inside), else an unquoted run of non-space characters. Either starts with a
# scheme followed by "//" (any scheme: mistyped ones are the point) or with a store scheme.
_START = r"(?:[A-Za-z][A-Za-z0-9+.\-]*://|(?:postgres|postgresql|sqlite|file|memory):)"
_IN_TEXT = re.compile(rf"'({_START}[^'\n]*)'|\"({_START}[^\"\n]*)\"|({_START}\S*)")


def redact_url(url: str) -> str:
    """``url`` with its passwords replaced by ``***`` (:func:`aiocheckpoint.urls.redacted`)."""
    return redacted(url)


def redact(text: str) -> str:
    """``text`` (a message, a command line) with every URL in it passed through redact_url."""

    def one(match: re.Match[str]) -> str:
        whole = match.group(0)
        inner = next(g for g in match.groups() if g is not None)
        return whole.replace(inner, redact_url(inner), 1)

    return _IN_TEXT.sub(one, text)
