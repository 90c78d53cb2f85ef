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
    CHECK (on_lease_expiry = 'unknown' OR resolver IS NOT NULL)
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
    expires_at      timestamptz NOT NULL
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
    action           text,          -- execute | replay | in_progress | mismatch | pending
    http_status      integer,       -- what to answer, unless action = execute
    error_code       text,          -- request_in_progress | idempotency_key_reuse | outcome_pending
    retry_after      integer,       -- seconds, for the Retry-After header of a 409
    response_status  integer,       -- replay: the stored status
    response_headers jsonb,         -- replay: stored headers plus Idempotent-Replayed and Idempotency-Key
    response_body    bytea,         -- replay: the stored body, byte for byte
    response_json    jsonb,         -- replay: the stored body, when it was JSON
    lease_token      bigint,        -- execute in lease mode: present it to finish
    expires_at       timestamptz,   -- when the key is forgotten
    replayed         boolean,
    response_body_ref text          -- replay: where the body is, when it was stored as a reference
);

CREATE FUNCTION idempotency.idem_claim(
    tenant text, endpoint text, key text, fingerprint bytea,
    ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
    wait interval DEFAULT NULL)
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
--   purge (keys_default; expired rows deleted from the default partition),
--   create (partition; rows moved into it from the default partition),
--   drop (partition; rows as estimated by pg_class.reltuples, NULL if never
--       counted),
--   skipped (object whose lock was not granted within the lock_timeout),
--   busy (another pass of this database is running; nothing was done).
-- Admin only: EXECUTE is revoked from PUBLIC.
CREATE FUNCTION idempotency.idem_maintenance(as_of timestamptz DEFAULT pg_catalog.now())
RETURNS TABLE (kind text, object text, rows bigint)
AS 'MODULE_PATHNAME', 'idem_maintenance'
LANGUAGE C VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE EXECUTE ON FUNCTION idempotency.idem_maintenance(timestamptz) FROM PUBLIC;
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
       leases_expired, resolved, reset_at
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
                             'idem_downstream_key')
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
