"""The keys of an encrypted store: ``--keys FILE`` or ``AIOCHECKPOINT_KEYS`` (docs/cli.md).

A keys file is JSON: ``{"primary": "k2", "keys": {"k2": "<base64>", "k1": "<base64>"}}``,
each key 32 bytes in standard base64. It must be private to its owner (no group or other
permission bits): a key readable by others is not a secret.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import stat
from typing import Any, Final

from ..codec.sealing import Keyring
from ..errors import CheckpointError

__all__ = ["KEYS_VARIABLE", "command_keys", "keyring_file"]

#: The environment variable naming a keys file when ``--keys`` is not given.
KEYS_VARIABLE: Final = "AIOCHECKPOINT_KEYS"
#: A keys file is small: anything larger is not one.
_MAX_BYTES: Final = 1 << 20


def keyring_file(path: str) -> Keyring:
    """The keyring a keys file holds (argparse ``type=``: errors are usage errors)."""
    try:
        with open(path, "rb") as fh:
            info = os.fstat(fh.fileno())
            if stat.S_IMODE(info.st_mode) & 0o077:
                raise argparse.ArgumentTypeError(
                    f"keys file {path} may be read by others (chmod 600 {path})"
                )
            text = fh.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read keys file {path}: {exc.strerror}") from exc
    if len(text) > _MAX_BYTES:
        raise argparse.ArgumentTypeError(f"keys file {path} is too large to be one")
    return _parse(text, path)


def _parse(text: bytes, path: str) -> Keyring:
    try:
        obj: Any = json.loads(text)
        keys = {name: _key(value) for name, value in obj["keys"].items()}
        return Keyring(keys=keys, primary=obj["primary"])
    except CheckpointError as exc:
        raise argparse.ArgumentTypeError(f"keys file {path}: {exc}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        shape = '{"primary": ID, "keys": {ID: BASE64 of 32 bytes, ...}}'
        raise argparse.ArgumentTypeError(
            f"keys file {path} is not {shape}: {type(exc).__name__}: {_reason(exc)}"
        ) from None


def _reason(exc: Exception) -> str:
    """What went wrong, never the file's text (a JSON error names only a position)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return str(exc)[:200]


def _key(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError("a key is base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError("a key is not base64") from exc


def command_keys(args: argparse.Namespace) -> Keyring | None:
    """The keyring a command was given (``--keys`` or the environment), or None."""
    keys: Keyring | None = getattr(args, "keys", None)
    return keys
