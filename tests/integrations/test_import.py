"""Importing aiocheckpoint (or its integrations package) imports no agent framework."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import aiocheckpoint, aiocheckpoint.integrations, aiocheckpoint.cli
from aiocheckpoint import open_storage
open_storage("memory://")
frameworks = ("agents", "openai", "agent_framework")
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in frameworks)))
"""


def test_importing_aiocheckpoint_imports_no_framework() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
