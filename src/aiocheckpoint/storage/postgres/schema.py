"""The PostgreSQL store's schema and its migrations (the statements are in :mod:`.sql`).

Every table lives in one PostgreSQL schema (``aiocheckpoint`` unless configured), so one
database can hold several independent stores. ``meta`` records the schema version; opening
a store runs the missing migrations under a transaction-level advisory lock, so concurrent
openers never race, and refuses a store whose version is newer than this code knows.

To change the schema, append a migration to ``MIGRATIONS``: never edit a released one.
Migration 2 adds workflow records and leases; migration 3 the content-addressed blobs of
incremental checkpoints with their reference counts; migration 4 moves the counts into a
narrow table of their own (``blob_refs``); migration 5 adds the ``paused`` status, retries,
metadata and the latest step to workflow records, with the indexes their queries walk;
migration 6 adds the effect journal (``effects``); migration 7 the kind of a workflow
record, so that runners claim only workflows and never a LangGraph thread; migration 8 the
``cancelled`` status; migration 9 each workflow's event history (``workflow_events``);
migration 10 deletes a statement's checkpoints' effects in one join
(a statement trigger instead of a row trigger); migration 11 adds the indexes that keep a
listing's page and the inspector's time ranges flat at a million workflows; migration 12
moves the time ranges to an index of the minute of ``updated_at`` (a save's update of its
record stays HOT within a minute: :mod:`.minute`).
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import InvalidArgumentError, StorageSchemaError
from .effects import MIGRATION as EFFECTS_MIGRATION
from .events import MIGRATION as EVENTS_MIGRATION
from .minute import MIGRATION as MINUTE_MIGRATION
from .settrigger import MIGRATION as SET_TRIGGER_MIGRATION

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate", "quote_schema"]

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
    (
        # Workflow records and leases. Fencing tokens come from one sequence, never from
        # max(token) + 1, so a workflow deleted and created again never reissues a token.
        "CREATE SEQUENCE {s}.fencing AS bigint",
        """
        CREATE TABLE {s}.workflows (
            workflow_id text COLLATE "C" PRIMARY KEY
                CHECK (octet_length(workflow_id) BETWEEN 1 AND 255),
            status text NOT NULL DEFAULT 'unfinished'
                CHECK (status IN ('unfinished', 'finished', 'failed')),
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz,
            lease_owner text,
            lease_expires_at timestamptz,
            fencing_token bigint NOT NULL DEFAULT 0,
            CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
        )
        """,
        # What claim_next_workflow walks: unfinished workflows, oldest first.
        "CREATE INDEX workflows_claimable ON {s}.workflows (created_at, workflow_id) "
        "WHERE status = 'unfinished'",
        # Workflows stored before this migration get an UNFINISHED record now, so that every
        # workflow with a checkpoint has a record (and runners can resume them).
        "INSERT INTO {s}.workflows (workflow_id, created_at, updated_at) "
        "SELECT workflow_id, min(created_at), max(created_at) FROM {s}.checkpoints "
        "GROUP BY workflow_id",
    ),
    (
        # Blobs of incremental (version-2) checkpoints. ``refs`` counts the distinct parent
        # nodes plus the records that reference a blob directly; it is kept exact in the
        # transaction that writes or deletes the records, and a blob whose count reaches 0
        # is deleted in that same transaction (docs/incremental.md section 8). Records keep
        # living in ``checkpoints``: a version-1 store upgraded to this version reads as before.
        """
        CREATE TABLE {s}.blobs (
            hash bytea PRIMARY KEY CHECK (octet_length(hash) BETWEEN 16 AND 32),
            refs bigint NOT NULL,
            data bytea NOT NULL
        )
        """,
    ),
    (
        # The counts move to a narrow table of their own: every save updates the counts of
        # the children of its new nodes (a list's last index node: ~16 of them), and an
        # UPDATE writes a new version of the whole row. Next to ~1 KB of data, that left
        # ~1 KB of dead row per count change until a vacuum (a growing chat: ~5x its size
        # on disk, docs/incremental.md); now it is a ~60-byte row.
        """
        CREATE TABLE {s}.blob_refs (
            hash bytea PRIMARY KEY CHECK (octet_length(hash) BETWEEN 16 AND 32),
            refs bigint NOT NULL
        )
        """,
        "INSERT INTO {s}.blob_refs (hash, refs) SELECT hash, refs FROM {s}.blobs",
        "ALTER TABLE {s}.blobs DROP COLUMN refs",
    ),
    (
        # Workflow lifecycle and queries: the paused status, retries (attempts,
        # the last error, when a retry may be claimed), the input of a resumed run, the
        # metadata a workflow was registered with and its latest step.
        "ALTER TABLE {s}.workflows DROP CONSTRAINT IF EXISTS workflows_status_check",
        "ALTER TABLE {s}.workflows ADD CONSTRAINT workflows_status_check "
        "CHECK (status IN ('unfinished', 'finished', 'failed', 'paused'))",
        # IF NOT EXISTS: a store put back to an older version by hand (as the tests do)
        # migrates again cleanly.
        "ALTER TABLE {s}.workflows "
        "ADD COLUMN IF NOT EXISTS metadata text NOT NULL DEFAULT '{{}}', "
        "ADD COLUMN IF NOT EXISTS latest_step bigint, "
        "ADD COLUMN IF NOT EXISTS latest_agent_id text, "
        'ADD COLUMN IF NOT EXISTS latest_agent_status text COLLATE "C", '
        "ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0, "
        "ADD COLUMN IF NOT EXISTS last_error text, "
        "ADD COLUMN IF NOT EXISTS retry_at timestamptz, "
        "ADD COLUMN IF NOT EXISTS resume_input text",
        # Pages of a listing filtered by status or by the latest step's agent status.
        "CREATE INDEX IF NOT EXISTS workflows_status ON {s}.workflows (status, workflow_id)",
        "CREATE INDEX IF NOT EXISTS workflows_agent_status "
        "ON {s}.workflows (latest_agent_status, workflow_id)",
        # One row per top-level metadata key (value: canonical JSON text), so that a filter
        # on a key walks an index in workflow id order; it goes with its workflow.
        """
        CREATE TABLE IF NOT EXISTS {s}.workflow_metadata (
            workflow_id text COLLATE "C" NOT NULL
                REFERENCES {s}.workflows (workflow_id) ON DELETE CASCADE,
            key text COLLATE "C" NOT NULL,
            value text COLLATE "C" NOT NULL,
            PRIMARY KEY (workflow_id, key)
        )
        """,
        "CREATE INDEX IF NOT EXISTS workflow_metadata_value "
        "ON {s}.workflow_metadata (key, value, workflow_id)",
    ),
    EFFECTS_MIGRATION,
    (
        # The kind of a record: runners claim only the 'workflow' kind.
        'ALTER TABLE {s}.workflows ADD COLUMN IF NOT EXISTS kind text COLLATE "C" '
        "NOT NULL DEFAULT 'workflow' CHECK (length(kind) BETWEEN 1 AND 32)",
        # The records the LangGraph saver wrote before records had a kind: its thread and
        # page workflows (``lg:`` and ``lgp:`` ids), whose latest step it wrote.
        "UPDATE {s}.workflows SET kind = 'langgraph' WHERE latest_agent_id = 'langgraph' "
        "AND (left(workflow_id, 3) = 'lg:' OR left(workflow_id, 4) = 'lgp:')",
        "DROP INDEX IF EXISTS {s}.workflows_claimable",
        "CREATE INDEX workflows_claimable ON {s}.workflows (created_at, workflow_id) "
        "WHERE status = 'unfinished' AND kind = 'workflow'",
        # Pages of a listing filtered by kind (and status): the default listing's.
        "CREATE INDEX IF NOT EXISTS workflows_kind ON {s}.workflows (kind, status, workflow_id)",
    ),
    (
        # The cancelled status (cancel_workflow); it depends on no other new migration.
        "ALTER TABLE {s}.workflows DROP CONSTRAINT IF EXISTS workflows_status_check",
        "ALTER TABLE {s}.workflows ADD CONSTRAINT workflows_status_check "
        "CHECK (status IN ('unfinished', 'finished', 'failed', 'paused', 'cancelled'))",
    ),
    # Each workflow's event history; it depends on no other new migration.
    EVENTS_MIGRATION,
    SET_TRIGGER_MIGRATION,
    (
        # The default listing (kind 'workflow', any status) in workflow id order, whatever
        # share of the store the kind holds; it depends on no other new migration.
        "CREATE INDEX IF NOT EXISTS workflows_kind_id ON {s}.workflows (kind, workflow_id)",
        # Records updated in a time range (the inspector's throughput, updated_after /
        # updated_before): a range of this index, not a scan of every record.
        "CREATE INDEX IF NOT EXISTS workflows_updated ON {s}.workflows (updated_at)",
        # A value belongs to one key: without these statistics the planner multiplied the
        # two columns' shares, expected fewer matches than a page holds and read every
        # match after the cursor (a hash join and a sort) instead of walking in id order.
        "CREATE STATISTICS IF NOT EXISTS {s}.workflow_metadata_pairs (mcv, dependencies) "
        "ON key, value FROM {s}.workflow_metadata",
    ),
    MINUTE_MIGRATION,
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
    if await con.fetchval("SELECT to_regclass($1)", f"{quoted}.meta") is not None:
        # The common case, an up-to-date store: no lock and no DDL, so a role that may only
        # read and write the tables (no CREATE on the database) can open it.
        found = await con.fetchval(f"SELECT value FROM {quoted}.meta WHERE key = $1", _VERSION_KEY)
        if found is not None and _parse_version(found, schema) == SCHEMA_VERSION:
            return SCHEMA_VERSION
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
        missing = [statement.format(s=quoted) for m in MIGRATIONS[version:] for statement in m]
        if missing:
            # One round trip for them all (a new store runs dozens): the simple query
            # protocol runs a script's statements in order, in this transaction.
            await con.execute("\n;\n".join(missing))
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
