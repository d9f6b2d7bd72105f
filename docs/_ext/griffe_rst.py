"""Griffe extension for the docs site: reST-flavoured docstrings to Markdown.

aiocheckpoint's docstrings are written for plain ``help()`` in a reST style: roles such as
``:class:`~aiocheckpoint.CheckpointManager``` and ``:meth:`close```, ``literals`` in double
backticks (already valid Markdown) and paragraphs ending in ``::`` that introduce an indented
literal block. mkdocstrings renders Markdown, so before docstrings are parsed this extension:

- turns each role into a cross-reference to the object it names, resolved the way Sphinx
  would (relative to the docstring's object, or an absolute dotted path). The reference is
  *optional*: when the target is not on the site (a private helper), it renders as code.
  A role naming nothing that exists is a warning, so ``mkdocs build --strict`` fails on it;
- turns every ``::`` literal block into a fenced code block (``python`` when it parses as
  Python, ``text`` otherwise).

mkdocs.yml loads it by path (``extensions: [docs/_ext/griffe_rst.py]``); mkdocs does not
publish docs/_ext (``exclude_docs``).
"""

from __future__ import annotations

import ast
import logging
import re
import textwrap
from html import escape
from typing import Any

import griffe

# A logger under "mkdocs" so that a warning counts for `mkdocs build --strict`.
_log = logging.getLogger("mkdocs.plugins.aiocheckpoint_docs")

_ROLE = re.compile(
    r":(?:py:)?(?P<role>class|meth|func|attr|exc|data|obj|mod|const):"
    r"`(?P<body>[^`]+)`"
)
_EXPLICIT_TITLE = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")
_CALLABLE_ROLES = {"meth", "func"}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_python(code: str) -> bool:
    try:
        compile(code, "<docstring>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return False
    return True


def fence_literal_blocks(text: str) -> str:
    """Replace each reST ``::`` literal block of ``text`` by a fenced Markdown code block."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip()
        if not stripped.endswith("::") or stripped.lstrip().startswith(".."):
            out.append(line)
            i += 1
            continue
        lead = stripped[:-2]
        if lead.strip():
            # "Text::" reads "Text:"; "Text ::" reads "Text".
            out.append(lead.rstrip() if lead.endswith(" ") else f"{lead}:")
        base = _indent(line)
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
            j += 1
        block = lines[i + 1 : j]
        while block and not block[-1].strip():
            block.pop()
        if block:
            code = textwrap.dedent("\n".join(block)).strip("\n")
            language = "python" if _is_python(code) else "text"
            pad = " " * base
            out += ["", f"{pad}```{language}"]
            out += [f"{pad}{row}" if row else "" for row in code.splitlines()]
            out += [f"{pad}```", ""]
        i = j
    return "\n".join(out)


def _exists(obj: griffe.Object, path: str) -> bool:
    try:
        obj.modules_collection[path]
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path of ``target`` as seen from ``obj``'s docstring, or None.

    In a class, or a method of one, a member's name also finds the members the class
    inherits, and those of the classes that inherit from it (a part of a class's API
    defined with what it delegates to, such as the manager's, names its siblings).
    """
    target = target.lstrip(".")
    if _exists(obj, target):
        return target
    first, _, rest = target.partition(".")
    try:
        path = obj.resolve(first)
    except griffe.NameResolutionError:
        return _in_class(obj, target)
    full = f"{path}.{rest}" if rest else path
    return full if _exists(obj, full) else None


def _in_class(obj: griffe.Object, target: str) -> str | None:
    """``target`` as a member of ``obj``'s class or of one of its subclasses, or None."""
    cls: griffe.Object | None = obj if obj.is_class else obj.parent
    if cls is None or not cls.is_class:
        return None
    for owner in [cls.path, *_SUBCLASSES.get(cls.path, ())]:
        if _exists(obj, f"{owner}.{target}"):
            return f"{owner}.{target}"
    return None


#: The classes of the package that inherit from each class, by path (see :func:`resolve`).
_SUBCLASSES: dict[str, list[str]] = {}


def _index_subclasses(obj: griffe.Object) -> None:
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            for base in member.resolved_bases:  # type: ignore[union-attr]
                _SUBCLASSES.setdefault(base.path, []).append(member.path)
        if member.is_module or member.is_class:
            _index_subclasses(member)  # type: ignore[arg-type]


def link_roles(obj: griffe.Object, text: str) -> str:
    """Replace the Sphinx roles of ``obj``'s docstring ``text`` by optional cross-refs."""

    def replace(match: re.Match[str]) -> str:
        body = match["body"].strip()
        explicit = _EXPLICIT_TITLE.match(body)
        if explicit:
            title, target = explicit["title"], explicit["target"].lstrip("~")
        else:
            target = body.lstrip("~")
            title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
            if match["role"] in _CALLABLE_ROLES:
                title += "()"
        path = resolve(obj, target)
        code = f"<code>{escape(title)}</code>"
        if path is None:
            _log.warning("griffe_rst: %s: %s names nothing that exists", obj.path, match.group(0))
            return code
        return f'<autoref identifier="{escape(path)}" optional>{code}</autoref>'

    return _ROLE.sub(replace, text)


class RestDocstrings(griffe.Extension):
    """Rewrite every docstring of a loaded package from reST conventions to Markdown."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite the docstrings of ``pkg`` and all its members, once it is fully loaded."""
        _index_subclasses(pkg)
        self._rewrite(pkg)

    def _rewrite(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            value = fence_literal_blocks(obj.docstring.value)
            obj.docstring.value = link_roles(obj, value)
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member)  # type: ignore[arg-type]
