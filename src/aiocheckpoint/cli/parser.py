"""The argument parser of the ``aiocheckpoint`` command: every command and its arguments."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

from .. import __version__
from .compact import cmd_compact
from .diff import cmd_diff
from .effects import cmd_effect, json_value
from .events import cmd_events
from .export import cmd_export
from .importer import cmd_import
from .inspect import cmd_history, cmd_show, cmd_workflows
from .keys import KEYS_VARIABLE, keyring_file
from .maintain import cmd_fork, cmd_prune, cmd_rm, cmd_verify
from .operate import cmd_cancel, cmd_resume, cmd_retry, input_value
from .output import Output
from .query import meta_pair, moment
from .rekey import cmd_encrypt, cmd_rekey
from .serve import TOKEN_VARIABLE, cmd_serve
from .store import EXIT_USAGE
from .sweep import cmd_sweep, duration
from .transfer import cmd_copy

__all__ = ["Command", "build_parser"]

#: What ``--allow-shared`` does (docs/cli.md, "Other users' stores").
_SHARED = "open file: and sqlite: stores that another user owns or may write"

#: A command: its parsed arguments and where to write, to its exit status.
Command = Callable[[argparse.Namespace, Output], Coroutine[Any, Any, int]]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _CommandParser(_Parser):
    """A command's parser: options may come before, between or after its positionals.

    Plain argparse stops filling positionals at the first option, so it refuses
    ``prune URL --keep 5 WORKFLOW``; intermixed parsing takes them in any order.
    """

    _inner = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        if self._inner:  # the two passes intermixed parsing makes (Python < 3.12)
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a step number: {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"a step is between 0 and 2**63 - 1, got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``aiocheckpoint`` command."""
    parser = _Parser(
        prog="aiocheckpoint",
        description="Inspect and maintain aiocheckpoint stores. A store is named by a URL: "
        "memory://, file:///abs/dir, file:rel/dir, sqlite:///abs/path.db, sqlite:rel/path.db "
        "or postgresql://user@host:port/db[?schema=NAME].",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--allow-shared", action="store_true", help=_SHARED)
    common = _CommandParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    common.add_argument(
        "--allow-shared", action="store_true", default=argparse.SUPPRESS, help=_SHARED
    )
    common.add_argument(
        "--keys",
        type=keyring_file,
        default=os.environ.get(KEYS_VARIABLE),
        metavar="FILE",
        help=f"the keys of an encrypted store (default: ${KEYS_VARIABLE})",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser
    )

    def command(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = command("workflows", cmd_workflows, "list workflows: steps, latest step, last write")
    p.add_argument("url", metavar="URL")
    p.add_argument("--unfinished", action="store_true", help="only unfinished workflows")
    p.add_argument("--status", help="only this workflow status (a query of the records)")
    p.add_argument("--agent-status", help="only workflows whose latest step has this status")
    p.add_argument("--in-doubt", action="store_true", help="only workflows with an effect in doubt")
    p.add_argument(
        "--meta", type=meta_pair, action="append", metavar="KEY=VALUE", help="metadata equals"
    )
    p.add_argument("--updated-after", type=moment, metavar="TIME", help="updated after (ISO)")
    p.add_argument("--updated-before", type=moment, metavar="TIME", help="updated before (ISO)")
    p.add_argument("--limit", type=_positive, help="workflows per page (50 with a filter)")
    p.add_argument("--cursor", help="the page after this cursor (printed by the last page)")

    p = command("history", cmd_history, "a workflow's checkpoints, newest first, paged")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--limit", type=_positive, default=20, help="checkpoints per page (20)")
    p.add_argument("--before", type=_step, help="only steps below this one (the next page)")

    p = command("events", cmd_events, "a workflow's event history, oldest first, paged")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--limit", type=_positive, default=50, help="events per page (50)")
    p.add_argument("--cursor", help="the page after this cursor (printed by the last page)")

    p = command("show", cmd_show, "one checkpoint (the latest by default)")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("step", metavar="STEP", type=_step, nargs="?")

    p = command("diff", cmd_diff, "what changed in the state between two steps")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("step_a", metavar="STEP_A", type=_step)
    p.add_argument("step_b", metavar="STEP_B", type=_step)

    p = command("effect", cmd_effect, "settle an effect in doubt: its result, or run it again")
    p.add_argument("action", metavar="ACTION", choices=["resolve"], help="resolve")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("step", metavar="STEP", type=_step)
    p.add_argument("key", metavar="KEY")
    outcome = p.add_mutually_exclusive_group(required=True)
    outcome.add_argument(
        "--result", type=json_value, metavar="JSON", help="it happened: its result, as JSON"
    )
    outcome.add_argument(
        "--rerun", action="store_true", help="it did not happen: the next run calls it"
    )

    p = command("resume", cmd_resume, "make a paused workflow claimable, with its input")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--input", type=input_value, metavar="JSON", help="its next run's input")

    p = command("retry", cmd_retry, "make a failed or cancelled workflow claimable again")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")

    p = command("cancel", cmd_cancel, "cancel a workflow: its runner stops at its next step")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--reason", metavar="TEXT", help="why (kept on the workflow's record)")

    p = command("verify", cmd_verify, "decode and check every checkpoint; exit 1 if corrupted")
    p.add_argument("url", metavar="URL")

    p = command("prune", cmd_prune, "keep only the newest N checkpoints of each workflow")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW", nargs="?")
    p.add_argument("--keep", type=_positive, required=True, metavar="N")
    p.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    _sweep_command(command("sweep", cmd_sweep, "apply a retention policy: thin, expire, GC"))

    p = command("compact", cmd_compact, "give unused space back to the filesystem (VACUUM)")
    p.add_argument("url", metavar="URL")

    p = command("rm", cmd_rm, "delete one checkpoint, or a whole workflow")
    p.add_argument("url", metavar="URL")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("step", metavar="STEP", type=_step, nargs="?")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask before deleting")

    p = command("fork", cmd_fork, "a new workflow from another's history up to a step")
    p.add_argument("url", metavar="URL")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("step", metavar="STEP", type=_step)
    p.add_argument("new_id", metavar="NEW_ID")

    p = command("copy", cmd_copy, "copy every checkpoint into another store (resumable)")
    p.add_argument("src", metavar="SRC_URL")
    p.add_argument("dst", metavar="DST_URL")
    p.add_argument("--overwrite", action="store_true", help="replace differing records")

    p = command("export", cmd_export, "write a store to a JSON-lines file ('-': stdout)")
    p.add_argument("url", metavar="URL")
    p.add_argument("file", metavar="FILE.jsonl")
    p.add_argument(
        "--plaintext", action="store_true", help="write encrypted records decrypted (--keys)"
    )

    p = command("rekey", cmd_rekey, "re-encrypt every record under the primary key (resumable)")
    p.add_argument("url", metavar="URL")

    p = command("encrypt", cmd_encrypt, "encrypt every plaintext record of a store (resumable)")
    p.add_argument("url", metavar="URL")

    p = command("import", cmd_import, "load a JSON-lines export into a store ('-': stdin)")
    p.add_argument("file", metavar="FILE.jsonl")
    p.add_argument("url", metavar="URL")
    p.add_argument("--overwrite", action="store_true", help="replace differing records")

    p = command(
        "serve", cmd_serve, "a web inspector of the store, read-only by default (the web extra)"
    )
    p.add_argument("url", metavar="URL")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=_port, default=8420, help="port to listen on (8420)")
    p.add_argument(
        "--token", help=f"require this token on every request (default: ${TOKEN_VARIABLE})"
    )
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="offer resume, retry, cancel and effect resolve (needs a token)",
    )
    return parser


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 0 and 65535, got {value}")
    return value


def _sweep_command(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL")
    p.add_argument("--keep-last", type=_positive, metavar="N", help="keep the newest N")
    p.add_argument("--keep-every", type=_positive, metavar="K", help="and every K-th step")
    p.add_argument(
        "--keep-interval", type=duration, metavar="DURATION", help="and one per interval (1h)"
    )
    p.add_argument(
        "--drop-terminal", action="store_true", help="thin FAILED/COMPLETED checkpoints too"
    )
    p.add_argument("--thin-paused", action="store_true", help="thin paused workflows too")
    p.add_argument("--finished-ttl", type=duration, metavar="DURATION", help="e.g. 30d")
    p.add_argument("--failed-ttl", type=duration, metavar="DURATION", help="e.g. 90d")
    p.add_argument("--idle-ttl", type=duration, metavar="DURATION", help="unfinished, untouched")
    p.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    p.add_argument("--no-gc", action="store_true", help="do not collect garbage blobs after")
