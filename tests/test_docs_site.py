"""The documentation site builds with ``mkdocs build --strict``, and its API reference is real.

The site is built once per test session into a temporary directory, in a subprocess, from
the repository's mkdocs.yml. These tests need the ``docs`` extra (mkdocs, mkdocs-material,
mkdocstrings-python); without it they fail, they do not skip.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import aiocheckpoint
import aiocheckpoint.testing
from aiocheckpoint import CheckpointManager

from .test_docs import DOCS, ROOT, _anchors

REQUIRED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "griffe")
BUILD_TIMEOUT_SECONDS = 300
#: One build for all of them: under pytest-xdist the module runs on one worker, queued first
#: (the build takes about a minute on a loaded machine).
pytestmark = [pytest.mark.xdist_group("docs-site"), pytest.mark.slow]

#: Backends that aiocheckpoint exports lazily (module ``__getattr__``, name -> module): the
#: reference names them by their module path.
LAZY = {name: f"{module}.{name}" for name, module in aiocheckpoint._BACKENDS.items()}

#: The Splinter API names the reference must document, whatever else the class grows.
SPLINTER_METHODS = (
    "create_checkpoint",
    "get_latest_checkpoint",
    "get_resume_point",
    "list_checkpoints",
    "delete_checkpoints",
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        return False


def _require_docs_extra() -> None:
    missing = [module for module in REQUIRED if not _installed(module)]
    if missing:
        pytest.fail(
            f"building the docs site needs the `docs` extra (missing: {', '.join(missing)}); "
            "install it with: pip install -e '.[docs]'",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site: ``mkdocs build --strict`` must succeed without a single warning."""
    _require_docs_extra()
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, output
    return out


class _Page(HTMLParser):
    """The element ids, heading ids, link targets and text of one built page."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.heading_ids: list[str] = []
        self.hrefs: list[str] = []
        self.text: list[str] = []
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
            if re.fullmatch(r"h[1-6]", tag):
                self.heading_ids.append(str(values["id"]))
        if tag == "a" and values.get("href"):
            self.hrefs.append(str(values["href"]))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def plain(self) -> str:
        return re.sub(r"\s+", " ", "".join(self.text))


def _page(site: Path, page: str) -> _Page:
    path = site / page / "index.html" if page else site / "index.html"
    assert path.exists(), f"{path} was not built"
    return _Page(path)


def _public_methods(cls: type) -> list[str]:
    return [
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    ]


def test_site_builds_strictly(site: Path) -> None:
    """mkdocs build --strict succeeds and produces the home page and the API reference."""
    assert (site / "index.html").exists()
    assert (site / "reference" / "manager" / "index.html").exists()


def test_manager_reference_documents_every_public_method(site: Path) -> None:
    """The CheckpointManager page has an entry, with its docstring, for each public method."""
    page = _page(site, "reference/manager")
    methods = _public_methods(CheckpointManager)
    assert set(SPLINTER_METHODS) <= set(methods)
    for name in methods:
        assert f"aiocheckpoint.CheckpointManager.{name}" in page.ids, f"{name} is not documented"
        doc = inspect.getdoc(getattr(CheckpointManager, name))
        assert doc, f"CheckpointManager.{name} has no docstring"
        first_words = re.sub(r":\w+:`~?([\w.]+)`", r"\1", doc.split("\n")[0]).split()[:4]
        assert " ".join(first_words).replace("``", "") in page.plain, name


def test_docstring_roles_become_links(site: Path) -> None:
    """A :meth: role in a docstring renders as a link to the method, not as reST markup."""
    page = _page(site, "reference/manager")
    # get_latest_checkpoint's docstring points at get_resume_point with :meth:.
    assert "#aiocheckpoint.CheckpointManager.get_resume_point" in page.hrefs
    assert "../errors/#aiocheckpoint.CheckpointNotFoundError" in page.hrefs
    for html_file in (site / "reference").rglob("*.html"):
        text = _Page(html_file).plain
        assert not re.search(r":(class|meth|func|attr|mod|data|exc):", text), html_file
        assert "```" not in text, html_file


def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    """Each name of aiocheckpoint.__all__ and aiocheckpoint.testing.__all__ is documented."""
    ids: set[str] = set()
    for html_file in (site / "reference").rglob("index.html"):
        ids |= _Page(html_file).ids
    wanted = [
        LAZY.get(name, f"aiocheckpoint.{name}")
        for name in aiocheckpoint.__all__
        if name != "__version__"
    ]
    wanted += [f"aiocheckpoint.testing.{name}" for name in aiocheckpoint.testing.__all__]
    missing = [path for path in wanted if path not in ids]
    assert missing == [], f"add a `::: <path>` line to a docs/reference page for: {missing}"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_link_check_anchors_agree_with_mkdocs(site: Path, page: Path) -> None:
    """The heading ids test_docs.py computes for a page are those mkdocs gave it."""
    built = _page(site, "" if page.stem == "index" else page.stem)
    assert set(built.heading_ids) == _anchors(page)


def test_griffe_extension_rewrites_rest(caplog: pytest.LogCaptureFixture) -> None:
    """The extension fences ``::`` blocks and warns (failing --strict) on a role naming nothing."""
    _require_docs_extra()
    import griffe

    spec = importlib.util.spec_from_file_location("griffe_rst", DOCS / "_ext" / "griffe_rst.py")
    assert spec is not None and spec.loader is not None
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)

    fenced = ext.fence_literal_blocks("Use it::\n\n    x = 1\n\nThe tree ::\n\n    a ├── b\n\nEnd.")
    assert fenced == "Use it:\n\n```python\nx = 1\n```\n\nThe tree\n\n```text\na ├── b\n```\n\nEnd."

    package = griffe.load("aiocheckpoint", search_paths=[str(ROOT / "src")])
    method = package["CheckpointManager.get_latest_checkpoint"]
    roles = "see :meth:`get_resume_point` and :class:`~aiocheckpoint.Lease`"
    linked = ext.link_roles(method, roles)
    assert 'identifier="aiocheckpoint.manager.CheckpointManager.get_resume_point"' in linked
    assert "<code>get_resume_point()</code>" in linked
    assert "<code>Lease</code>" in linked
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        assert ext.link_roles(method, ":meth:`get_resum_point`") == "<code>get_resum_point()</code>"
    assert "names nothing that exists" in caplog.text
