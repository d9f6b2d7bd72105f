"""``RunStateStore``: an interrupted run's ``RunState`` kept as a checkpoint, verified on load.

The SDK's ``RunState.from_string`` trusts what it is given (tool approvals, pending tool
calls); its documentation asks for trusted storage or a verified snapshot. Every record
aiocheckpoint reads back is checked before the SDK sees it: its checksum always, and with
an encrypting manager its AES-GCM seal, bound to the run's workflow and step, so a changed,
swapped or forged state is refused with a
:class:`~aiocheckpoint.CheckpointCorruptedError` (a
:class:`~aiocheckpoint.DecryptionError` when sealed) and never deserialized.
"""

from __future__ import annotations

from typing import Any, Final

from agents.agent import Agent
from agents.run_state import RunState

from ..._validation import check_workflow_id
from ...errors import CheckpointCorruptedError, InvalidArgumentError
from ...manager import CheckpointManager
from ...models import AgentStatus

__all__ = ["RunStateStore"]

_AGENT: Final = "openai-agents"
_STEP: Final = 0


class RunStateStore:
    """Saves and loads the ``RunState`` of interrupted runs, one workflow per run id.

    ``await store.save(run_id, result.to_state())`` after a run stops on interruptions;
    ``state = await store.load(run_id, agent)`` in any process later, then approve or reject
    and ``Runner.run(agent, state)``. Saving a run id again replaces its state.
    """

    def __init__(
        self, manager: CheckpointManager, *, prefix: str = "openai-agents/run-state/"
    ) -> None:
        if not isinstance(manager, CheckpointManager):
            raise InvalidArgumentError(f"manager must be a CheckpointManager, not {manager!r}")
        self._manager = manager
        self._prefix = prefix

    def workflow_id(self, run_id: str) -> str:
        """The workflow that keeps ``run_id``'s state."""
        if not isinstance(run_id, str) or not run_id:
            raise InvalidArgumentError(f"run_id must be a non-empty str, not {run_id!r}")
        return check_workflow_id(self._prefix + run_id)

    async def save(self, run_id: str, state: RunState[Any, Any]) -> None:
        """Store ``state`` durably under ``run_id`` (sealed when the manager encrypts)."""
        if not isinstance(state, RunState):
            raise InvalidArgumentError(f"state must be a RunState, not {type(state).__name__}")
        text = state.to_string()
        await self._manager.create_checkpoint(
            self.workflow_id(run_id), _STEP, _AGENT, AgentStatus.BLOCKED, {"run_state": text}
        )

    async def load(self, run_id: str, agent: Agent[Any]) -> RunState[Any, Agent[Any]]:
        """The state saved under ``run_id``, for ``agent``; verified before it is parsed.

        Raises :class:`~aiocheckpoint.CheckpointNotFoundError` if none is saved and
        :class:`~aiocheckpoint.CheckpointCorruptedError` if the record fails verification.
        """
        workflow_id = self.workflow_id(run_id)
        checkpoint = await self._manager.get_checkpoint(workflow_id, _STEP)
        text = checkpoint.state_snapshot.data.get("run_state")
        if not isinstance(text, str):
            raise CheckpointCorruptedError(
                "the record holds no run state", workflow_id=workflow_id, step=_STEP
            )
        return await RunState.from_string(agent, text)

    async def delete(self, run_id: str) -> bool:
        """Forget ``run_id``'s state (once the run has finished); whether one was kept."""
        return await self._manager.delete_checkpoints(self.workflow_id(run_id))

    async def exists(self, run_id: str) -> bool:
        """Whether a state is kept for ``run_id``."""
        return await self._manager.has_checkpoint(self.workflow_id(run_id))
