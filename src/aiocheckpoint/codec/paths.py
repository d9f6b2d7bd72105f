"""How error messages name a value inside a state, and the text checks every writer applies."""

from __future__ import annotations

from typing import Final

from ..errors import CheckpointSerializationError

__all__ = ["checked_text", "child_path", "safe_repr"]

_IDENTIFIER_CHARS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
)


def child_path(path: str, key: str | int) -> str:
    """The path of ``key`` in the container at ``path`` (as error messages name it)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key and not key[0].isdigit() and set(key) <= _IDENTIFIER_CHARS:
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def checked_text(text: str, path: str) -> str:
    """Return ``text`` if it can be stored as UTF-8 (no lone surrogates), else raise."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CheckpointSerializationError(
                path, "the string is not valid Unicode (it holds a lone surrogate)"
            ) from exc
    return text


def safe_repr(value: object) -> str:
    """``repr(value)``, or a stand-in when the object's ``__repr__`` raises."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__qualname__} object>"
