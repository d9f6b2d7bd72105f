"""Microsoft Agent Framework workflow checkpoints in aiocheckpoint's stores.

``pip install aiocheckpoint[agent-framework]``. :class:`AioCheckpointStorage` is an
``agent_framework.CheckpointStorage``: pass it as ``checkpoint_storage=`` to
``WorkflowBuilder`` or ``workflow.run``. Checkpoints are written without pickle. See
``docs/agent-framework.md``.
"""

from .storage import AioCheckpointStorage

__all__ = ["AioCheckpointStorage"]
