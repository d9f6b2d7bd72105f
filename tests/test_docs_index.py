"""The docs' front page is the map of the library: it links every page of the guide."""

from __future__ import annotations

import re

from .test_docs import DOCS

_PAGE_LINK = re.compile(r"\]\((?P<page>[\w-]+\.md)(?:#[\w-]+)?\)")


def test_the_front_page_links_every_page() -> None:
    """Each docs/*.md page is reachable from docs/index.md by a link, so none is left off."""
    linked = set(_PAGE_LINK.findall((DOCS / "index.md").read_text(encoding="utf-8")))
    pages = {page.name for page in DOCS.glob("*.md")} - {"index.md"}
    assert len(pages) > 10
    assert sorted(pages - linked) == []


def test_the_site_navigation_lists_every_page() -> None:
    """mkdocs.yml's nav names every page of docs/ (and docs/reference/) exactly once."""
    nav = (DOCS.parent / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    listed = re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w/-]+\.md)\s*$", nav, re.MULTILINE)
    pages = {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")}
    pages = {page for page in pages if not page.startswith("_")}
    assert sorted(listed) == sorted(pages)
