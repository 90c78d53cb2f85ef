-- idempotency install script: schema ownership and storage.
--
-- The install script is assembled from the files of sql/parts, in name
-- order, by the Makefile; edit the parts, not the assembled script.

-- complain if the script is sourced in psql rather than run by CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- The schema is created here, not named in the control file, so that it is a
-- member of the extension and DROP EXTENSION removes it with everything else.
CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

/*
 * Per-endpoint policy.  Claims take their defaults from here, then from the
 * idempotency.* settings.  Its rows are the operator's, so pg_dump keeps them.
 */
CREATE TABLE idempotency.endpoints (
    endpoint            text PRIMARY KEY
                        CHECK (length(endpoint) BETWEEN 1 AND 255),
    ttl                 interval CHECK (ttl > interval '0'),
    lease               interval CHECK (lease > interval '0'),
    on_lease_expiry     text NOT NULL DEFAULT 'unknown'
                        CHECK (on_lease_expiry IN ('unknown', 'resolve')),
    -- the resolver by its canonical name, such as
    -- public.my_resolver(text,text,text): the trigger endpoints_resolver
    -- checks and normalizes it, a call finds the function again by it
    -- (text, not regprocedure: pg_upgrade keeps no function OIDs)
    resolver            text,
    max_response_bytes  integer CHECK (max_response_bytes >= 0),
    store_response      boolean NOT NULL DEFAULT true,
    CHECK (on_lease_expiry = 'unknown' OR resolver IS NOT NULL),
    -- the role the resolver runs as: set by the trigger endpoints_resolver
    -- (sql/parts/10_endpoints.sql) to the role that sets the resolver
    resolver_role       regrole,
    -- false: claims keep no request digest (sql/parts/72_diagnostics.sql)
    diagnostics         boolean NOT NULL DEFAULT true,
    -- tombstones of expired keys (sql/parts/74_tombstones.sql): how long
    -- they are kept after a key expires (NULL: idempotency.tombstone_ttl;
    -- 0: none), and what a claim of an expired key with the same
    -- fingerprint gets ('execute' again, or 'conflict': 409 key_expired)
    tombstone_ttl       interval
                        CONSTRAINT endpoints_tombstone_ttl_range
                        CHECK (tombstone_ttl >= interval '0' AND tombstone_ttl <= interval '10 years'),
    on_expired_reuse    text NOT NULL DEFAULT 'execute'
                        CONSTRAINT endpoints_on_expired_reuse_check
                        CHECK (on_expired_reuse IN ('execute', 'conflict')),
    -- JSON Pointers of members that mismatch answers never name (card
    -- data); checked, with ttl and lease, by the trigger endpoints_check
    -- (sql/parts/10_endpoints.sql)
    diagnostics_redact  text[]
);
SELECT pg_catalog.pg_extension_config_dump('idempotency.endpoints', '');

/*
 * One row per (tenant, endpoint, key) and logical operation, partitioned by
 * expiry time so that expired keys leave by whole partitions.  Only the
 * extension's functions write it.  A row whose expires_at has passed is dead
 * to every function even before its partition is dropped.
 *
 * Uniqueness of the live row per (tenant, endpoint, key) is guaranteed by the
 * claim, which serialises on the scope (see src/claim.c); each partition
 * carries a unique index on (key, endpoint, tenant) as a safety net and for
 * lookups: key first, so that an index descent decides on the first column.
 * The scope columns compare byte-wise (COLLATE "C"): keys are identifiers,
 * never sorted for people, and a descent then compares with memcmp rather
 * than with the database's locale.
 */
CREATE TABLE idempotency.keys (
    tenant          text COLLATE "C" NOT NULL,
    endpoint        text COLLATE "C" NOT NULL,
    key             text COLLATE "C" NOT NULL,
    fingerprint     bytea NOT NULL,
    state           text NOT NULL
                    CHECK (state IN ('in_progress', 'completed', 'failed', 'unknown')),
    lease_token     bigint,
    locked_until    timestamptz,
    response_status integer,
    response_headers jsonb,
    body_kind       text
                    CHECK (body_kind IN ('json', 'bytes', 'ref', 'omitted')),
    body_encrypted  boolean NOT NULL DEFAULT false,
    response_body   bytea,
    body_ref        text,
    fail_reason     text,
    created_at      timestamptz NOT NULL,
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL,
    -- mismatch diagnostics: keyed hashes of the request's members, never
    -- their values (sql/parts/72_diagnostics.sql)
    request_digest  bytea
) PARTITION BY RANGE (expires_at);

/*
 * Rows whose expiry no dated partition covers land here, so that a claim
 * never fails because maintenance fell behind; maintenance moves them into
 * dated partitions.  Dated partitions are made by maintenance, outside this
 * script, so they are ordinary tables that pg_dump saves with their rows.
 */
CREATE TABLE idempotency.keys_default PARTITION OF idempotency.keys DEFAULT;
CREATE UNIQUE INDEX keys_default_scope_idx
    ON idempotency.keys_default (key, endpoint, tenant);
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys_default', '');

/*
 * Replica identity (doc/operations.md): a lease's finish, heartbeat, fail
 * and release update or delete rows, which a database with a publication
 * FOR ALL TABLES, or a Citus shard move, refuses on a table without one.
 * Partitions do not inherit it: each partition of keys names its unique
 * scope index (maintenance does so for the partitions it makes, see
 * src/maint_partitions.c).  The parent is FULL, so that a publication with
 * publish_via_partition_root marks every column as a key column, which
 * covers each partition's index on the subscriber.
 */
ALTER TABLE idempotency.keys REPLICA IDENTITY FULL;
ALTER TABLE idempotency.keys_default REPLICA IDENTITY USING INDEX keys_default_scope_idx;

/*
 * Leased claims still in progress, for the maintenance pass that looks for
 * stale leases, which would otherwise read every live row.  Partial, so
 * that completed rows (nearly all of them) have no entry.  Every partition
 * made by maintenance has one too, named after it (PARTITION_lease_idx);
 * the claim's direct insert leaves it out for rows that are not leased
 * claims in progress.  (Not a partitioned index on the parent: pg_restore
 * would then meet each partition's part twice.)
 */
CREATE INDEX keys_default_lease_idx ON idempotency.keys_default (locked_until)
    WHERE state = 'in_progress';

REVOKE ALL ON idempotency.keys, idempotency.keys_default, idempotency.endpoints
    FROM PUBLIC;

/*
 * Key horizons (src/horizon.c): a claim probes only the partitions that can
 * hold its endpoint's rows.  The extension's own writes raise the horizon
 * themselves; a row written by SQL (idem_import_keys, maintenance moving
 * rows out of the default partition, a restore, a logical replication
 * apply, hence ENABLE ALWAYS) raises it from this trigger, which each
 * partition has as a clone.
 */
CREATE FUNCTION idempotency.idem_keys_horizon_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_keys_horizon_trigger'
LANGUAGE C;
COMMENT ON FUNCTION idempotency.idem_keys_horizon_trigger() IS
    'Raises the key horizon of a row of idempotency.keys written by SQL (trigger keys_horizon)';
CREATE TRIGGER keys_horizon BEFORE INSERT OR UPDATE ON idempotency.keys
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_keys_horizon_trigger();
ALTER TABLE idempotency.keys ENABLE ALWAYS TRIGGER keys_horizon;
