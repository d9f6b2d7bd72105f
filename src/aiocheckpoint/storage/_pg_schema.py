"""The PostgreSQL backend's schema, its migrations and its SQL text.

Every table lives in one PostgreSQL schema (``aiocheckpoint`` unless configured), so one
database can hold several independent stores. ``meta`` records the schema version; opening
a store runs the missing migrations under a transaction-level advisory lock, so concurrent
openers never race, and refuses a store whose version is newer than this code knows.

To change the schema, append a migration to ``MIGRATIONS``: never edit a released one.
Issue 5's workflow/lease table and issue 9's blob table are expected to be migrations 2 and 3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError, StorageSchemaError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Sql", "migrate", "quote_schema"]

#: Each migration is a tuple of statements; ``{s}`` is replaced by the quoted schema name.
#: Migration ``i`` (0-based) brings the store from version ``i`` to version ``i + 1``.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        # COLLATE "C": byte order of UTF-8 equals code point order, which is what
        # list_workflows promises (Python's sorted), whatever the database's locale.
        """
        CREATE TABLE {s}.checkpoints (
            workflow_id text COLLATE "C" NOT NULL
                CHECK (octet_length(workflow_id) BETWEEN 1 AND 255),
            step bigint NOT NULL CHECK (step >= 0),
            data bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (workflow_id, step)
        )
        """,
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_VERSION_KEY = "schema_version"


def quote_schema(name: object) -> str:
    """Validate a schema name and return it double-quoted for use in SQL text.

    Only ASCII letters, digits and ``_`` are accepted (at most 63 bytes, not starting with a
    digit or ``pg_``), so the quoted identifier can never escape its quotes.
    """
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise InvalidArgumentError(
            "schema must be 1-63 ASCII letters, digits or '_', not starting with a digit; "
            f"got {name!r}"
        )
    if name.lower().startswith("pg_"):
        raise InvalidArgumentError(f"schema names starting with 'pg_' are reserved: {name!r}")
    return f'"{name}"'


async def migrate(con: Any, quoted: str, schema: str) -> int:
    """Create or upgrade the store in ``schema``; return the version found before.

    Runs in one transaction holding an advisory lock keyed by the schema name: a concurrent
    opener waits, then finds the work done. Raises :class:`StorageSchemaError` for a newer or
    unrecognisable store; nothing is changed then.
    """
    async with con.transaction():
        await con.execute(
            "SELECT pg_advisory_xact_lock(hashtext('aiocheckpoint.migrate:' || $1::text))",
            schema,
        )
        await con.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        await con.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted}.meta (key text PRIMARY KEY, value text NOT NULL)"
        )
        found = await con.fetchval(f"SELECT value FROM {quoted}.meta WHERE key = $1", _VERSION_KEY)
        version = _parse_version(found, schema)
        if version > SCHEMA_VERSION:
            raise StorageSchemaError(
                f"PostgreSQL schema {schema!r} has store version {version}; this aiocheckpoint "
                f"knows versions up to {SCHEMA_VERSION}: upgrade aiocheckpoint"
            )
        if version == 0 and await _has_foreign_tables(con, schema):
            raise StorageSchemaError(
                f"PostgreSQL schema {schema!r} holds tables aiocheckpoint did not create; "
                "choose another schema"
            )
        for migration in MIGRATIONS[version:]:
            for statement in migration:
                await con.execute(statement.format(s=quoted))
        if version != SCHEMA_VERSION:
            await con.execute(
                f"INSERT INTO {quoted}.meta (key, value) VALUES ($1, $2) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                _VERSION_KEY,
                str(SCHEMA_VERSION),
            )
        return version


def _parse_version(found: object, schema: str) -> int:
    if found is None:
        return 0
    if isinstance(found, str) and found.isdigit():
        return int(found)
    raise StorageSchemaError(f"PostgreSQL schema {schema!r} has an unreadable version {found!r}")


async def _has_foreign_tables(con: Any, schema: str) -> bool:
    names = await con.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename <> 'meta'", schema
    )
    return bool(names)


@dataclass(frozen=True, slots=True)
class Sql:
    """Every statement the backend runs, bound to one schema. All values are parameters."""

    upsert: str
    prune: str
    latest: str
    at_step: str
    scan_asc: str
    scan_desc: str
    exists_any: str
    exists_step: str
    delete_step: str
    delete_all: str
    workflows: str

    @classmethod
    def for_schema(cls, quoted: str) -> Sql:
        """Build the statements for the quoted schema name."""
        t = f"{quoted}.checkpoints"
        # $n of the size cap: the row's length is checked before its bytes are sent.
        capped = "step, octet_length(data), CASE WHEN octet_length(data) <= {cap} THEN data END"
        scan = (
            f"SELECT {capped.format(cap='$5')} FROM {t} "
            "WHERE workflow_id = $1 AND step > $2 AND step <= $3 ORDER BY step {order} LIMIT $4"
        )
        return cls(
            upsert=(
                f"INSERT INTO {t} (workflow_id, step, data) "
                "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[]) "
                "ON CONFLICT (workflow_id, step) DO UPDATE "
                "SET data = EXCLUDED.data, created_at = EXCLUDED.created_at"
            ),
            # For each (workflow, keep) pair: the keep-th highest step is the lowest kept;
            # a workflow with fewer rows yields no cut and loses nothing. MATERIALIZED makes
            # the cut one index probe per workflow, not one per deleted row.
            prune=(
                f"WITH cut AS MATERIALIZED ("
                f"SELECT r.w, k.step FROM unnest($1::text[], $2::bigint[]) AS r(w, n) "
                f"CROSS JOIN LATERAL (SELECT step FROM {t} WHERE workflow_id = r.w "
                f"ORDER BY step DESC OFFSET r.n - 1 LIMIT 1) AS k) "
                f"DELETE FROM {t} AS c USING cut WHERE c.workflow_id = cut.w AND c.step < cut.step"
            ),
            latest=(
                f"SELECT {capped.format(cap='$2')} FROM {t} "
                "WHERE workflow_id = $1 ORDER BY step DESC LIMIT 1"
            ),
            at_step=(
                f"SELECT {capped.format(cap='$3')} FROM {t} WHERE workflow_id = $1 AND step = $2"
            ),
            scan_asc=scan.format(order="ASC"),
            scan_desc=scan.format(order="DESC"),
            exists_any=f"SELECT EXISTS (SELECT 1 FROM {t} WHERE workflow_id = $1)",
            exists_step=f"SELECT EXISTS (SELECT 1 FROM {t} WHERE workflow_id = $1 AND step = $2)",
            delete_step=f"DELETE FROM {t} WHERE workflow_id = $1 AND step = $2",
            delete_all=f"DELETE FROM {t} WHERE workflow_id = $1",
            # A loose index scan: one PK probe per distinct workflow, not a scan of every row.
            workflows=(
                f"WITH RECURSIVE w(id) AS ("
                f"(SELECT workflow_id FROM {t} ORDER BY workflow_id LIMIT 1) "
                f"UNION ALL SELECT (SELECT workflow_id FROM {t} WHERE workflow_id > w.id "
                f"ORDER BY workflow_id LIMIT 1) FROM w WHERE w.id IS NOT NULL) "
                "SELECT id FROM w WHERE id IS NOT NULL"
            ),
        )
