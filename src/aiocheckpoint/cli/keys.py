"""The keys of an encrypted store: ``--keys FILE`` or ``AIOCHECKPOINT_KEYS`` (docs/cli.md).

A keys file is read by :meth:`Keyring.from_file <aiocheckpoint.Keyring.from_file>`, the
same loader an application uses for its own manager: JSON, ``{"primary": "k2", "keys":
{"k2": "<base64>", "k1": "<base64>"}}``, each key 32 bytes in standard base64, private to
its owner (no group or other permission bits).
"""

from __future__ import annotations

import argparse
from typing import Final

from ..codec import Keyring
from ..errors import InvalidArgumentError

__all__ = ["KEYS_VARIABLE", "command_keys", "keyring_file"]

#: The environment variable naming a keys file when ``--keys`` is not given.
KEYS_VARIABLE: Final = "AIOCHECKPOINT_KEYS"


def keyring_file(path: str) -> Keyring:
    """The keyring a keys file holds (argparse ``type=``: errors are usage errors)."""
    try:
        return Keyring.from_file(path)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def command_keys(args: argparse.Namespace) -> Keyring | None:
    """The keyring a command was given (``--keys`` or the environment), or None."""
    keys: Keyring | None = getattr(args, "keys", None)
    return keys
