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
LANGUAGE C IMMUTABLE PARALLEL SAFE;
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

-- Every counter, the ones added since 0.3.0 included (before reset_at); the
-- views read it.  idem_stats keeps the columns of 0.3.0, so that an update
-- changes no result type an application or monitoring query depends on.
CREATE FUNCTION idempotency.idem_counters(
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
    OUT diagnoses_withheld bigint,
    OUT reset_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idempotency.idem_counters(boolean) IS
    'Every counter per endpoint and in total (endpoint NULL) since reset_at';

CREATE FUNCTION idempotency.idem_stats_reset()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION idempotency.idem_stats_reset() IS
    'Zero every counter; returns the new reset time';

-- One row per endpoint counted, then the endpoints that found the table of
-- counters full (endpoint NULL, untracked), then the totals (endpoint NULL).
-- Columns added by a later version come after reset_at.
CREATE VIEW idempotency.stats AS
SELECT endpoint, untracked, claims, executes, replays, in_progress,
       mismatches, pending, finishes, releases, fails, invalid_keys,
       leases_expired, resolved, diagnosed, tombstone_hits, reset_at,
       diagnoses_withheld
FROM idempotency.idem_counters()
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
    SELECT * FROM idempotency.idem_counters(true) WHERE endpoint IS NOT NULL
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
       c.reset_at AS counters_since,
       c.diagnoses_withheld
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

