"""The PostgreSQL backend's schema, its migrations and its SQL text.

Every table lives in one PostgreSQL schema (``aiocheckpoint`` unless configured), so one
database can hold several independent stores. ``meta`` records the schema version; opening
a store runs the missing migrations under a transaction-level advisory lock, so concurrent
openers never race, and refuses a store whose version is newer than this code knows.

To change the schema, append a migration to ``MIGRATIONS``: never edit a released one.
Migration 2 adds workflow records and leases (issue 5); migration 3 the content-addressed
blobs of incremental checkpoints with their reference counts (issue 9); migration 4 moves
the counts into a narrow table of their own (``blob_refs``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError, StorageSchemaError
from ..format import MAGIC

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
    status_upsert: str
    status_fenced: str
    get_record: str
    list_records: str
    acquire: str
    holder: str
    renew: str
    release: str
    claim: str
    blob_add: str
    blob_release: str
    blob_drop: str
    blob_fetch: str
    blob_lock: str

    @classmethod
    def for_schema(cls, quoted: str) -> Sql:
        """Build the statements for the quoted schema name."""
        t = f"{quoted}.checkpoints"
        w = f"{quoted}.workflows"
        b = f"{quoted}.blobs"
        r = f"{quoted}.blob_refs"
        # A version-2 record's bytes, else NULL: only those reference blobs, and only they
        # are sent back when a record is replaced or deleted (its refs are then released).
        prefix = (MAGIC + bytes([2])).hex()
        v2 = f"CASE WHEN substring({{c}} FROM 1 FOR 5) = '\\x{prefix}'::bytea THEN {{c}} END"
        record = (
            "workflow_id, status, created_at, updated_at, finished_at, lease_owner, "
            "lease_expires_at, fencing_token"
        )
        expiry = "now() + make_interval(secs => {ttl})"
        finished = "CASE WHEN $2 = 'unfinished' THEN NULL ELSE now() END"
        # $n of the size cap: the row's length is checked before its bytes are sent.
        capped = "step, octet_length(data), CASE WHEN octet_length(data) <= {cap} THEN data END"
        scan = (
            f"SELECT {capped.format(cap='$5')} FROM {t} "
            "WHERE workflow_id = $1 AND step > $2 AND step <= $3 ORDER BY step {order} LIMIT $4"
        )
        return cls(
            # One statement per batch: create missing records for unfenced rows, lock the
            # records of fenced rows FOR SHARE (a takeover's UPDATE then waits for this
            # commit, and a takeover that committed first is seen: FOR SHARE reads the latest
            # row version), and insert only rows that are unfenced or carry the current
            # token. RETURNING names the rows written; the others had stale leases.
            # One statement per batch: create missing records for unfenced rows, lock the
            # records of fenced rows FOR SHARE (a takeover's UPDATE then waits for this
            # commit, and a takeover that committed first is seen: FOR SHARE reads the latest
            # row version), and insert only rows that are unfenced or carry the current
            # token. ``old`` locks the rows about to be replaced and hands back the version-2
            # ones, whose refs the caller releases in the same transaction; with $5 (no
            # transaction around this statement) nothing is written when one would be
            # replaced, and the caller runs the batch again in a transaction. RETURNING names
            # the rows written (the others had stale leases); ``replaced`` without ``seen``
            # means a row appeared after this statement's snapshot: the caller retries.
            upsert=(
                "WITH r AS MATERIALIZED (SELECT * FROM "
                "unnest($1::text[], $2::bigint[], $3::bytea[], $4::bigint[]) AS r(w, s, d, t)), "
                f"rec AS (INSERT INTO {w} (workflow_id) SELECT DISTINCT w FROM r "
                "WHERE t IS NULL ORDER BY w ON CONFLICT (workflow_id) DO NOTHING), "
                f"held AS MATERIALIZED (SELECT workflow_id, fencing_token FROM {w} "
                "WHERE workflow_id IN (SELECT w FROM r WHERE t IS NOT NULL) "
                "ORDER BY workflow_id FOR SHARE), "
                "ok AS MATERIALIZED (SELECT r.w, r.s, r.d FROM r "
                "LEFT JOIN held ON held.workflow_id = r.w "
                "WHERE r.t IS NULL OR held.fencing_token = r.t), "
                f"old AS MATERIALIZED (SELECT c.workflow_id AS w, c.step AS s, "
                f"{v2.format(c='c.data')} AS d FROM {t} AS c JOIN ok "
                "ON c.workflow_id = ok.w AND c.step = ok.s ORDER BY 1, 2 FOR UPDATE OF c), "
                # Joining ``o`` makes ``old`` lock its rows before the first insert: read
                # after, it would skip the rows this statement has just updated.
                f"ins AS (INSERT INTO {t} (workflow_id, step, data) SELECT w, s, d FROM ok "
                "CROSS JOIN (SELECT coalesce(bool_or(d IS NOT NULL), false) AS v2 FROM old) AS o "
                "WHERE NOT ($5::boolean AND o.v2) "
                "ON CONFLICT (workflow_id, step) DO UPDATE "
                "SET data = EXCLUDED.data, created_at = EXCLUDED.created_at "
                "RETURNING workflow_id, step, xmax::text <> '0' AS replaced) "
                "SELECT ins.workflow_id, ins.step, ins.replaced, old.w IS NOT NULL, old.d "
                "FROM ins LEFT JOIN old ON old.w = ins.workflow_id AND old.s = ins.step"
            ),
            # For each (workflow, keep) pair: the keep-th highest step is the lowest kept;
            # a workflow with fewer rows yields no cut and loses nothing. MATERIALIZED makes
            # the cut one index probe per workflow, not one per deleted row.
            prune=(
                f"WITH cut AS MATERIALIZED ("
                f"SELECT r.w, k.step FROM unnest($1::text[], $2::bigint[]) AS r(w, n) "
                f"CROSS JOIN LATERAL (SELECT step FROM {t} WHERE workflow_id = r.w "
                f"ORDER BY step DESC OFFSET r.n - 1 LIMIT 1) AS k) "
                f", gone AS (DELETE FROM {t} AS c USING cut "
                "WHERE c.workflow_id = cut.w AND c.step < cut.step "
                f"RETURNING {v2.format(c='c.data')} AS d) "
                "SELECT d FROM gone WHERE d IS NOT NULL"
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
            # Deletes hand back the version-2 records they removed, to release their refs.
            delete_step=(
                f"DELETE FROM {t} WHERE workflow_id = $1 AND step = $2 "
                f"RETURNING {v2.format(c='data')}"
            ),
            # The record and lease go with the checkpoints, in the same statement.
            delete_all=(
                f"WITH rec AS (DELETE FROM {w} WHERE workflow_id = $1 RETURNING 1), "
                f"cps AS (DELETE FROM {t} WHERE workflow_id = $1 "
                f"RETURNING {v2.format(c='data')} AS d) "
                "SELECT (SELECT count(*) FROM rec) + (SELECT count(*) FROM cps), "
                "(SELECT array_agg(d) FROM cps WHERE d IS NOT NULL)"
            ),
            # A loose index scan: one PK probe per distinct workflow, not a scan of every row.
            workflows=(
                f"WITH RECURSIVE w(id) AS ("
                f"(SELECT workflow_id FROM {t} ORDER BY workflow_id LIMIT 1) "
                f"UNION ALL SELECT (SELECT workflow_id FROM {t} WHERE workflow_id > w.id "
                f"ORDER BY workflow_id LIMIT 1) FROM w WHERE w.id IS NOT NULL) "
                "SELECT id FROM w WHERE id IS NOT NULL"
            ),
            status_upsert=(
                f"INSERT INTO {w} AS x (workflow_id, status, finished_at) "
                f"VALUES ($1, $2, {finished}) ON CONFLICT (workflow_id) DO UPDATE "
                "SET status = EXCLUDED.status, finished_at = EXCLUDED.finished_at, "
                f"updated_at = now() RETURNING {record}"
            ),
            status_fenced=(
                f"UPDATE {w} SET status = $2, finished_at = {finished}, updated_at = now() "
                f"WHERE workflow_id = $1 AND fencing_token = $3 RETURNING {record}"
            ),
            get_record=f"SELECT {record} FROM {w} WHERE workflow_id = $1",
            list_records=(
                f"SELECT {record} FROM {w} WHERE $1::text IS NULL OR status = $1 "
                "ORDER BY workflow_id"
            ),
            # Granted when free, expired or already the same owner's; a grant always takes
            # a new token. No row back: another live owner holds it.
            acquire=(
                f"INSERT INTO {w} AS x (workflow_id, lease_owner, lease_expires_at, "
                f"fencing_token) VALUES ($1, $2, {expiry.format(ttl='$3')}, "
                f"nextval('{quoted}.fencing')) ON CONFLICT (workflow_id) DO UPDATE "
                "SET lease_owner = EXCLUDED.lease_owner, "
                "lease_expires_at = EXCLUDED.lease_expires_at, "
                "fencing_token = EXCLUDED.fencing_token, updated_at = now() "
                "WHERE x.lease_owner IS NULL OR x.lease_expires_at <= now() "
                "OR x.lease_owner = EXCLUDED.lease_owner "
                "RETURNING fencing_token, lease_expires_at"
            ),
            holder=(
                f"SELECT lease_owner, lease_expires_at, lease_expires_at <= now() FROM {w} "
                "WHERE workflow_id = $1"
            ),
            # Only the token matters: an expired lease nobody took over is still current.
            renew=(
                f"UPDATE {w} SET lease_owner = $3, lease_expires_at = {expiry.format(ttl='$4')}, "
                "updated_at = now() WHERE workflow_id = $1 AND fencing_token = $2 "
                "RETURNING lease_expires_at"
            ),
            release=(
                f"UPDATE {w} SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now() "
                "WHERE workflow_id = $1 AND fencing_token = $2"
            ),
            # SKIP LOCKED: concurrent claimers each lock a different candidate row instead of
            # queueing on the same one; the row is rechecked after locking.
            claim=(
                f"UPDATE {w} AS x SET lease_owner = $1, "
                f"lease_expires_at = {expiry.format(ttl='$2')}, "
                f"fencing_token = nextval('{quoted}.fencing'), updated_at = now() "
                f"FROM (SELECT workflow_id FROM {w} WHERE status = 'unfinished' "
                "AND (lease_expires_at IS NULL OR lease_expires_at <= now()) "
                "ORDER BY created_at, workflow_id LIMIT 1 FOR UPDATE SKIP LOCKED) AS c "
                "WHERE x.workflow_id = c.workflow_id "
                "RETURNING x.workflow_id, x.fencing_token, x.lease_expires_at"
            ),
            # add_ref of one tree level (section 8 of docs/incremental.md), for many hashes
            # at once: $2 is how many new referrers each hash gets. A blob that exists gets
            # refs + n (its sub-tree is counted already); a missing one is inserted with n,
            # which the caller recognises (an existing blob has refs >= 1, so it ends > n)
            # and then adds refs for its children. Sorted input locks rows in one order; a
            # row a concurrent release is deleting is waited for, then inserted again.
            # upsert of one level: counts added (rows created at the count sent), and the
            # data stored for the hashes whose row was created now (its count is what was
            # sent: an existing blob's ends above it, as no stored count is ever 0 or less
            # once a transaction commits).
            blob_add=(
                "WITH u AS MATERIALIZED (SELECT * FROM "
                "unnest($1::bytea[], $2::bigint[], $3::bytea[]) AS u(h, n, d)), "
                f"c AS (INSERT INTO {r} AS x (hash, refs) SELECT h, n FROM u ORDER BY h "
                "ON CONFLICT (hash) DO UPDATE SET refs = x.refs + EXCLUDED.refs "
                "RETURNING hash, refs), "
                f"i AS (INSERT INTO {b} (hash, data) SELECT u.h, u.d FROM u JOIN c "
                "ON c.hash = u.h AND c.refs = u.n ORDER BY u.h ON CONFLICT (hash) DO NOTHING) "
                "SELECT hash, refs FROM c"
            ),
            # release of one level: the data comes back only for blobs whose count reached 0,
            # whose children the caller releases next and which blob_drop then deletes.
            blob_release=(
                f"WITH l AS MATERIALIZED (SELECT hash FROM {r} WHERE hash = ANY($1::bytea[]) "
                "ORDER BY hash FOR NO KEY UPDATE), "
                f"x AS (UPDATE {r} AS x SET refs = x.refs - u.n "
                "FROM unnest($1::bytea[], $2::bigint[]) AS u(h, n) "
                "WHERE x.hash = u.h AND x.hash IN (SELECT hash FROM l) "
                "RETURNING x.hash, x.refs) "
                "SELECT x.hash, x.refs, CASE WHEN x.refs <= 0 THEN coalesce(d.data, '') END "
                f"FROM x LEFT JOIN {b} AS d ON d.hash = x.hash"
            ),
            blob_drop=(
                f"WITH z AS (DELETE FROM {r} WHERE hash = ANY($1::bytea[]) AND refs <= 0 "
                f"RETURNING hash) DELETE FROM {b} WHERE hash IN (SELECT hash FROM z)"
            ),
            # One writer of blob counts at a time per store (all processes): a walk locks
            # rows level by level, and two walks over trees that share nodes at different
            # levels would otherwise deadlock often (each costing the server's
            # deadlock_timeout, 1 s by default, before one is cancelled).
            blob_lock=(
                "SELECT pg_advisory_xact_lock(hashtext('aiocheckpoint.blobs:' || $1::text))"
            ),
            blob_fetch=(
                f"SELECT hash, data FROM {b} WHERE hash = ANY($1::bytea[]) "
                "AND octet_length(data) <= $2"
            ),
        )
