"""LangGraph checkpointer over aiocheckpoint's stores (``pip install aiocheckpoint[langgraph]``).

``AioCheckpointSaver(storage)`` or ``AioCheckpointSaver.from_url("sqlite:///app.db")``
is a LangGraph ``BaseCheckpointSaver``: pass it as ``checkpointer=`` to ``compile``. See
``docs/langgraph.md``.
"""

from ...errors import CheckpointIdCollisionError
from .saver import AioCheckpointSaver

__all__ = ["AioCheckpointSaver", "CheckpointIdCollisionError"]
