"""Operator actions in the inspector: resume with input, retry, cancel, settle an effect.

Off unless the app is built with ``allow_actions`` (``serve --allow-actions``, which also
requires a token). Each action is a ``POST`` of a form that carries a CSRF token: an HMAC,
under a secret made when the app starts, of a random value kept in an HttpOnly,
SameSite=Strict cookie. A POST whose token does not match its cookie, whose ``Origin``
names another site (under the pages' no-referrer policy a browser sends ``null``, which
names none), or whose body is over :data:`MAX_BODY` bytes is refused and changes
nothing.

Each action calls what the command line calls, so each takes the workflow's lease as the
CLI does: ``resume`` through :func:`aiocheckpoint.control.operate` with the CLI's
``check_resume``; ``retry``, ``cancel`` and ``resolve`` through the manager
(:meth:`~aiocheckpoint.CheckpointManager.retry_workflow`,
:meth:`~aiocheckpoint.CheckpointManager.cancel_workflow`,
:meth:`~aiocheckpoint.CheckpointManager.resolve_effect`). A runner holding the lease makes
the action fail with :class:`~aiocheckpoint.LeaseHeldError`, shown on the error page.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request

from .._validation import check_workflow_id
from ..control import operate
from ..errors import InvalidArgumentError
from ..manager import CheckpointManager
from ..storage.base import WorkflowStorage
from ..storage.lifecycle import check_resume

__all__ = ["ACTIONS", "CSRF_COOKIE", "MAX_BODY", "Csrf", "ActionRefused", "run_action"]

#: The cookie the CSRF tokens are bound to.
CSRF_COOKIE: Final = "aiocheckpoint_csrf"
#: The largest action form read (an input or a result of up to about this size).
MAX_BODY: Final = 1_000_000
#: The actions, by the last part of their path (``/action/NAME``).
ACTIONS: Final = ("resume", "retry", "cancel", "resolve")


class ActionRefused(Exception):
    """A request refused before anything was done: why, and the HTTP status."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


class Csrf:
    """Makes and checks the per-form tokens bound to each browser's cookie."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        """A fresh random cookie value."""
        return secrets.token_urlsafe(32)

    def token(self, cookie: str) -> str:
        """The form token for a browser whose cookie is ``cookie``."""
        return hmac.new(self._secret, cookie.encode(), hashlib.sha256).hexdigest()

    def check(self, request: Request, form: Mapping[str, str]) -> None:
        """ActionRefused unless the form's token matches the cookie and the origin is ours."""
        origin = request.headers.get("origin")
        # "null": what a browser sends under the pages' no-referrer policy; the token decides.
        if origin not in (None, "null") and urlsplit(origin).netloc != request.headers.get("host"):
            raise ActionRefused("refused: the form was sent from another site")
        cookie = request.cookies.get(CSRF_COOKIE)
        given = form.get("csrf", "")
        if not cookie or not hmac.compare_digest(given.encode(), self.token(cookie).encode()):
            raise ActionRefused("refused: the form's CSRF token is missing or wrong; reload")


async def read_form(request: Request) -> dict[str, str]:
    """The url-encoded form of ``request``, read up to :data:`MAX_BODY` bytes."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise ActionRefused(f"refused: the form is over {MAX_BODY} bytes", 413)
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise ActionRefused("refused: the form is not UTF-8", 400) from None
    return dict(pairs)


async def run_action(manager: CheckpointManager, name: str, form: Mapping[str, str]) -> str:
    """Do action ``name`` with ``form``'s fields; the workflow id it acted on."""
    workflow_id = check_workflow_id(form.get("id", ""))
    if name == "resume":
        storage = manager.storage
        if not isinstance(storage, WorkflowStorage):
            raise InvalidArgumentError(f"{type(storage).__name__} keeps no workflow records")
        value = _json(form.get("input", ""), "input")
        await operate(
            storage,
            workflow_id,
            check_resume,
            lambda: manager.resume_workflow(workflow_id, value),
        )
    elif name == "retry":
        await manager.retry_workflow(workflow_id)
    elif name == "cancel":
        await manager.cancel_workflow(workflow_id, reason=form.get("reason") or None)
    elif name == "resolve":
        step = form.get("step", "")
        if not step.isdigit() or len(step) > 19:
            raise InvalidArgumentError(f"not a step number: {step[:40]!r}")
        happened = form.get("outcome") == "happened"
        result = _json(form.get("result", ""), "result") if happened else None
        await manager.resolve_effect(
            workflow_id, int(step), form.get("key", ""), happened=happened, result=result
        )
    else:
        raise ActionRefused(f"no action {name[:40]!r}", 404)
    return workflow_id


def _json(text: str, what: str) -> Any:
    """A JSON field (empty: null); InvalidArgumentError naming the field if it is not JSON."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"the {what} is not JSON: {exc}") from None
