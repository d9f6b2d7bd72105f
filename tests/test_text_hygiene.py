"""The code and the user docs describe what is, not how it came to be.

Comments, docstrings and pages in ``src/`` and ``docs/`` cite no issue numbers and carry no
lab-notebook clock stamps ("07:10-08:20 UTC"): history lives in git and CHANGELOG.md, and
the measurement notes in bench/NOTES.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = (ROOT / "src", ROOT / "docs")
SUFFIXES = {".py", ".pyi", ".md", ".txt", ".yml", ".yaml", ".toml", ".cfg", ".ini"}

#: "issue 21", "Issue #6", "issues #6 and #9", "issue #6/#9", "PR #12", "pull request 3".
_ISSUE = re.compile(r"\b(?:issues?|pr|pull requests?)\s*#?\d+", re.IGNORECASE)
#: A time of day in UTC, alone or as a span: "13:44 UTC", "07:10-08:20 UTC".
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}(?:\s*-\s*\d{1,2}:\d{2})?\s*UTC\b")


def _findings(text: str) -> list[str]:
    return [m[0] for pattern in (_ISSUE, _CLOCK) for m in pattern.finditer(text)]


def _files() -> list[Path]:
    return sorted(
        path
        for top in CHECKED
        for path in top.rglob("*")
        if path.is_file() and path.suffix in SUFFIXES and ".venv" not in path.parts
    )


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("the fix for issue 23 (the", ["issue 23"]),
        ("### Large states (20 x 1 MB; issues #6 and #9)", ["issues #6"]),
        ("(2026-11-29, issue #6/#9 large states)", ["issue #6"]),
        ("Targets (Issue 6): >= 10x", ["Issue 6"]),
        ("(issue 21, fifth part, 2026-12-02 07:10-08:20 UTC)", ["issue 21", "07:10-08:20 UTC"]),
        ("run 2026-11-29 ~19:05 UTC):", ["19:05 UTC"]),
        ("see PR #12", ["PR #12"]),
        ("keys ``#0``, ``#1`` within a step; 2026-01-31 12:00:07Z; timezone.utc", []),
        ("the issuer 5 times; tissue 3", []),
    ],
)
def test_the_patterns_catch_issue_numbers_and_clock_stamps(text: str, found: list[str]) -> None:
    """The check is not vacuous: it finds what it should and passes ordinary text."""
    assert _findings(text) == found


def test_the_check_reads_the_source_and_the_pages() -> None:
    """The walk reaches the package's modules and the docs pages it is meant to police."""
    names = {path.relative_to(ROOT).as_posix() for path in _files()}
    assert "src/aiocheckpoint/manager.py" in names
    assert "docs/index.md" in names and "docs/performance.md" in names


def test_src_and_docs_cite_no_issue_numbers_or_clock_stamps() -> None:
    """No file under src/ or docs/ mentions an issue number or a clock time in UTC."""
    offending = [
        f"{path.relative_to(ROOT)}:{number}: {hit!r}"
        for path in _files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for hit in _findings(line)
    ]
    assert offending == [], "\n".join(offending)
