"""Managers over every backend (plain and encrypted), for the OpenAI Agents SDK tests."""

from __future__ import annotations

from agents import set_tracing_disabled

from tests.integrations.managers import backend, keyring, manager, pg_schema, sealed

__all__ = ["backend", "keyring", "manager", "pg_schema", "sealed"]

# The runs are offline: no trace is sent anywhere.
set_tracing_disabled(True)
