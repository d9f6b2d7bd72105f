"""Terminal output for the command line: tables, colours, values, progress and JSON.

Everything printed from a store is treated as hostile: characters that are not printable
(controls, C1 controls, bidi overrides) are escaped, in text and in JSON alike, and ints too
long to convert in reasonable time are shortened (see :func:`int_text`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, Final, TextIO

from ..codec import int_to_decimal, with_long_ints
from ..format.jsonread import BIG_INT_BITS, is_digit_limit
from .store import EXIT_STORE, CommandError, Foreign

__all__ = [
    "MAX_INT_DIGITS",
    "Output",
    "Progress",
    "bar",
    "compact",
    "dumps",
    "int_text",
    "note_foreign",
    "printable",
    "when",
]

#: Ints with more digits print shortened: the first and last digits and how many there are.
#: Converting an int to decimal takes time quadratic in its length (~2 ms at this size), so
#: the time to print a record stays proportional to its size whatever ints it holds.
MAX_INT_DIGITS: Final = 10_000
_EDGE: Final = 20  # digits kept at each end of a shortened int
_LOG10_2: Final = 0.30102999566398120
_CHUNK: Final = 4096

_STYLES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "cyan": "36",
}
_STATUS_STYLES = {
    "completed": "green",
    "finished": "green",
    "failed": "red",
    "corrupted": "red",
    "unreadable": "yellow",
    "running": "yellow",
    "blocked": "yellow",
    "unfinished": "yellow",
}


def printable(text: str, *, json_escapes: bool = False) -> str:
    r"""``text`` with control, bidi and other unprintable characters escaped.

    Escapes are Python's (``\x9b``, ``\u202e``), or JSON's (``\u009b``) with
    ``json_escapes``, which keeps a JSON document valid and equal to the original.
    """
    if text.isprintable():
        return text
    escape = _json_escape if json_escapes else _python_escape
    # Clean stretches are checked in C; only a stretch holding a bad character is walked.
    return "".join(
        chunk
        if chunk.isprintable()
        else "".join(c if c.isprintable() else escape(c) for c in chunk)
        for chunk in (text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK))
    )


def _python_escape(char: str) -> str:
    return repr(char)[1:-1]


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def _printable_lines(text: str, *, json_escapes: bool = False) -> str:
    # Line breaks laid out by json.dumps(indent=...) stay; those inside strings are escaped.
    return "\n".join(printable(line, json_escapes=json_escapes) for line in text.split("\n"))


def int_text(n: int) -> str:
    """An int in decimal; past MAX_INT_DIGITS, ``first…last (N digits)`` instead."""
    if n.bit_length() <= BIG_INT_BITS:
        return str(n)
    sign, n = ("-", -n) if n < 0 else ("", n)
    digits, top = _magnitude(n)
    if digits <= MAX_INT_DIGITS:
        return sign + int_to_decimal(n)
    first = n // (top // 10 ** (_EDGE - 1))
    last = str(n % 10**_EDGE).rjust(_EDGE, "0")
    return f"{sign}{first}…{last} ({digits} digits)"


def _magnitude(n: int) -> tuple[int, int]:
    """How many decimal digits ``n > 0`` has, and 10 to the power of that count minus one."""
    digits = int(n.bit_length() * _LOG10_2) + 1
    top = 10 ** (digits - 1)
    while top > n:
        digits, top = digits - 1, top // 10
    while top * 10 <= n:
        digits, top = digits + 1, top * 10
    return digits, top


def dumps(value: Any, *, indent: int | None = None, json_mode: bool = False) -> str:
    """``value`` as JSON text fit for a terminal.

    Unprintable characters are escaped; long ints are shortened (as strings in
    ``json_mode``, so the document stays valid JSON).
    """
    separators = (", ", ": ") if indent is None else None
    try:
        try:
            text = json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)
        except ValueError as exc:
            if not is_digit_limit(exc):
                raise
            text = _dumps_long_ints(value, indent, separators, json_mode)
    except RecursionError:
        raise CommandError("the value is nested too deeply to print", EXIT_STORE) from None
    return _printable_lines(text, json_escapes=json_mode)


def _dumps_long_ints(
    value: Any, indent: int | None, separators: tuple[str, str] | None, json_mode: bool
) -> str:
    def encode(item: Any) -> str:
        return json.dumps(item, ensure_ascii=False, indent=indent, separators=separators)

    def shown(n: int) -> str:
        text = int_text(n)
        # A shortened int is a string in JSON mode, so the document stays valid JSON.
        return json.dumps(text) if json_mode and not text.lstrip("-").isdigit() else text

    return with_long_ints(value, encode, shown)


def compact(value: Any, width: int | None = None) -> str:
    """A value as one line of JSON, cut to ``width`` characters when given."""
    text = dumps(value)
    if width is not None and len(text) > width:
        text = text[: max(width - 1, 1)] + "…"
    return text


def when(moment: datetime | None) -> str:
    """A timestamp as UTC seconds, ``2026-01-31 12:00:00Z``, or ``-``."""
    if moment is None:
        return "-"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def bar(done: int, total: int, width: int = 20) -> str:
    """A text progress bar, ``[#######-------------] 7/20``."""
    filled = width if total <= 0 else min(width, width * done // total)
    return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total}"


def _colour_enabled(stream: TextIO) -> bool:
    # https://no-color.org: any non-empty NO_COLOR disables colour.
    return not os.environ.get("NO_COLOR") and _isatty(stream)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Output:
    """Where a command writes: results on stdout, progress and prompts on stderr."""

    def __init__(
        self, stdout: TextIO | None = None, stderr: TextIO | None = None, *, json_mode: bool
    ) -> None:
        self.out = stdout if stdout is not None else sys.stdout
        self.err = stderr if stderr is not None else sys.stderr
        self.json_mode = json_mode
        self.colour = _colour_enabled(self.out)
        self.tty = _isatty(self.out)

    def style(self, text: str, *styles: str) -> str:
        """``text`` wrapped in ANSI styles when colour is on."""
        if not self.colour or not styles:
            return text
        codes = ";".join(_STYLES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def status(self, text: str) -> str:
        """A status word, coloured by what it means."""
        style = _STATUS_STYLES.get(text.lower())
        return self.style(text, style) if style else text

    def line(self, text: str = "") -> None:
        """Write one line to stdout."""
        self.out.write(text + "\n")

    def note(self, text: str) -> None:
        """Write one line to stderr (hints and warnings that are not the result), escaped."""
        self.err.write(printable(text) + "\n")
        self.err.flush()

    def json(self, value: Any) -> None:
        """Write ``value`` as one JSON document on stdout (see :func:`dumps`)."""
        self.out.write(dumps(value, indent=2, json_mode=True) + "\n")

    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        fit: int = 0,
        statuses: Sequence[int] = (),
    ) -> None:
        """Write an aligned table; on a terminal, column ``fit`` is cut to fit its width.

        Cells are plain text; the columns in ``statuses`` are coloured after alignment so
        escapes never count towards a column's width.
        """
        rows = [[printable(cell) for cell in row] for row in rows]
        widths = [len(h) for h in headers]
        for row in rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=False)]
        if self.tty:
            spare = shutil.get_terminal_size().columns - (sum(widths) + 2 * (len(widths) - 1))
            if spare < 0:
                widths[fit] = max(len(headers[fit]), widths[fit] + spare)
        self.line(self._row(headers, widths, lambda i, c: self.style(c, "bold")))
        for row in rows:
            self.line(self._row(row, widths, lambda i, c: self.status(c) if i in statuses else c))

    def _row(
        self, cells: Sequence[str], widths: list[int], paint: Callable[[int, str], str]
    ) -> str:
        parts = []
        for i, (cell, width) in enumerate(zip(cells, widths, strict=False)):
            if len(cell) > width:
                cell = cell[: max(width - 1, 0)] + "…"
            pad = " " * (width - len(cell))
            text = paint(i, cell)
            last = i == len(widths) - 1
            parts.append(text if last else text + pad)
        return "  ".join(parts).rstrip()


class Progress:
    """A one-line progress indicator on stderr, drawn only when stderr is a terminal."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 0.1) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = _isatty(self._stream)
        self._interval = interval
        self._last = 0.0
        self._shown = False

    def update(self, text: str, *, force: bool = False) -> None:
        """Redraw the line with ``text`` (at most every ``interval`` seconds)."""
        if not self._enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        width = shutil.get_terminal_size().columns - 1
        self._stream.write("\r\x1b[K" + text[:width])
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Erase the line so the result that follows starts clean."""
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = False


def note_foreign(out: Output, foreign: Sequence[Foreign]) -> None:
    """Tell, on stderr, of the store's foreign rows a command skipped."""
    for row in foreign:
        out.note(f"foreign row skipped: workflow id {printable(row.shown)}: {row.reason}")
