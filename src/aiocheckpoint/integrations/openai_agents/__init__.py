"""OpenAI Agents SDK sessions and run states in aiocheckpoint's stores.

``pip install aiocheckpoint[openai-agents]``. :class:`AioCheckpointSession` is an
``agents.memory.Session`` (pass it as ``session=`` to ``Runner.run``);
:class:`RunStateStore` keeps the ``RunState`` of a run interrupted for tool approval. See
``docs/openai-agents.md``.
"""

from .run_state import RunStateStore
from .session import AioCheckpointSession

__all__ = ["AioCheckpointSession", "RunStateStore"]
