"""Managers over every backend (plain and encrypted), for the Agent Framework tests."""

from __future__ import annotations

import sys

from tests.integrations.managers import backend, manager, pg_schema, sealed

__all__ = ["backend", "manager", "pg_schema", "sealed"]

# Agent Framework needs Python 3.11; on 3.10 the extra installs nothing (pyproject.toml).
if sys.version_info < (3, 11):
    collect_ignore_glob = ["test_*.py"]
