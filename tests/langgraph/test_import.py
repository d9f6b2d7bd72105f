"""Importing aiocheckpoint (or its integrations package) never imports LangGraph."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import aiocheckpoint, aiocheckpoint.integrations, aiocheckpoint.cli
from aiocheckpoint import open_storage
open_storage("memory://")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("langgraph", "langchain_core"))
print(",".join(loaded))
"""


def test_importing_aiocheckpoint_does_not_import_langgraph() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_the_saver_is_a_langgraph_checkpointer() -> None:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from aiocheckpoint.integrations.langgraph import AioCheckpointSaver

    assert issubclass(AioCheckpointSaver, BaseCheckpointSaver)
