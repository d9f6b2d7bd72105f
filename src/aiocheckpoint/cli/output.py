"""Terminal output for the command line: tables, colours, values, progress and JSON."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

__all__ = ["Output", "Progress", "bar", "compact", "printable", "when"]

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
    "running": "yellow",
    "blocked": "yellow",
    "unfinished": "yellow",
}


def printable(text: str) -> str:
    """``text`` with control and other unprintable characters escaped (ids are arbitrary)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def compact(value: Any, width: int | None = None) -> str:
    """A value as one line of JSON, cut to ``width`` characters when given."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
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
        """Write one line to stderr (hints and warnings that are not the result)."""
        self.err.write(text + "\n")
        self.err.flush()

    def json(self, value: Any) -> None:
        """Write ``value`` as one JSON document on stdout."""
        self.out.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")

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
