"""pydantic-ai durable execution on aiocheckpoint's stores.

``pip install aiocheckpoint[pydantic-ai]``.

``AioCheckpointDurability(manager)`` is a durability capability: attach it to an agent, run
with ``await durability.run(agent, prompt, workflow_id=...)``, and after a crash finish the
run with ``await durability.resume(agent, workflow_id)``; a run that sleeps long ends with
``RunSleeping`` and is resumed the same way once the store wakes it. See ``docs/pydantic-ai.md``.
"""

from ._backend import EffectConfig
from ._durability import AioCheckpointDurability
from ._scope import current_idempotency_key
from ._sleep import RunSleeping

__all__ = ["AioCheckpointDurability", "EffectConfig", "RunSleeping", "current_idempotency_key"]
