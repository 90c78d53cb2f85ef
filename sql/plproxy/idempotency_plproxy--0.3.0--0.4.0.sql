-- idempotency_plproxy 0.3.0 to 0.4.0
--
-- Every change of the proxy's functions between the two versions is made
-- here too, so that an updated proxy database equals a fresh install.

\echo Use "ALTER EXTENSION idempotency_plproxy UPDATE TO '0.4.0'" to load this file. \quit

-- the counter diagnoses_withheld of the shards (0.4.0): idem_stats and
-- idem_health gain it, and the views are made again with their columns in
-- place and the new one last.  PL/Proxy maps the shards' columns by name,
-- and the shards' idem_counters (0.4.0) has the new one: update the shards
-- and the proxy together.
DROP VIEW idempotency.health;
DROP VIEW idempotency.stats;
DROP FUNCTION idempotency.idem_stats(boolean);
DROP FUNCTION idempotency.idem_health();

CREATE FUNCTION idempotency.idem_stats(
    missing_ok boolean DEFAULT false,
    OUT shard text,
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
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.current_database() || ':' || pg_catalog.current_setting('port') AS shard,
           s.*
    FROM idempotency.idem_counters(missing_ok) s;
$$;

CREATE FUNCTION idempotency.idem_health()
RETURNS TABLE (shard text, endpoint text, live_keys bigint, in_progress bigint,
               oldest_in_progress_age interval, unknown bigint, failed bigint,
               stored_bytes bigint, claims bigint, replay_ratio numeric,
               conflict_ratio numeric, mismatch_ratio numeric,
               tombstone_hits bigint, counters_since timestamptz,
               diagnoses_withheld bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.current_database() || ':' || pg_catalog.current_setting('port') AS shard,
           h.*
    FROM idempotency.health h;
$$;

-- The counters of every shard added up, as the shards' idempotency.stats
-- shows them (reset_at: the earliest reset of any shard).
CREATE VIEW idempotency.stats AS
SELECT endpoint, untracked,
       sum(claims)::bigint AS claims, sum(executes)::bigint AS executes,
       sum(replays)::bigint AS replays, sum(in_progress)::bigint AS in_progress,
       sum(mismatches)::bigint AS mismatches, sum(pending)::bigint AS pending,
       sum(finishes)::bigint AS finishes, sum(releases)::bigint AS releases,
       sum(fails)::bigint AS fails, sum(invalid_keys)::bigint AS invalid_keys,
       sum(leases_expired)::bigint AS leases_expired,
       sum(resolved)::bigint AS resolved, sum(diagnosed)::bigint AS diagnosed,
       sum(tombstone_hits)::bigint AS tombstone_hits, min(reset_at) AS reset_at,
       sum(diagnoses_withheld)::bigint AS diagnoses_withheld
FROM idempotency.idem_stats()
GROUP BY endpoint, untracked
ORDER BY endpoint IS NULL, untracked DESC, endpoint;

-- Health per shard and endpoint.
CREATE VIEW idempotency.health AS
SELECT * FROM idempotency.idem_health() ORDER BY endpoint, shard;

REVOKE EXECUTE ON FUNCTION idempotency.idem_stats(boolean), idempotency.idem_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_stats(boolean), idempotency.idem_health() TO idempotency_admin;
GRANT SELECT ON idempotency.stats, idempotency.health TO idempotency_admin;
