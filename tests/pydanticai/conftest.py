"""Fixtures of the pydantic-ai integration's tests."""

from __future__ import annotations

from tests.pg_support import pg_schema as pg_schema
