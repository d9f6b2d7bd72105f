"""Every statement the PostgreSQL store runs, bound to one schema; all values are parameters.

The schema name is the only identifier spliced into the text, and :func:`.schema.quote_schema`
has validated and quoted it. The tables are those of :mod:`.schema`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...format import MAGIC

__all__ = ["RECORD_COLUMNS", "VERSION_2", "Sql"]

# A version-2 record's bytes, else NULL: only those reference blobs, and only they are
# sent back when a record is replaced or deleted (its refs are then released). ``{c}`` is
# the column.
VERSION_2 = (
    "CASE WHEN substring({c} FROM 1 FOR 5) = "
    f"'\\x{(MAGIC + bytes([2])).hex()}'::bytea THEN {{c}} END"
)

#: The columns of a workflow record, in the order :func:`.leases.workflow_record` reads them.
RECORD_COLUMNS = (
    "workflow_id",
    "status",
    "created_at",
    "updated_at",
    "finished_at",
    "lease_owner",
    "lease_expires_at",
    "fencing_token",
    "metadata",
    "latest_step",
    "latest_agent_id",
    "latest_agent_status",
    "attempts",
    "last_error",
    "retry_at",
    "resume_input",
    "kind",
)


@dataclass(frozen=True, slots=True)
class Sql:
    """Every statement the backend runs, bound to one schema. All values are parameters."""

    workflows_table: str
    metadata_table: str
    in_doubt: str
    effect_put: str
    upsert: str
    upsert_tree: str
    prune: str
    #: The events saves carry (``StepInfo.note``): $1 ids, $2 kinds, $3 data, in order.
    note_events: str
    latest: str
    at_step: str
    scan_asc: str
    scan_desc: str
    exists_any: str
    exists_step: str
    delete_step: str
    delete_all: str
    delete_untouched: str
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
    register: str
    metadata_drop: str
    metadata_add: str
    resume: str
    ensure: str
    fail: str
    blob_add: str
    blob_release: str
    blob_drop: str
    blob_fetch: str
    blob_lock: str
    blob_try_lock: str

    @classmethod
    def for_schema(cls, quoted: str) -> Sql:
        """Build the statements for the quoted schema name."""
        t = f"{quoted}.checkpoints"
        w = f"{quoted}.workflows"
        b = f"{quoted}.blobs"
        r = f"{quoted}.blob_refs"
        e = f"{quoted}.effects"
        v2 = VERSION_2
        record = ", ".join(RECORD_COLUMNS)
        expiry = "now() + make_interval(secs => {ttl})"
        finished = "CASE WHEN $2 IN ('finished', 'failed') THEN now() END"
        # Reviving a failed workflow by hand gives it its whole retry budget again.
        revive = (
            "attempts = CASE WHEN x.status = 'failed' AND $2 = 'unfinished' THEN 0 "
            "ELSE x.attempts END"
        )
        # After failed run attempts + 1: retried while the delays ($3) last, else FAILED.
        retried = "x.attempts + 1 <= cardinality($3::float8[])"
        # $n of the size cap: the row's length is checked before its bytes are sent.
        capped = "step, octet_length(data), CASE WHEN octet_length(data) <= {cap} THEN data END"
        scan = (
            f"SELECT {capped.format(cap='$5')} FROM {t} "
            "WHERE workflow_id = $1 AND step > $2 AND step <= $3 ORDER BY step {order} LIMIT $4"
        )
        lock = "SELECT pg_{try_}advisory_xact_lock(hashtext('aiocheckpoint.blobs:' || {arg}::text))"

        def blob_ctes(h: int, lock_at: int | None) -> str:
            """One level's upsert, as ``WITH`` parts reading $h..$h+2 (the lock's at $lock_at).

            Counts are added (rows created at the count sent), and the data is stored for
            the hashes whose row was created now (its count is what was sent: an existing
            blob's ends above it, as no stored count is ever 0 or less once a transaction
            commits). With ``lock_at``, the blob lock first: ``bu`` is read only after ``blk``
            ran, and every insert reads ``bu``, so the lock comes before any row lock.
            """
            locked = lock_at is not None
            lk = f"blk AS MATERIALIZED ({lock.format(try_='', arg=f'${lock_at}')}), "
            return (
                f"{lk if locked else ''}bu AS MATERIALIZED (SELECT * FROM unnest(${h}::bytea[], "
                f"${h + 1}::bigint[], ${h + 2}::bytea[]) AS bu(h, n, d)"
                f"{' WHERE (SELECT count(*) FROM blk) > 0' if locked else ''}), "
                f"bc AS (INSERT INTO {r} AS x (hash, refs) SELECT h, n FROM bu ORDER BY h "
                "ON CONFLICT (hash) DO UPDATE SET refs = x.refs + EXCLUDED.refs "
                "RETURNING hash, refs), "
                f"bi AS (INSERT INTO {b} (hash, data) SELECT bu.h, bu.d FROM bu JOIN bc "
                "ON bc.hash = bu.h AND bc.refs = bu.n ORDER BY bu.h ON CONFLICT (hash) DO NOTHING)"
            )

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
        upsert = (
            "WITH {blobs}r AS MATERIALIZED (SELECT * FROM "
            "unnest($1::text[], $2::bigint[], $3::bytea[], $4::bigint[], $7::text[], "
            "$8::text[], $9::text[]) AS r(w, s, d, t, a, st, k){r_after}), "
            # A new record starts with its latest step; existing ones are moved by ``lat``.
            f"rec AS (INSERT INTO {w} (workflow_id, latest_step, latest_agent_id, "
            "latest_agent_status, kind) SELECT DISTINCT ON (w) w, "
            "CASE WHEN a IS NOT NULL THEN s END, a, st, coalesce(k, 'workflow') "
            "FROM r WHERE t IS NULL "
            "ORDER BY w, a IS NOT NULL DESC, s DESC "
            "ON CONFLICT (workflow_id) DO NOTHING RETURNING 1), "
            f"held AS MATERIALIZED (SELECT workflow_id, fencing_token FROM {w} "
            "WHERE workflow_id IN (SELECT w FROM r WHERE t IS NOT NULL) "
            "ORDER BY workflow_id FOR SHARE), "
            # The records of the workflows $6 names (those the batch's transaction will
            # prune, after locking its new rows): delete_all waits for this commit before
            # it locks any of their checkpoint rows.
            f"kept AS MATERIALIZED (SELECT workflow_id FROM {w} "
            "WHERE workflow_id = ANY($6::text[]){kept_after} ORDER BY workflow_id FOR KEY SHARE), "
            # The latest step of the records that existed (same rows as ``ok``): it only
            # moves forward, and any checkpoint consumes the resume input; a kind other
            # than the default names what writes the workflow, and sticks.
            f"lat AS (UPDATE {w} AS x SET updated_at = now(), resume_input = NULL, "
            "kind = CASE WHEN x.kind = 'workflow' THEN coalesce(u.k, x.kind) ELSE x.kind END, "
            "latest_agent_id = CASE WHEN u.s >= coalesce(x.latest_step, -1) THEN u.a "
            "ELSE x.latest_agent_id END, "
            "latest_agent_status = CASE WHEN u.s >= coalesce(x.latest_step, -1) THEN u.st "
            "ELSE x.latest_agent_status END, "
            "latest_step = greatest(u.s, x.latest_step) "
            "FROM (SELECT DISTINCT ON (r.w) r.w, r.s, r.a, r.st, r.k FROM r "
            "LEFT JOIN held ON held.workflow_id = r.w WHERE r.a IS NOT NULL "
            "AND (r.t IS NULL OR held.fencing_token = r.t) ORDER BY r.w, r.s DESC) AS u "
            "WHERE x.workflow_id = u.w RETURNING 1), "
            # ``rec``, ``kept`` and ``lat`` read here run before any checkpoint row is
            # locked: records first, then checkpoint rows, the order delete_all takes.
            "ok AS MATERIALIZED (SELECT r.w, r.s, r.d FROM r "
            "LEFT JOIN held ON held.workflow_id = r.w "
            "WHERE (SELECT count(*) FROM rec) + (SELECT count(*) FROM kept) "
            "+ (SELECT count(*) FROM lat) >= 0 "
            "AND (r.t IS NULL OR held.fencing_token = r.t)), "
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
            "SELECT ins.workflow_id, ins.step, ins.replaced, old.w IS NOT NULL, old.d{blob} "
            "FROM ins LEFT JOIN old ON old.w = ins.workflow_id AND old.s = ins.step{union}"
        )
        return cls(
            workflows_table=w,
            metadata_table=f"{quoted}.workflow_metadata",
            # A batch of effect records: each fenced row's token checked against its
            # workflow's record, locked FOR SHARE as the checkpoints' upsert does; RETURNING
            # names the rows written (the others had stale leases).
            effect_put=(
                "WITH r AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::bigint[], "
                "$3::text[], $4::boolean[], $5::bytea[], $6::bigint[]) AS r(w, s, k, x, d, t)), "
                f"held AS MATERIALIZED (SELECT workflow_id, fencing_token FROM {w} "
                "WHERE workflow_id IN (SELECT w FROM r WHERE t IS NOT NULL) "
                "ORDER BY workflow_id FOR SHARE) "
                f"INSERT INTO {quoted}.effects AS e (workflow_id, step, key, in_doubt, data) "
                "SELECT r.w, r.s, r.k, r.x, r.d FROM r LEFT JOIN held ON held.workflow_id = r.w "
                "WHERE r.t IS NULL OR held.fencing_token = r.t ORDER BY 1, 2, 3 "
                "ON CONFLICT (workflow_id, step, key) DO UPDATE "
                "SET in_doubt = EXCLUDED.in_doubt, data = EXCLUDED.data "
                "RETURNING workflow_id, step, key"
            ),
            # ``w`` has an effect in doubt: a lookup in the journal's partial index.
            in_doubt=(
                f"EXISTS (SELECT 1 FROM {quoted}.effects AS e "
                "WHERE e.workflow_id = w.workflow_id AND e.in_doubt)"
            ),
            upsert=upsert.format(blobs="", r_after="", kept_after="", blob="", union=""),
            # A batch of trees: the upsert, after the blob lock ($10) and the first level of
            # the trees' blobs ($11..$13, as blob_add), whose rows come back last (hash and
            # count in columns 6 and 7, the others NULL). ``r`` and ``kept`` read ``bc``, so
            # every row lock of the upsert comes after those of the level, as in separate
            # statements.
            upsert_tree=upsert.format(
                blobs=blob_ctes(11, lock_at=10) + ", ",
                r_after=" WHERE (SELECT count(*) FROM bc) >= 0",
                kept_after=" AND (SELECT count(*) FROM bc) >= 0",
                blob=", NULL::bytea, NULL::bigint",
                union=" UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, hash, refs FROM bc",
            ),
            # For each (workflow, keep) pair: the keep-th highest step is the lowest kept;
            # a workflow with fewer rows yields no cut and loses nothing. MATERIALIZED makes
            # the cut one index probe per workflow, not one per deleted row.
            note_events=(
                f"INSERT INTO {quoted}.workflow_events (workflow_id, kind, step, attempt, data) "
                "SELECT n.w, n.k, x.latest_step, NULL, n.d FROM unnest($1::text[], $2::text[], "
                f"$3::text[]) WITH ORDINALITY AS n(w, k, d, i) JOIN {w} AS x "
                "ON x.workflow_id = n.w ORDER BY n.i"
            ),
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
            # The step's effects go in the same statement (those of a step without a
            # checkpoint too), after its checkpoint row: the order every batch locks them in.
            delete_step=(
                f"WITH cps AS (DELETE FROM {t} WHERE workflow_id = $1 AND step = $2 "
                f"RETURNING {v2.format(c='data')} AS d), "
                f"fx AS (DELETE FROM {e} WHERE workflow_id = $1 AND step = $2 "
                "AND (SELECT count(*) FROM cps) >= 0) "
                "SELECT d FROM cps"
            ),
            # The record, lease and effect journal go with the checkpoints, in the same
            # statement (one snapshot: the effects of a run that starts the workflow again
            # once it has committed are kept): the record first (``lk`` reads ``rec``), then
            # the checkpoint rows locked in step order, then the effects (``fx`` reads
            # ``lk``), the order every batch locks them in.
            delete_all=(
                f"WITH rec AS (DELETE FROM {w} WHERE workflow_id = $1 RETURNING 1), "
                f"lk AS MATERIALIZED (SELECT step FROM {t} WHERE workflow_id = $1 "
                "AND (SELECT count(*) FROM rec) >= 0 ORDER BY step FOR UPDATE), "
                f"cps AS (DELETE FROM {t} WHERE workflow_id = $1 AND step IN (SELECT step FROM lk) "
                f"RETURNING {v2.format(c='data')} AS d), "
                f"fx AS (DELETE FROM {e} WHERE workflow_id = $1 "
                "AND (SELECT count(*) FROM lk) >= 0) "
                "SELECT (SELECT count(*) FROM rec) + (SELECT count(*) FROM cps), "
                "(SELECT array_agg(d) FROM cps WHERE d IS NOT NULL)"
            ),
            # delete_all's statement, only while the record was last changed at $2 and no
            # live lease holds it; it also sums the deleted records' bytes.
            delete_untouched=(
                f"WITH rec AS (DELETE FROM {w} WHERE workflow_id = $1 AND updated_at = $2 "
                "AND (lease_owner IS NULL OR lease_expires_at <= now()) RETURNING 1), "
                f"lk AS MATERIALIZED (SELECT step FROM {t} WHERE workflow_id = $1 "
                "AND (SELECT count(*) FROM rec) > 0 ORDER BY step FOR UPDATE), "
                f"cps AS (DELETE FROM {t} WHERE workflow_id = $1 AND step IN (SELECT step FROM lk) "
                f"RETURNING {v2.format(c='data')} AS d, octet_length(data) AS n), "
                f"fx AS (DELETE FROM {e} WHERE workflow_id = $1 "
                "AND (SELECT count(*) FROM rec) > 0 AND (SELECT count(*) FROM lk) >= 0) "
                "SELECT CASE WHEN (SELECT count(*) FROM rec) > 0 "
                "THEN (SELECT coalesce(sum(n), 0) FROM cps) END, "
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
                f"updated_at = now(), retry_at = NULL, {revive} "
                f"WHERE x.status <> 'cancelled' RETURNING {record}"
            ),
            status_fenced=(
                f"UPDATE {w} AS x SET status = $2, finished_at = {finished}, updated_at = now(), "
                f"retry_at = NULL, {revive} "
                "WHERE workflow_id = $1 AND fencing_token = $3 AND x.status <> 'cancelled' "
                f"RETURNING {record}"
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
                "AND kind = 'workflow' AND (lease_expires_at IS NULL OR lease_expires_at <= now()) "
                "AND (retry_at IS NULL OR retry_at <= now()) "
                "ORDER BY created_at, workflow_id LIMIT 1 FOR UPDATE SKIP LOCKED) AS c "
                "WHERE x.workflow_id = c.workflow_id "
                "RETURNING x.workflow_id, x.fencing_token, x.lease_expires_at"
            ),
            register=(
                f"INSERT INTO {w} AS x (workflow_id, metadata, kind) "
                "VALUES ($1, coalesce($2, '{}'), coalesce($3, 'workflow')) "
                "ON CONFLICT (workflow_id) DO UPDATE SET metadata = coalesce($2, x.metadata), "
                # A kind other than the default names what writes the workflow: it sticks.
                "kind = CASE WHEN x.kind = 'workflow' THEN coalesce($3, x.kind) "
                "ELSE x.kind END, "
                "updated_at = CASE WHEN $2 IS NULL THEN x.updated_at ELSE now() END "
                f"RETURNING {record}"
            ),
            metadata_drop=f"DELETE FROM {quoted}.workflow_metadata WHERE workflow_id = $1",
            metadata_add=(
                f"INSERT INTO {quoted}.workflow_metadata (workflow_id, key, value) "
                "SELECT $1, k, v FROM unnest($2::text[], $3::text[]) AS m(k, v)"
            ),
            resume=(
                f"UPDATE {w} SET status = 'unfinished', finished_at = NULL, retry_at = NULL, "
                "resume_input = $2, updated_at = now() WHERE workflow_id = $1 "
                f"AND status = 'paused' RETURNING {record}"
            ),
            ensure=f"INSERT INTO {w} (workflow_id) VALUES ($1) ON CONFLICT DO NOTHING",
            fail=(
                f"UPDATE {w} AS x SET attempts = x.attempts + 1, last_error = $2, "
                f"status = CASE WHEN {retried} THEN 'unfinished' ELSE 'failed' END, "
                f"retry_at = CASE WHEN {retried} THEN now() + "
                "make_interval(secs => ($3::float8[])[x.attempts + 1]) END, "
                f"finished_at = CASE WHEN {retried} THEN NULL ELSE now() END, "
                "updated_at = now() WHERE x.workflow_id = $1 "
                f"AND ($4::bigint IS NULL OR x.fencing_token = $4) AND x.status <> 'cancelled' "
                f"RETURNING {record}"
            ),
            # add_ref of one tree level (section 8 of docs/incremental.md), for many hashes
            # at once: $2 is how many new referrers each hash gets. A blob that exists gets
            # refs + n (its sub-tree is counted already); a missing one is inserted with n,
            # which the caller recognises (an existing blob has refs >= 1, so it ends > n)
            # and then adds refs for its children. Sorted input locks rows in one order; a
            # row a concurrent release is deleting is waited for, then inserted again.
            blob_add=f"WITH {blob_ctes(1, lock_at=None)} SELECT hash, refs FROM bc",
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
            blob_lock=lock.format(try_="", arg="$1"),
            # The same lock, for a transaction that holds row locks already: it may not wait
            # for it (docs/postgres-storage.md, "Lock order").
            blob_try_lock=lock.format(try_="try_", arg="$1"),
            blob_fetch=(
                f"SELECT hash, data FROM {b} WHERE hash = ANY($1::bytea[]) "
                "AND octet_length(data) <= $2"
            ),
        )
