"""The input rules every backend relies on, enforced in one place."""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from .errors import InvalidArgumentError, InvalidStepError, InvalidWorkflowIdError
from .format.limits import MAX_STEP, MAX_WORKFLOW_ID_BYTES
from .leases import WorkflowStatus
from .models import AgentStatus

__all__ = [
    "MAX_STEP",
    "MAX_WORKFLOW_ID_BYTES",
    "check_agent_status",
    "check_keep_last",
    "check_limit",
    "check_optional_step",
    "check_save",
    "check_step",
    "check_text",
    "check_workflow_id",
    "check_workflow_status",
]


def check_workflow_id(workflow_id: Any) -> str:
    """Return ``workflow_id`` if it is a valid id, else raise :class:`InvalidWorkflowIdError`.

    A valid id is a non-empty ``str`` of at most 255 UTF-8 bytes that contains no NUL.
    Everything else about it (slashes, dots, spaces, any script) is allowed and preserved.
    """
    if (
        type(workflow_id) is str
        and workflow_id.isascii()  # then its length is its UTF-8 size: no encoding to count
        and 0 < len(workflow_id) <= MAX_WORKFLOW_ID_BYTES
        and "\x00" not in workflow_id
    ):
        return workflow_id  # every save checks its id twice (manager, storage): the common case
    if not isinstance(workflow_id, str):
        raise InvalidWorkflowIdError(
            f"workflow id must be str, not {type(workflow_id).__qualname__}"
        )
    if not workflow_id:
        raise InvalidWorkflowIdError("workflow id must not be empty")
    if "\x00" in workflow_id:
        raise InvalidWorkflowIdError("workflow id must not contain NUL")
    try:
        size = len(workflow_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidWorkflowIdError("workflow id is not valid Unicode text") from exc
    if size > MAX_WORKFLOW_ID_BYTES:
        raise InvalidWorkflowIdError(
            f"workflow id is {size} UTF-8 bytes; at most {MAX_WORKFLOW_ID_BYTES} are allowed"
        )
    return workflow_id


def check_step(step: Any, name: str = "step") -> int:
    """Return ``step`` if it is an ``int`` in ``[0, 2**63)`` (not ``bool``).

    Anything else raises :class:`InvalidStepError` (a ``ValueError``).
    """
    if type(step) is int and 0 <= step <= MAX_STEP:
        return step
    if not isinstance(step, int) or isinstance(step, bool):
        raise InvalidStepError(f"{name} must be an int >= 0, not {type(step).__qualname__}")
    if step < 0 or step > MAX_STEP:
        raise InvalidStepError(f"{name} must be between 0 and 2**63 - 1, got {step}")
    return int(step)


def check_optional_step(step: Any, name: str = "step") -> int | None:
    """Like :func:`check_step`, but ``None`` passes through."""
    return None if step is None else check_step(step, name)


def check_limit(limit: Any) -> int | None:
    """Return a page size: ``None`` (no limit) or an int >= 1."""
    if limit is None:
        return None
    if type(limit) is not int or limit < 1:
        raise InvalidArgumentError(f"limit must be an int >= 1 or None, got {limit!r}")
    return limit


def check_keep_last(keep_last: Any) -> int | None:
    """``keep_last`` if it is None or an int >= 1; else :class:`InvalidArgumentError`."""
    if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
        raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
    return keep_last


def check_save(workflow_id: Any, step: Any, keep_last: Any) -> tuple[str, int, int | None]:
    """The arguments of a backend's ``save`` or ``save_tree``, checked: the one gate.

    Returns them as given, or raises :class:`~aiocheckpoint.InvalidWorkflowIdError`,
    :class:`~aiocheckpoint.InvalidStepError` or :class:`~aiocheckpoint.InvalidArgumentError`
    (``keep_last`` not None nor an int >= 1) before anything is stored.
    """
    return check_workflow_id(workflow_id), check_step(step), check_keep_last(keep_last)


def check_text(value: Any, name: str) -> str:
    """Return ``value`` if it is a ``str`` of valid Unicode, else raise InvalidArgumentError."""
    if type(value) is str and value.isascii():
        return value  # ASCII always encodes: no copy to make
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be str, not {type(value).__qualname__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} is not valid Unicode text") from None
    return value


_E = TypeVar("_E", bound=Enum)
_AGENT_STATUSES: dict[Any, AgentStatus] = {s: s for s in AgentStatus}


def check_agent_status(status: Any) -> AgentStatus:
    """``status`` (an :class:`AgentStatus` or its value) as an AgentStatus."""
    # An AgentStatus equals and hashes like its value: one lookup serves both spellings.
    if type(status) is AgentStatus or type(status) is str:
        found = _AGENT_STATUSES.get(status)
        if found is not None:
            return found
    return _enum(AgentStatus, status)


def check_workflow_status(status: Any) -> WorkflowStatus:
    """``status`` (a :class:`WorkflowStatus` or its value) as a WorkflowStatus."""
    return _enum(WorkflowStatus, status)


def _enum(kind: type[_E], status: Any) -> _E:
    try:
        return kind(status)
    except ValueError:
        allowed = ", ".join(s.value for s in kind)
        raise InvalidArgumentError(f"status must be one of {allowed}; got {status!r}") from None
