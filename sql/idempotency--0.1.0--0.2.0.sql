-- idempotency 0.1.0 to 0.2.0
--
-- Kept as it is once released; the install script of 0.2.0 is assembled
-- from sql/parts.

-- complain if the script is sourced in psql rather than run by ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit

-- The claim/finish functions are no longer SECURITY DEFINER: they read and
-- write idempotency.keys directly and run the SQL they need as the table's
-- owner with a pinned search_path (a switch of user and settings on every
-- call cost more than the rest of a replay's lookup).
ALTER FUNCTION idempotency.idem_claim(text, text, text, bytea, interval, interval, interval)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_finish(text, text, text, integer, jsonb, jsonb, bigint)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_finish_bytes(text, text, text, integer, bytea, jsonb, bigint)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_finish_ref(text, text, text, integer, text, jsonb, bigint)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_fail(text, text, text, text, text, bigint)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_release(text, text, text, bigint)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_heartbeat(text, text, text, bigint, interval)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_resolve(text, text, text, integer, jsonb, jsonb)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_lookup(text, text, text)
    SECURITY INVOKER RESET search_path;

-- The scope columns compare byte-wise (COLLATE "C") and the default
-- partition's unique index is key first.  Every partition follows the
-- parent's collation (its indexes are rebuilt, its rows are not rewritten);
-- dated partitions keep their (tenant, endpoint, key) index, which claims
-- use as well, until retention drops them; new ones are made key first.
-- The health view depends on the column and is made again.
DROP VIEW idempotency.health;
ALTER TABLE idempotency.keys
    ALTER COLUMN tenant TYPE text COLLATE "C",
    ALTER COLUMN endpoint TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C";
DROP INDEX idempotency.keys_default_scope_idx;
CREATE UNIQUE INDEX keys_default_scope_idx
    ON idempotency.keys_default (key, endpoint, tenant);

-- Leased claims in progress get an index of their own in every partition,
-- named after it, so that the maintenance pass finds stale leases without
-- reading every live row (built now, which reads each partition once).
-- Partitions made by the 0.2.0 library before this update have it already.
CREATE INDEX IF NOT EXISTS keys_default_lease_idx ON idempotency.keys_default (locked_until)
    WHERE state = 'in_progress';
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN
        SELECT i.inhrelid::regclass FROM pg_catalog.pg_inherits i
        WHERE i.inhparent = 'idempotency.keys'::regclass
          AND i.inhrelid <> 'idempotency.keys_default'::regclass
    LOOP
        EXECUTE pg_catalog.format(
            'CREATE INDEX IF NOT EXISTS %I ON %s (locked_until) WHERE state = %L',
            (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid = part) || '_lease_idx',
            part, 'in_progress');
    END LOOP;
END
$$;

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
GRANT SELECT ON idempotency.health TO idempotency_admin;
