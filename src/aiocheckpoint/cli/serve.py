"""``serve``: the web inspector (the ``web`` extra), on loopback by default.

Read-only unless ``--allow-actions``, which needs a token.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import os
from typing import Any, Final

from .keys import command_keys
from .output import Output, printable
from .redact import redact_url
from .store import EXIT_STORE, CommandError, open_store

__all__ = ["TOKEN_VARIABLE", "cmd_serve", "is_loopback"]

#: Where ``serve`` reads its token when ``--token`` is not given (kept out of ``ps``).
TOKEN_VARIABLE: Final = "AIOCHECKPOINT_TOKEN"
#: The third-party modules the ``web`` extra brings.
_EXTRA_MODULES: Final = ("starlette", "uvicorn", "jinja2")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def cmd_serve(args: argparse.Namespace, out: Output) -> int:
    """Serve the inspector until interrupted (Ctrl-C)."""
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    loopback = is_loopback(args.host)
    if args.allow_actions and token is None:
        raise CommandError(
            "--allow-actions lets a visitor change workflows: pass --token (or set "
            f"{TOKEN_VARIABLE}) so that only those given the token can"
        )
    if not loopback and token is None:
        raise CommandError(
            f"--host {args.host} is not a loopback address: anyone who can reach it would read "
            f"the store; pass --token (or set {TOKEN_VARIABLE}) to require a token"
        )
    web = _web_package()
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as manager:
        shown_host = f"[{args.host}]" if ":" in args.host else args.host
        where = f"http://{shown_host}:{args.port}/"
        hint = f"{where}?token=…" if token else where
        mode = "with actions" if args.allow_actions else "read-only"
        out.note(f"serving {printable(redact_url(args.url))} {mode} at {hint} (Ctrl-C stops)")
        await web.serve(
            manager,
            args.url,
            host=args.host,
            port=args.port,
            token=token,
            loopback=loopback,
            allow_actions=args.allow_actions,
        )
    return 0


def _web_package() -> Any:
    """The ``aiocheckpoint.web`` package, or a clear error naming the extra to install."""
    try:
        # Imported by name: the web extra is optional, and this command alone needs it.
        return importlib.import_module("aiocheckpoint.web")
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in _EXTRA_MODULES:
            raise
        raise CommandError(
            f"serve needs the web extra ({missing} is not installed): "
            "pip install 'aiocheckpoint[web]'",
            EXIT_STORE,
        ) from None
