"""The inspector's ASGI application: routes, templates and the safety headers.

Read-only by default: every route is a GET that reads through the manager; only an app
built with ``allow_actions`` adds the POST routes of :mod:`.actions`. Every value from the store
reaches the page through Jinja2's autoescaping, and through :func:`shown`, which also makes
control and bidirectional characters visible as escapes, so an id cannot reorder or hide
the text around it. The Content-Security-Policy allows no script at all and styles only
from the app's own static file.
"""

from __future__ import annotations

import hmac
import json
import unicodedata
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..codec import locked_view
from ..errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError, LeaseError
from ..manager import CheckpointManager
from ..urls import redacted
from . import actions, charts, data, diff, history, store, timeline, tree

__all__ = ["HEADERS", "LOOPBACK_NAMES", "create_app", "shown"]

_HERE: Final = Path(__file__).parent
#: Sent with every response.
HEADERS: Final = {
    "content-security-policy": (
        "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
#: The Host names a loopback-bound inspector answers to (others: DNS rebinding).
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1", "[::1]")
#: The cookie a token given once as ``?token=`` is kept in.
COOKIE: Final = "aiocheckpoint_token"
#: Characters written as ``\\uXXXX``: controls, format (bidi, zero-width), separators.
_ESCAPED: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def shown(value: object, lines: bool = False) -> str:
    """``value`` as text with control, format and bidi characters written as escapes.

    With ``lines`` a newline stays one (JSON indented for a ``<pre>``). A sealed field's
    text (an encrypted store's error message, say) is shown as ``[sealed: key ID]``.
    """
    value = locked_view(value)  # a sealed field read without keys: its key id, not the token
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_visible(c, lines) for c in text)


def _visible(char: str, lines: bool) -> str:
    if char == "\n" and lines:
        return char
    if unicodedata.category(char) in _ESCAPED:
        return f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}"
    return char


def _json(value: object, indent: int | None = None) -> str:
    """``value`` as JSON text (escaped later, like every text)."""
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str, sort_keys=True)


def _link(target: str, **params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v is not None and v != ""})
    return f"{target}?{query}" if query else target


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"), autoescape=True, auto_reload=False
    )
    env.filters["shown"] = shown
    env.filters["json"] = _json
    env.globals["link"] = _link
    return env


class _Headers:
    """Adds :data:`HEADERS` to every response; with a token, refuses requests without it."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [
                    (k.encode(), v.encode())
                    for k, v in HEADERS.items()
                    if k.encode() not in present
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        response = self._gate(Request(scope))
        if response is not None:
            await response(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)

    def _gate(self, request: Request) -> Response | None:
        """None to let the request through; else the refusal (or the cookie's setting)."""
        if self.token is None:
            return None
        given = request.query_params.get("token")
        if given is not None and _same(given, self.token):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            # The decoded path, percent-encoded again after one leading slash: "//host" and
            # "/\\host" would send the browser to another site.
            path = quote(str(request.scope["path"]).lstrip("/\\"), safe="/")
            target = "/" + path + (f"?{urlencode(rest)}" if rest else "")
            reply = RedirectResponse(target, status_code=303)
            reply.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return reply
        header = request.headers.get("authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else None
        for candidate in (bearer, request.cookies.get(COOKIE)):
            if candidate is not None and _same(candidate, self.token):
                return None
        return PlainTextResponse("a token is required: open the URL serve printed", 401)


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


def create_app(
    manager: CheckpointManager,
    url: str,
    *,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    allow_actions: bool = False,
) -> ASGIApp:
    """The inspector over ``manager`` (whose store ``url`` names; shown redacted).

    With ``token`` every request must carry it (``Authorization: Bearer``, or the cookie
    set by visiting once with ``?token=``). ``allowed_hosts`` limits the Host header (the
    loopback names when bound to loopback, against DNS rebinding). With ``allow_actions``
    the workflow page has forms for the operator's actions (:mod:`.actions`), each a POST
    checked against CSRF; without it there is no route that writes.
    """
    env = _environment()
    env.globals["store_url"] = redacted(url)
    env.globals["actions"] = allow_actions
    pages = _Pages(manager, url, env, actions.Csrf() if allow_actions else None)
    routes = [
        Route("/", pages.workflows),
        Route("/workflow", pages.workflow),
        Route("/step", pages.step),
        Route("/diff", pages.diff),
        Route("/throughput", pages.throughput),
        Route("/store", pages.store),
        *([Route("/action/{name}", pages.action, methods=["POST"])] if allow_actions else []),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])]
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={})
    return _Headers(app, token)


class _Pages:
    """The route handlers: each reads what its page shows and renders its template."""

    def __init__(
        self, manager: CheckpointManager, url: str, env: Environment, csrf: actions.Csrf | None
    ) -> None:
        self.manager = manager
        self.url = url
        self.env = env
        self.csrf = csrf

    def render(
        self,
        name: str,
        context: dict[str, Any],
        code: int = 200,
        request: Request | None = None,
    ) -> HTMLResponse:
        """The page; with actions allowed and ``request`` given, its forms' CSRF token."""
        cookie, fresh = None, False
        if self.csrf is not None and request is not None:
            cookie = request.cookies.get(actions.CSRF_COOKIE)
            fresh = cookie is None
            cookie = cookie or self.csrf.new_cookie()
            context = {**context, "csrf": self.csrf.token(cookie)}
        html = self.env.get_template(name).render(**context)
        response = HTMLResponse(html, status_code=code)
        if cookie is not None and fresh:
            response.set_cookie(actions.CSRF_COOKIE, cookie, httponly=True, samesite="strict")
        return response

    async def action(self, request: Request) -> Response:
        """An operator's action (a POST with a CSRF token); back to the workflow's page."""
        assert self.csrf is not None
        try:
            form = await actions.read_form(request)
            self.csrf.check(request, form)
            workflow_id = await actions.run_action(
                self.manager, str(request.path_params["name"]), form
            )
        except actions.ActionRefused as exc:
            return PlainTextResponse(str(exc), exc.status)
        except CheckpointError as exc:
            return self.failed(exc)
        return RedirectResponse(_link("/workflow", id=workflow_id), status_code=303)

    def failed(self, exc: CheckpointError) -> HTMLResponse:
        status = 404 if isinstance(exc, CheckpointNotFoundError) else 400
        if isinstance(exc, LeaseError):
            status = 409
        elif not isinstance(exc, (CheckpointNotFoundError, InvalidArgumentError)):
            status = 500
        message = f"{type(exc).__name__}: {redacted(str(exc))}"
        return self.render("error.html", {"message": message}, status)

    async def workflows(self, request: Request) -> Response:
        q = request.query_params
        status, prefix, after = q.get("status", ""), q.get("q", ""), q.get("after")
        try:
            rows, next_after = await data.list_workflows(
                self.manager, status=status, prefix=prefix, after=after
            )
            in_doubt, doubt_after = await data.in_doubt_ids(self.manager, q.get("doubt_after"))
            counts = await data.count_statuses(self.manager)
        except CheckpointError as exc:
            return self.failed(exc)
        context = {
            "rows": rows,
            "next_after": next_after,
            "counts": counts,
            "status": status,
            "prefix": prefix,
            "records": self.manager.supports_workflow_records(),
            "in_doubt": in_doubt,
            "doubt_after": doubt_after,
        }
        return self.render("workflows.html", context)

    async def workflow(self, request: Request) -> Response:
        q = request.query_params
        try:
            before = _int(q.get("before"))
            view = await data.workflow_view(self.manager, self.url, q.get("id", ""), before)
            events = await history.read_history(
                self.manager, view.workflow_id, q.get("events") or None
            )
        except CheckpointError as exc:
            return self.failed(exc)
        found = view.record or view.steps or view.effects or view.effects_problem or events.rows
        if not found and before is None:
            return self.failed(CheckpointNotFoundError(view.workflow_id))
        end = view.record.updated_at if view.record is not None else None
        spans = timeline.workflow_spans(view)
        spans += history.event_spans(view.workflow_id, events, end)
        context = {
            "view": view,
            "timeline": charts.timeline(spans),
            "history": events,
            "events_page": history.EVENTS,
            "timeline_events": history.TIMELINE_EVENTS,
        }
        return self.render("workflow.html", context, request=request)

    async def step(self, request: Request) -> Response:
        q = request.query_params
        try:
            number = _int(q.get("step"))
            if number is None:
                raise InvalidArgumentError("which step? (?step=N)")
            workflow_id = q.get("id", "")
            path = tree.parse_path(q.get("path", ""))
            offset = _int(q.get("offset")) or 0
            checkpoint, problem, effects, value = await data.load_step(
                self.manager, workflow_id, number, path, offset
            )
            root = None
            if checkpoint is not None:
                root = tree.build_tree(value, path, offset)
        except CheckpointError as exc:
            return self.failed(exc)
        if checkpoint is None and not effects and problem == "no checkpoint at this step":
            return self.failed(CheckpointNotFoundError(workflow_id, number))
        context = {
            "workflow_id": workflow_id,
            "step": number,
            "checkpoint": checkpoint,
            "problem": problem,
            "effects": effects,
            "root": root,
            "path": path,
        }
        return self.render("step.html", context)

    async def diff(self, request: Request) -> Response:
        q = request.query_params
        try:
            number = _int(q.get("step"))
            if number is None:
                raise InvalidArgumentError("which step? (?step=N)")
            against, offset = _int(q.get("against")), _int(q.get("offset")) or 0
            view = await diff.load_diff(self.manager, q.get("id", ""), number, against, offset)
        except CheckpointError as exc:
            return self.failed(exc)
        return self.render("diff.html", {"view": view})

    async def throughput(self, request: Request) -> Response:
        try:
            minutes = _int(request.query_params.get("minutes")) or 60
            view = await timeline.throughput(self.manager, minutes)
        except CheckpointError as exc:
            return self.failed(exc)
        context = {"view": view, "series": timeline.SERIES, "sample": timeline.SAMPLE}
        return self.render("throughput.html", context)

    async def store(self, request: Request) -> Response:
        q = request.query_params
        try:
            facts = await store.store_facts(self.manager)
            counts = await data.count_statuses(self.manager)
            checked = None
            if q.get("verify"):
                after = q.get("after") or None
                checked = await store.verify_page(self.manager, after, _int(q.get("from")))
        except CheckpointError as exc:
            return self.failed(exc)
        context = {"facts": facts, "counts": counts, "checked": checked, "after": q.get("after")}
        return self.render("store.html", context)


def _int(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    if not text.isdigit() or len(text) > 19:
        raise InvalidArgumentError(f"not a step number: {text[:40]!r}")
    return int(text)
