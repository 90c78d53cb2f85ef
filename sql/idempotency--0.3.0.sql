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
    resolver            regprocedure,
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
                        CHECK (on_expired_reuse IN ('execute', 'conflict'))
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
-- idempotency install script: endpoint policies are cached per backend;
-- a change tells every backend to reload them.

CREATE FUNCTION idempotency.idem_endpoints_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_changed'
LANGUAGE C;

CREATE TRIGGER endpoints_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.idem_endpoints_changed();

-- Who a resolver runs as: resolver_role defaults to the role that sets the
-- resolver, who must have EXECUTE on it and the privileges of any other
-- role named; the role must have EXECUTE too (see src/resolver.c).
CREATE FUNCTION idempotency.idem_endpoints_resolver()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_resolver'
LANGUAGE C;

CREATE TRIGGER endpoints_resolver
    BEFORE INSERT OR UPDATE ON idempotency.endpoints
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_resolver();

CREATE FUNCTION idempotency.idem_key_valid(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_key_valid'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- idempotency install script: the claim/finish protocol.
--
-- Clients need no rights on idempotency.keys: the functions read and write
-- it directly, and run what SQL they need as the table's owner with a
-- pinned search_path (src/idempotency.c).  They are not SECURITY DEFINER,
-- which would cost every call a switch of user and settings.

CREATE TYPE idempotency.claim_result AS (
    action           text,          -- execute | replay | in_progress | mismatch | pending | expired
    http_status      integer,       -- what to answer, unless action = execute
    error_code       text,          -- request_in_progress | idempotency_key_reuse | outcome_pending | key_expired
    retry_after      integer,       -- seconds, for the Retry-After header of a 409
    response_status  integer,       -- replay: the stored status
    response_headers jsonb,         -- replay: stored headers plus Idempotent-Replayed and Idempotency-Key
    response_body    bytea,         -- replay: the stored body, byte for byte
    response_json    jsonb,         -- replay: the stored body, when it was JSON
    lease_token      bigint,        -- execute in lease mode: present it to finish
    expires_at       timestamptz,   -- when the key is forgotten
    replayed         boolean,
    response_body_ref text,         -- replay: where the body is, when it was stored as a reference
    mismatch         jsonb          -- mismatch: the members that differ, when both requests had a digest
);

CREATE FUNCTION idempotency.idem_claim(
    tenant text, endpoint text, key text, fingerprint bytea,
    ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
    wait interval DEFAULT NULL, digest bytea DEFAULT NULL)
RETURNS idempotency.claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_finish(
    tenant text, endpoint text, key text, status integer,
    body jsonb DEFAULT NULL, headers jsonb DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_finish_bytes(
    tenant text, endpoint text, key text, status integer,
    body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish_bytes'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_finish_ref(
    tenant text, endpoint text, key text, status integer, body_ref text,
    headers jsonb DEFAULT NULL, lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish_ref'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_fail(
    tenant text, endpoint text, key text,
    outcome text DEFAULT 'unknown', reason text DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_release(
    tenant text, endpoint text, key text, lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_heartbeat(
    tenant text, endpoint text, key text, lease_token bigint, extend interval)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_heartbeat'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_resolve(
    tenant text, endpoint text, key text, status integer, body jsonb,
    headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_resolve'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_lookup(tenant text, endpoint text, key text)
RETURNS TABLE (state text, fingerprint bytea, lease_held boolean,
               created_at timestamptz, completed_at timestamptz,
               expires_at timestamptz, locked_until timestamptz,
               response_status integer)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE
ROWS 1;
-- idempotency install script: request fingerprints.
--
-- RFC 8785 (JSON Canonicalization Scheme) serialization of request bodies,
-- its SHA-256, and the request fingerprint over method, path and body.
--
-- Each function exists with and without its trailing exclusion list rather
-- than with "exclude text[] DEFAULT '{}'": resolving an argument default
-- costs the parser and the planner, on every simple-protocol query, about as
-- much as canonicalizing and hashing a 300-byte body.  Both forms run the
-- same C function; without the list nothing is excluded.

CREATE FUNCTION idempotency.idem_canonical_json(body jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json(body jsonb, exclude text[])
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json(jsonb) IS
'RFC 8785 canonical form of a jsonb value';
COMMENT ON FUNCTION idempotency.idem_canonical_json(jsonb, text[]) IS
'RFC 8785 canonical form of a jsonb value, without the members named by the JSON Pointers in exclude';

CREATE FUNCTION idempotency.idem_canonical_json_sha256(body jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json_sha256(body jsonb, exclude text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json_sha256(jsonb) IS
'SHA-256 of the UTF-8 bytes of idem_canonical_json(body)';
COMMENT ON FUNCTION idempotency.idem_canonical_json_sha256(jsonb, text[]) IS
'SHA-256 of the UTF-8 bytes of idem_canonical_json(body, exclude)';

-- Raw JSON text has its own names, so that an untyped literal never has to
-- choose between text and jsonb: it rejects duplicate member names.
CREATE FUNCTION idempotency.idem_canonical_json_text(body text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json_text'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json_text(body text, exclude text[])
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json_text'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json_text(text) IS
'RFC 8785 canonical form of raw JSON text; duplicate member names are an error (22030)';
COMMENT ON FUNCTION idempotency.idem_canonical_json_text(text, text[]) IS
'RFC 8785 canonical form of raw JSON text without the members named in exclude; duplicate member names are an error (22030)';

CREATE FUNCTION idempotency.idem_canonical_json_text_sha256(body text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_text_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json_text_sha256(body text, exclude text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_text_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json_text_sha256(text) IS
'SHA-256 of idem_canonical_json_text(body)';
COMMENT ON FUNCTION idempotency.idem_canonical_json_text_sha256(text, text[]) IS
'SHA-256 of idem_canonical_json_text(body, exclude)';

-- Not strict: a NULL body is a request without a body, a NULL exclusion
-- list excludes nothing; a NULL method or path is an error.
CREATE FUNCTION idempotency.idem_fingerprint(method text, path text, body jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION idempotency.idem_fingerprint(method text, path text, body jsonb, exclude text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_fingerprint(text, text, jsonb) IS
'SHA-256 over "idem-fingerprint-v1", the upper-cased method, the path and the canonical body (see README)';
COMMENT ON FUNCTION idempotency.idem_fingerprint(text, text, jsonb, text[]) IS
'SHA-256 over "idem-fingerprint-v1", the upper-cased method, the path and the canonical body without the members named in exclude (see README)';

CREATE FUNCTION idempotency.idem_number_text(value float8)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_number_text'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_number_text(float8) IS
'ECMAScript (RFC 8785) serialization of a double, as used for JSON numbers in canonical form';
-- idempotency install script: maintenance (stale leases, partitions).
--
-- Dated partitions of idempotency.keys are made by maintenance, never here:
-- CREATE EXTENSION makes only the default partition, and partitions made
-- later are ordinary tables that pg_dump saves with their rows.

-- One maintenance pass as if the clock read as_of; one row per action:
--   lease_unknown / lease_completed / lease_failed / resolver_error
--       (object: endpoint; rows: keys),
--   purge (keys_default; expired rows deleted from the default partition;
--       tombstones_default: expired tombstones deleted from it),
--   tombstone (keys_default or a partition of keys being dropped;
--       tombstones written of its expired rows, see 74_tombstones.sql),
--   create (partition; rows moved into it from the default partition),
--   drop (partition; rows as estimated by pg_class.reltuples, NULL if never
--       counted),
--   skipped (object whose lock was not granted within the lock_timeout),
--   busy (another pass of this database is running; nothing was done).
-- With preview, or when preview is NULL and as_of lies in the future, it
-- only reports what the pass would do (lease_resolve: stale leases the
-- resolver would be asked about) and changes nothing.  as_of must lie in
-- [1970-01-01, 9000-01-01) UTC.
-- Admin only: EXECUTE is revoked from PUBLIC.
CREATE FUNCTION idempotency.idem_maintenance(as_of timestamptz DEFAULT pg_catalog.now(),
                                             preview boolean DEFAULT NULL)
RETURNS TABLE (kind text, object text, rows bigint)
AS 'MODULE_PATHNAME', 'idem_maintenance'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE EXECUTE ON FUNCTION idempotency.idem_maintenance(timestamptz, boolean) FROM PUBLIC;
-- idempotency install script: operations.  Key helpers, counters and the
-- views over them, the audit trail, storage of response bodies, and the
-- privilege model (roles idempotency_client and idempotency_admin).  This
-- part runs after the core's, so that it can grant on the core's functions.

-- Key helpers: keys minted server-side, and keys derived for downstream calls.

CREATE FUNCTION idempotency.idem_uuidv7()
RETURNS uuid
AS 'MODULE_PATHNAME', 'idem_uuidv7'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_uuidv7() IS
    'A UUID version 7 (RFC 9562), increasing within a session';

CREATE FUNCTION idempotency.idem_ulid()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_ulid'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_ulid() IS
    'A ULID (26 characters of Crockford base32), increasing within a session';

CREATE FUNCTION idempotency.idem_token()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_token'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_token() IS
    '16 random bytes in base64url: 22 characters';

CREATE FUNCTION idempotency.idem_downstream_key(tenant text, endpoint text,
                                                key text, step text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_downstream_key'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_downstream_key(text, text, text, text) IS
    'The idempotency key of one step of an operation towards another service, derived from its whole scope';

CREATE FUNCTION idempotency.idem_key_hash(tenant text, endpoint text, key text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_key_hash'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_key_hash(text, text, text) IS
    'What logs and idempotency.events show instead of a key';

-- Counters in shared memory (need shared_preload_libraries).

CREATE FUNCTION idempotency.idem_stats(
    missing_ok boolean DEFAULT false,
    OUT endpoint text,
    OUT untracked boolean,
    OUT claims bigint,
    OUT executes bigint,
    OUT replays bigint,
    OUT in_progress bigint,
    OUT mismatches bigint,
    OUT pending bigint,
    OUT finishes bigint,
    OUT releases bigint,
    OUT fails bigint,
    OUT invalid_keys bigint,
    OUT leases_expired bigint,
    OUT resolved bigint,
    OUT diagnosed bigint,
    OUT tombstone_hits bigint,
    OUT reset_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idempotency.idem_stats(boolean) IS
    'Counters per endpoint and in total (endpoint NULL) since reset_at';

CREATE FUNCTION idempotency.idem_stats_reset()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION idempotency.idem_stats_reset() IS
    'Zero every counter; returns the new reset time';

-- One row per endpoint counted, then the endpoints that found the table of
-- counters full (endpoint NULL, untracked), then the totals (endpoint NULL).
CREATE VIEW idempotency.stats AS
SELECT endpoint, untracked, claims, executes, replays, in_progress,
       mismatches, pending, finishes, releases, fails, invalid_keys,
       leases_expired, resolved, diagnosed, tombstone_hits, reset_at
FROM idempotency.idem_stats()
ORDER BY endpoint IS NULL, untracked DESC, endpoint;

-- Health per endpoint, from the live rows of the table, with the ratios of
-- the counters since their reset (NULL without shared_preload_libraries or
-- before the first claim).  Alert on a rising mismatch_ratio (a client
-- reusing keys), a rising conflict_ratio (contention or slow handlers), any
-- old in_progress row, and any unknown row.
CREATE VIEW idempotency.health AS
WITH live AS (
    SELECT endpoint,
           count(*) AS live_keys,
           count(*) FILTER (WHERE state = 'in_progress') AS in_progress,
           now() - min(created_at) FILTER (WHERE state = 'in_progress')
               AS oldest_in_progress_age,
           count(*) FILTER (WHERE state = 'unknown') AS unknown,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           coalesce(sum(pg_catalog.pg_column_size(response_body)), 0)::bigint
               AS stored_bytes
    FROM idempotency.keys
    WHERE expires_at > now()
    GROUP BY endpoint
), counters AS (
    SELECT * FROM idempotency.idem_stats(true) WHERE endpoint IS NOT NULL
)
SELECT coalesce(l.endpoint, c.endpoint) AS endpoint,
       coalesce(l.live_keys, 0) AS live_keys,
       coalesce(l.in_progress, 0) AS in_progress,
       l.oldest_in_progress_age,
       coalesce(l.unknown, 0) AS unknown,
       coalesce(l.failed, 0) AS failed,
       coalesce(l.stored_bytes, 0) AS stored_bytes,
       c.claims,
       round(c.replays::numeric / nullif(c.claims, 0), 4) AS replay_ratio,
       round((c.in_progress + c.pending)::numeric / nullif(c.claims, 0), 4)
           AS conflict_ratio,
       round(c.mismatches::numeric / nullif(c.claims, 0), 4) AS mismatch_ratio,
       c.tombstone_hits,
       c.reset_at AS counters_since
FROM live l
FULL JOIN counters c ON c.endpoint = l.endpoint
ORDER BY 1;

-- The audit trail: one row per state change of a key while
-- idempotency.audit is on, written in the transaction that made the change.
-- Never the key itself: key_hash is idem_key_hash(tenant, endpoint, key).
-- Append-only for everybody but the table's owner, who decides retention;
-- pg_dump keeps its rows.
CREATE TABLE idempotency.events (
    id                  bigserial PRIMARY KEY,
    at                  timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor               text,
    tenant              text NOT NULL,
    endpoint            text NOT NULL,
    key_hash            text NOT NULL,
    fingerprint_prefix  text,
    from_state          text,
    to_state            text,
    replayed            boolean NOT NULL DEFAULT false,
    response_status     integer,
    elapsed_ms          bigint
);
CREATE INDEX events_key_hash_idx ON idempotency.events (key_hash);
COMMENT ON TABLE idempotency.events IS
    'State changes of keys, appended while idempotency.audit is on';
SELECT pg_catalog.pg_extension_config_dump('idempotency.events', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.events_id_seq', '');

CREATE FUNCTION idempotency.idem_events_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_events_guard'
LANGUAGE C;

CREATE TRIGGER events_append_only
    BEFORE UPDATE OR DELETE ON idempotency.events
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_events_guard();
CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON idempotency.events
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.idem_events_guard();

REVOKE ALL ON idempotency.events, idempotency.events_id_seq FROM PUBLIC;

-- Stored bodies are compressed with lz4 where the server has it.  Partitions
-- do not follow a change of the parent's column: the default partition is
-- changed too, and partitions created later take the parent's setting.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_settings
               WHERE name = 'default_toast_compression'
                 AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE idempotency.keys ALTER COLUMN response_body SET COMPRESSION lz4;
        ALTER TABLE idempotency.keys_default ALTER COLUMN response_body SET COMPRESSION lz4;
    END IF;
END
$$;

-- Privileges.  Roles are objects of the whole cluster: they are created here
-- when missing and survive DROP EXTENSION (drop them by hand if wanted).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_client') THEN
        CREATE ROLE idempotency_client NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_admin') THEN
        CREATE ROLE idempotency_admin NOLOGIN;
    END IF;
    IF NOT pg_catalog.pg_has_role('idempotency_admin', 'idempotency_client', 'MEMBER') THEN
        GRANT idempotency_client TO idempotency_admin;
    END IF;
END
$$;

-- idempotency install script: moving a tenant's keys between databases,
-- for re-partitioning a sharded deployment (README "Scaling out").
--
-- idem_export_keys returns one jsonb object per live key of a tenant (the
-- row of idempotency.keys as to_jsonb writes it); idem_import_keys writes
-- such objects into this database, keeping every column (expires_at, the
-- lease, the stored response) as it was.  Admin only: EXECUTE is revoked
-- from PUBLIC (sql/parts/99_privileges.sql).

-- The tenant checks shared by both: a NULL or empty tenant is malformed
-- (IK400), another tenant than the one the session is bound to is refused
-- (IK401), as the claim functions do.
CREATE FUNCTION idempotency.idem_transfer_check_tenant(tenant text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound text := pg_catalog.current_setting('idempotency.tenant', true);
BEGIN
    IF tenant IS NULL OR tenant = '' THEN
        RAISE EXCEPTION 'tenant is empty'
            USING ERRCODE = 'IK400',
                  DETAIL = 'Every key is scoped by tenant and endpoint; neither may be empty.';
    END IF;
    IF bound IS NOT NULL AND bound <> '' AND bound <> tenant COLLATE "C" THEN
        RAISE EXCEPTION 'this session may not act for tenant "%"', tenant
            USING ERRCODE = 'IK401',
                  DETAIL = pg_catalog.format('The setting idempotency.tenant binds this session to tenant "%s".', bound),
                  HINT = 'Pass the session''s own tenant, or connect as a role bound to the other tenant.';
    END IF;
END
$$;

-- Every live key of the tenant, in (endpoint, key) order.
CREATE FUNCTION idempotency.idem_export_keys(tenant text)
RETURNS SETOF jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.idem_transfer_check_tenant(tenant);
    RETURN QUERY
        -- without request_digest: with idem_request_digest it would let the
        -- holder test guesses of the request's values, and another
        -- database's secret could not read it anyway
        SELECT pg_catalog.to_jsonb(k) OPERATOR(pg_catalog.-) 'request_digest'
        FROM idempotency.keys k
        WHERE k.tenant = idem_export_keys.tenant
          AND k.expires_at > pg_catalog.now()
        ORDER BY k.endpoint, k.key;
END
$$;
COMMENT ON FUNCTION idempotency.idem_export_keys(text) IS
    'Every live key of a tenant, one jsonb object per key, for idem_import_keys in another database';

-- Write keys exported by idem_export_keys (a jsonb array of them, or one
-- object).  A key whose live row here has the same content is left alone
-- (so that an import can run twice), one already expired is skipped, and a
-- live row with other content is never overwritten: an error (IK409), or
-- with on_conflict => 'keep' counted and left as it is.  One row per
-- outcome: inserted, unchanged, kept, expired.
--
-- Claims serialise on a lock of their scope that SQL cannot take; the
-- import locks idempotency.keys instead (ACCESS EXCLUSIVE, until the
-- transaction ends), which waits for every transaction that holds a claim
-- of this database and holds back new ones, and it reads what committed
-- before with a statement snapshot, which needs READ COMMITTED.
CREATE FUNCTION idempotency.idem_import_keys(keys jsonb, on_conflict text DEFAULT 'error')
RETURNS TABLE (outcome text, rows bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    items jsonb := idem_import_keys.keys;
    item jsonb;
    pos bigint := 0;
    r idempotency.keys;
    cur idempotency.keys;
    n_inserted bigint := 0;
    n_unchanged bigint := 0;
    n_kept bigint := 0;
    n_expired bigint := 0;
BEGIN
    IF on_conflict IS NULL OR on_conflict NOT IN ('error', 'keep') THEN
        RAISE EXCEPTION 'invalid value for on_conflict: "%"', on_conflict
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Valid values are "error" and "keep".';
    END IF;
    IF items IS NULL THEN
        RAISE EXCEPTION 'keys to import must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.jsonb_typeof(items) = 'object' THEN
        items := pg_catalog.jsonb_build_array(items);
    ELSIF pg_catalog.jsonb_typeof(items) <> 'array' THEN
        RAISE EXCEPTION 'keys to import must be a JSON array or object'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass what idem_export_keys returns: one object per key, or an array of them (jsonb_agg).';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'idem_import_keys must run at isolation level READ COMMITTED'
            USING ERRCODE = 'active_sql_transaction',
                  DETAIL = 'The import must see every key committed before it took its lock, which a transaction snapshot taken earlier would hide.';
    END IF;

    LOCK TABLE ONLY idempotency.keys IN ACCESS EXCLUSIVE MODE;

    FOR item IN SELECT e.value FROM pg_catalog.jsonb_array_elements(items) e
    LOOP
        pos := pos + 1;
        IF pg_catalog.jsonb_typeof(item) <> 'object' THEN
            RAISE EXCEPTION 'element % of the keys to import is not a JSON object', pos
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        r := pg_catalog.jsonb_populate_record(NULL::idempotency.keys, item);
        PERFORM idempotency.idem_transfer_check_tenant(r.tenant);
        IF r.endpoint IS NULL OR r.endpoint = ''
           OR NOT coalesce(idempotency.idem_key_valid(r.key), false) THEN
            RAISE EXCEPTION 'element % of the keys to import has no valid endpoint and key', pos
                USING ERRCODE = 'IK400',
                      DETAIL = 'Every key is scoped by tenant and endpoint; neither may be empty, and the key must be well-formed.';
        END IF;
        IF r.expires_at IS NULL OR r.created_at IS NULL THEN
            RAISE EXCEPTION 'element % of the keys to import has no created_at or expires_at', pos
                USING ERRCODE = 'IK400';
        END IF;

        IF r.expires_at <= pg_catalog.now() THEN
            n_expired := n_expired + 1;
            CONTINUE;
        END IF;

        SELECT * INTO cur
        FROM idempotency.keys k
        WHERE k.key = r.key AND k.endpoint = r.endpoint AND k.tenant = r.tenant
          AND k.expires_at > pg_catalog.now();
        IF FOUND THEN
            IF pg_catalog.to_jsonb(cur) OPERATOR(pg_catalog.-) 'request_digest'
               = pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.-) 'request_digest' THEN
                n_unchanged := n_unchanged + 1;
            ELSIF on_conflict = 'keep' THEN
                n_kept := n_kept + 1;
            ELSE
                RAISE EXCEPTION 'element % of the keys to import differs from the live key of its scope', pos
                    USING ERRCODE = 'IK409',
                          DETAIL = pg_catalog.format('Key %s of tenant "%s" and endpoint "%s" is %s here; the import never overwrites a live key.',
                                                     idempotency.idem_key_hash(r.tenant, r.endpoint, r.key),
                                                     r.tenant, r.endpoint, cur.state),
                          HINT = 'Compare the two with idem_lookup, or pass on_conflict => ''keep'' to keep the keys already here.';
            END IF;
            CONTINUE;
        END IF;

        -- an expired row of the scope would hold its partition's unique index
        DELETE FROM idempotency.keys k
        WHERE k.key = r.key AND k.endpoint = r.endpoint AND k.tenant = r.tenant;
        INSERT INTO idempotency.keys SELECT r.*;
        n_inserted := n_inserted + 1;
    END LOOP;

    RETURN QUERY VALUES ('inserted', n_inserted), ('unchanged', n_unchanged),
                        ('kept', n_kept), ('expired', n_expired);
END
$$;
COMMENT ON FUNCTION idempotency.idem_import_keys(jsonb, text) IS
    'Write keys exported by idem_export_keys, keeping expires_at; never overwrites a live key with other content';
-- idempotency install script: the Citus mode (README "Scaling out",
-- "Citus").  citus_distribute makes idempotency.keys a distributed
-- table colocated by tenant with the application's tables, endpoints a
-- reference table, and the per-key functions distributed functions, so that
-- a claim runs on the node that holds the tenant's shard (src/keystore.c
-- resolves that shard and refuses a tenant whose shard is elsewhere).

/*
 * Run on each worker by citus_distribute, before idempotency.keys is
 * distributed: drop this node's dated partitions of its local (not yet
 * distributed) idempotency.keys, which Citus would otherwise try to create
 * again as shells of the coordinator's partitions.  Refuses when this
 * node's keys hold rows: they would be lost.
 */
CREATE FUNCTION idempotency.idem_citus_drop_local_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition
               WHERE logicalrelid = 'idempotency.keys'::regclass) THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT FROM idempotency.keys) THEN
        RAISE EXCEPTION 'idempotency.keys of this node holds keys'
            USING ERRCODE = '55000',
                  DETAIL = 'Distributing idempotency.keys drops the dated partitions of each worker''s own table of keys.',
                  HINT = 'Move them with idem_export_keys on this node and idem_import_keys on the coordinator before distributing, or delete them.';
    END IF;
    FOR r IN
        SELECT c.oid::regclass AS rel
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'idempotency.keys'::regclass
          AND c.oid <> 'idempotency.keys_default'::regclass
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('DROP TABLE %s', r.rel);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;
COMMENT ON FUNCTION idempotency.idem_citus_drop_local_partitions() IS
    'Citus mode: drop the dated partitions of this worker''s local idempotency.keys before it is distributed';

CREATE FUNCTION idempotency.citus_distribute(colocate_with regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    dist_col name;
    col_type regtype;
    col_coll oid;
    keys_coloc integer;
    want_coloc integer;
    r record;
    f regprocedure;
    ref regclass;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'Run CREATE EXTENSION citus on the coordinator and on every worker, add the workers, then call citus_distribute on the coordinator.';
    END IF;
    IF NOT (SELECT pg_catalog.citus_is_coordinator()) THEN
        RAISE EXCEPTION 'citus_distribute runs on the coordinator'
            USING ERRCODE = '55000',
                  HINT = 'Connect to the coordinator and call idempotency.citus_distribute there.';
    END IF;

    -- the table to colocate with: hash-distributed by a text COLLATE "C" column
    SELECT a.attname, a.atttypid::regtype, a.attcollation, p.colocationid
    INTO dist_col, col_type, col_coll, want_coloc
    FROM pg_catalog.pg_dist_partition p
    JOIN pg_catalog.pg_attribute a
      ON a.attrelid = p.logicalrelid
     AND a.attname = pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)
    WHERE p.logicalrelid = colocate_with AND p.partmethod = 'h';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % is not a hash-distributed table', colocate_with
            USING ERRCODE = '55000',
                  HINT = pg_catalog.format('Distribute it by its tenant column first: SELECT create_distributed_table(%L, ''tenant'');',
                                           colocate_with::text);
    END IF;
    IF col_type <> 'text'::regtype OR col_coll <> 'pg_catalog."C"'::regcollation THEN
        RAISE EXCEPTION 'the distribution column "%" of % is % COLLATE %, not text COLLATE "C"',
                        dist_col, colocate_with, col_type,
                        coalesce((SELECT pg_catalog.quote_ident(collname) FROM pg_catalog.pg_collation
                                  WHERE oid = col_coll), 'none')
            USING ERRCODE = '42804',
                  DETAIL = 'idempotency.keys is distributed by its column tenant, of type text COLLATE "C"; Citus colocates only tables whose distribution columns have the same type and collation.',
                  HINT = pg_catalog.format('Make the column text COLLATE "C": SELECT undistribute_table(%L); ALTER TABLE %s ALTER COLUMN %I TYPE text COLLATE "C"; then distribute it again.',
                                           colocate_with::text, colocate_with, dist_col);
    END IF;

    -- keys, once: refuse to move them to another colocation group
    SELECT colocationid INTO keys_coloc
    FROM pg_catalog.pg_dist_partition
    WHERE logicalrelid = 'idempotency.keys'::regclass;
    IF FOUND AND keys_coloc <> want_coloc THEN
        RAISE EXCEPTION 'idempotency.keys is distributed already, colocated with other tables than %', colocate_with
            USING ERRCODE = '55000',
                  HINT = 'Keys can be colocated with one group of tables only; pass a table of that group.';
    ELSIF NOT FOUND THEN
        -- the workers' own dated partitions would clash with the shells of the coordinator's
        FOR r IN
            SELECT * FROM pg_catalog.run_command_on_workers(
                'SELECT idempotency.idem_citus_drop_local_partitions()')
        LOOP
            IF NOT r.success THEN
                RAISE EXCEPTION 'preparing worker %:% failed: %', r.nodename, r.nodeport, r.result
                    USING ERRCODE = '55000',
                          HINT = 'Fix what the worker reports (it needs the extension idempotency of the same version), then call citus_distribute again.';
            END IF;
        END LOOP;
        PERFORM pg_catalog.create_distributed_table('idempotency.keys', 'tenant',
                                                    colocate_with => colocate_with::text);
    END IF;

    -- reference tables, the coordinator's rows on every node, their triggers
    -- on the shards: endpoints, one policy everywhere; the secret of mismatch
    -- diagnostics, so that a digest made on one node is read on the tenant's
    FOREACH ref IN ARRAY ARRAY['idempotency.endpoints', 'idempotency.diagnostics_secret']::regclass[]
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ref) THEN
            PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
            PERFORM pg_catalog.create_reference_table(ref);
            PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'off', true);
        END IF;
    END LOOP;

    -- the per-key functions run on the node of the tenant's shard
    FOR f IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'idempotency'::regnamespace
          AND p.proname IN ('idem_claim', 'idem_finish', 'idem_finish_bytes', 'idem_finish_ref',
                            'idem_fail', 'idem_release', 'idem_heartbeat', 'idem_lookup',
                            'idem_resolve')
        ORDER BY 1
    LOOP
        PERFORM pg_catalog.create_distributed_function(f, '$1',
                                                       colocate_with => 'idempotency.keys',
                                                       force_delegation => true);
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.citus_distribute(regclass) IS
    'Citus mode: distribute idempotency.keys by tenant colocated with the given table, endpoints as a reference table, the per-key functions by tenant';
-- idempotency install script: mismatch diagnostics (src/diagnostics.c).
--
-- A claim may pass the digest of its request (idem_request_digest): keyed
-- hashes of the members of the canonical body, never their values.  It is
-- kept with the key (idempotency.keys.request_digest), and a later claim of
-- the key with another request says which members differ
-- (claim_result.mismatch).

-- The database's secret, 32 random bytes made here (gen_random_uuid uses
-- the server's strong random source: 244 random bits).  Readable by the
-- extension's owner only; not dumped by pg_dump, so that a restored
-- database makes a secret of its own (digests stored before then compare
-- with nothing).  Changing the row (as the owner) makes every backend read
-- it again.
CREATE TABLE idempotency.diagnostics_secret (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret  bytea NOT NULL CHECK (length(secret) = 32)
);
INSERT INTO idempotency.diagnostics_secret (secret)
SELECT pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::text
                                            || pg_catalog.gen_random_uuid()::text, '-', ''), 'hex');
REVOKE ALL ON idempotency.diagnostics_secret FROM PUBLIC;
CREATE TRIGGER diagnostics_secret_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.diagnostics_secret
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.idem_endpoints_changed();

CREATE FUNCTION idempotency.idem_request_digest(
    tenant text, endpoint text, key text, body jsonb,
    method text DEFAULT NULL, path text DEFAULT NULL, exclude text[] DEFAULT NULL)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_request_digest'
LANGUAGE C STABLE;
COMMENT ON FUNCTION idempotency.idem_request_digest(text, text, text, jsonb, text, text, text[]) IS
    'Digest of a request for idem_claim''s mismatch diagnostics: keyed hashes of its members, never their values';
-- idempotency install script: tombstones of expired keys (README
-- "Tombstones for expired keys").
--
-- When maintenance drops a partition of idempotency.keys whose range has
-- ended, or purges expired rows of its default partition, it first keeps
-- of each row whose endpoint keeps tombstones only what a later claim needs
-- to refuse the key with another payload: a keyed hash of the scope and the
-- fingerprint.  Tombstones are partitioned by their own expiry, as the keys
-- are, and leave by whole partitions too.  Only the extension writes or
-- reads them; nobody else is granted anything on the table.
CREATE TABLE idempotency.tombstones (
    scope_hash      bytea NOT NULL,     -- idem_tombstone_hash(tenant, endpoint, key)
    fingerprint     bytea NOT NULL,     -- the expired key's
    expired_at      timestamptz NOT NULL,   -- the expired key's expires_at
    expires_at      timestamptz NOT NULL    -- expired_at + the endpoint's tombstone_ttl
) PARTITION BY RANGE (expires_at);

-- Tombstones whose expiry no dated partition covers; maintenance moves them
-- into dated partitions, which it makes (tombstones_pYYYYMMDDtHHMM), each
-- with an index on scope_hash like this one.
CREATE TABLE idempotency.tombstones_default PARTITION OF idempotency.tombstones DEFAULT;
CREATE INDEX tombstones_default_scope_idx ON idempotency.tombstones_default (scope_hash);
SELECT pg_catalog.pg_extension_config_dump('idempotency.tombstones_default', '');

REVOKE ALL ON idempotency.tombstones, idempotency.tombstones_default FROM PUBLIC;

-- The scope of a tombstone: the first 16 bytes of a SHA-256 over a label,
-- idempotency.encryption_key (when set) and the scope, never the key.
-- Admin only: EXECUTE is revoked from PUBLIC (sql/parts/99_privileges.sql).
CREATE FUNCTION idempotency.idem_tombstone_hash(tenant text, endpoint text, key text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_tombstone_hash'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_tombstone_hash(text, text, text) IS
    'The keyed hash under which a tombstone of an expired key is kept';
-- idempotency install script: privileges, granted last so that every
-- function of every part is covered.

-- PUBLIC gets nothing: every function of the schema is revoked, then the
-- client's functions are granted by name, and the admin gets every function.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency FROM PUBLIC;
GRANT USAGE ON SCHEMA idempotency TO idempotency_client, idempotency_admin;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'idempotency'::regnamespace
          AND (p.proname IN ('idem_claim', 'idem_finish', 'idem_finish_bytes', 'idem_finish_ref',
                             'idem_release', 'idem_fail', 'idem_heartbeat',
                             'idem_fingerprint', 'idem_key_valid',
                             'idem_uuidv7', 'idem_ulid', 'idem_token',
                             'idem_downstream_key', 'idem_request_digest')
               OR p.proname LIKE 'idem\_canonical\_json%')
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO idempotency_client', f);
    END LOOP;
END
$$;

GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO idempotency_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.endpoints TO idempotency_admin;
GRANT SELECT ON idempotency.events, idempotency.stats, idempotency.health
    TO idempotency_admin;
