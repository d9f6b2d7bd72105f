"""The ``aiocheckpoint`` command: inspect, verify, prune, copy, export and import stores.

Run ``aiocheckpoint --help`` (or ``python -m aiocheckpoint --help``); docs/cli.md describes
every command, the store URLs, the export format and the exit statuses. The command only
uses the public API (:class:`~aiocheckpoint.CheckpointManager`,
:func:`~aiocheckpoint.open_storage` and the storage protocol), so it works on every backend.

The package has one module per concern: :mod:`.parser` (the arguments), :mod:`.inspect`
(``workflows``, ``history``, ``show``), :mod:`.diff`, :mod:`.maintain` (``verify``,
``prune``, ``rm``), :mod:`.transfer` (``copy``, ``export``, ``import``), :mod:`.output`
(what reaches the terminal) and :mod:`.store` (opening stores, paging through records).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from ..errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError
from .output import Output, printable
from .parser import Command, build_parser
from .redact import redact
from .store import EXIT_NOT_FOUND, EXIT_PIPE, EXIT_STORE, EXIT_USAGE, CommandError

__all__ = ["build_parser", "main"]


def _status_of(exc: CheckpointError) -> int:
    if isinstance(exc, InvalidArgumentError):
        return EXIT_USAGE
    if isinstance(exc, CheckpointNotFoundError):
        return EXIT_NOT_FOUND
    return EXIT_STORE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    out = Output(json_mode=args.json)
    func: Command = args.func
    # Python's limit on int <-> text conversions stays on: decoding falls back to the
    # library's own divide-and-conquer parser, and output shortens ints too long to print.
    try:
        status = asyncio.run(func(args, out))
        out.out.flush()  # here, so that a closed pipe is caught below, not at exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except CommandError as exc:
        return _fail(parser, str(exc), exc.status, exc)
    except CheckpointError as exc:
        return _fail(parser, str(exc), _status_of(exc), exc)
    except ImportError as exc:
        return _fail(parser, f"a backend is not installed: {exc}", EXIT_STORE, exc)
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{parser.prog}: interrupted\n")
        return 130
    except Exception as exc:  # a bug or a driver's raw error: still one line, redacted
        message = f"unexpected {type(exc).__name__}: {exc} (AIOCHECKPOINT_DEBUG=1 shows where)"
        return _fail(parser, message, EXIT_STORE, exc)


def _stdout_closed() -> int:
    """Stop quietly when stdout's reader went away (``| head``), as Unix tools do."""
    # Python flushes stdout once more at exit: aim it at /dev/null so that flush cannot fail.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # stdout has no descriptor (an in-process caller's capture): nothing to flush
    return EXIT_PIPE


def _fail(parser: argparse.ArgumentParser, message: str, status: int, exc: Exception) -> int:
    if os.environ.get("AIOCHECKPOINT_DEBUG"):
        raise exc
    first = message.splitlines()[0] if message else type(exc).__name__
    sys.stderr.write(f"{parser.prog}: error: {printable(redact(first))}\n")
    return status
