"""``aiocheckpoint serve``: a web inspector for any store (the ``web`` extra).

:func:`create_app` builds the ASGI application over a manager; :func:`serve` runs it with
uvicorn. docs/web.md describes the pages and the safety model.
"""

from __future__ import annotations

from ..manager import CheckpointManager
from .app import LOOPBACK_NAMES, create_app

__all__ = ["create_app", "serve"]


async def serve(
    manager: CheckpointManager,
    url: str,
    *,
    host: str,
    port: int,
    token: str | None,
    loopback: bool,
    allow_actions: bool = False,
) -> None:
    """Serve the inspector over ``manager`` on ``host``:``port`` until interrupted."""
    import uvicorn

    hosts = list(LOOPBACK_NAMES) if loopback else None
    app = create_app(manager, url, token=token, allowed_hosts=hosts, allow_actions=allow_actions)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, server_header=False
    )
    await uvicorn.Server(config).serve()
