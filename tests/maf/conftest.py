"""Managers over every backend (plain and encrypted), for the Agent Framework tests."""

from __future__ import annotations

from tests.integrations.managers import backend, manager, pg_schema, sealed

__all__ = ["backend", "manager", "pg_schema", "sealed"]
