"""The operation backend: each durable unit of a run is one ``wf.effect`` of its workflow."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypedDict, cast

from pydantic_ai.durable_exec import (
    DurableOperationId,
    JournalCallableOperationBackend,
    RoleBasedOperationConfig,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)

from ...effects import Reconcile
from ...errors import InvalidArgumentError
from ._scope import current_scope, idempotency_scope


class EffectConfig(TypedDict, total=False):
    """How one kind of durable unit behaves when a crash left it in doubt.

    ``idempotent``: call it again (with an idempotency key, see
    :func:`current_idempotency_key`) instead of raising
    :class:`~aiocheckpoint.EffectInDoubtError`. ``reconcile``: the ``wf.effect`` callback
    asked whether the call happened.
    """

    idempotent: bool
    reconcile: Reconcile


#: Units that only read (listing tools, validating arguments) are safe to run again.
_READS = (ToolsetGetToolsId, ToolsetGetInstructionsId, ToolsetValidateToolArgumentsId)

ToolResolver = Callable[[DurableOperationId, object | None, str], EffectConfig | Literal[False]]


class EffectOperationBackend(JournalCallableOperationBackend[EffectConfig]):
    """Runs each unit's body as an effect of the workflow of the run in progress."""

    def __init__(
        self,
        *,
        agent_name: str,
        default_model_id: str | None,
        config: RoleBasedOperationConfig[EffectConfig],
    ) -> None:
        super().__init__(agent_name=agent_name, default_model_id=default_model_id, config=config)

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: EffectConfig,
    ) -> object:
        """Run ``body`` once per run, durably: its recorded result on every later run."""
        scope = current_scope()
        if scope is None:  # outside a durable run: nothing to record it in
            return await body()
        key = scope.key_for(name, cache_key)
        idempotent = isinstance(operation_id, _READS) or bool(config.get("idempotent", False))

        async def unit(idempotency_key: str | None = None) -> object:
            with idempotency_scope(idempotency_key):
                return await body()

        unit.__qualname__ = unit.__name__ = name  # what the journal shows as its function
        return await scope.workflow.effect(
            key, unit, idempotent=idempotent, reconcile=config.get("reconcile")
        )


def role_config(
    *,
    model: EffectConfig,
    event: EffectConfig,
    capability: EffectConfig,
    tool: EffectConfig,
    resolve_tool: ToolResolver,
) -> RoleBasedOperationConfig[EffectConfig]:
    """The per-role defaults and the per-tool resolver, in pydantic-ai's config type."""
    return RoleBasedOperationConfig(
        model=model, event=event, capability=capability, tool=tool, resolve_tool=resolve_tool
    )


def merged(*configs: Any) -> EffectConfig:
    """Later configs' keys over earlier ones', each checked."""
    out: EffectConfig = {}
    for config in configs:
        if config:
            out.update(check_config(config))
    return out


def check_config(config: Any) -> EffectConfig:
    """``config`` if it is an :class:`EffectConfig`; else ``InvalidArgumentError``."""
    unknown = set(config) - {"idempotent", "reconcile"}
    if unknown:
        raise InvalidArgumentError(
            f"unknown aiocheckpoint tool settings {sorted(unknown)!r} "
            "(known: 'idempotent', 'reconcile')"
        )
    if not isinstance(config.get("idempotent", False), bool):
        raise InvalidArgumentError("the aiocheckpoint setting 'idempotent' is a bool")
    reconcile = config.get("reconcile")
    if reconcile is not None and not callable(reconcile):
        raise InvalidArgumentError("the aiocheckpoint setting 'reconcile' is an async callable")
    return cast(EffectConfig, config)
