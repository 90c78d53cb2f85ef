-- idempotency_plproxy 0.3.0 to 0.4.0
--
-- Every change of the proxy's functions between the two versions is made
-- here too, so that an updated proxy database equals a fresh install.

\echo Use "ALTER EXTENSION idempotency_plproxy UPDATE TO '0.4.0'" to load this file. \quit

-- The counter diagnoses_withheld of the shards (0.4.0).  Nothing is dropped,
-- so that what a user built on the proxy's functions and views (a view of
-- their own, a grant) survives the update: idem_stats and idem_health keep
-- their OIDs and the columns of 0.3.0 (idem_health's body now names them,
-- since the shards' view health has gained one), the new function
-- idem_counters has every counter, and the views stats and health gain
-- diagnoses_withheld after their columns of 0.3.0.  PL/Proxy maps the
-- shards' columns by name and the shards' idem_counters is 0.4.0's: update
-- the shards and the proxy together.

-- Every counter of every shard, columns added by later versions included.
CREATE FUNCTION idempotency.idem_counters(
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

-- The shards' health in the shape of 0.3.0, column by column (the shards'
-- view has gained columns since); the view health adds the new ones.
CREATE OR REPLACE FUNCTION idempotency.idem_health()
RETURNS TABLE (shard text, endpoint text, live_keys bigint, in_progress bigint,
               oldest_in_progress_age interval, unknown bigint, failed bigint,
               stored_bytes bigint, claims bigint, replay_ratio numeric,
               conflict_ratio numeric, mismatch_ratio numeric,
               tombstone_hits bigint, counters_since timestamptz)
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.current_database() || ':' || pg_catalog.current_setting('port') AS shard,
           h.endpoint, h.live_keys, h.in_progress, h.oldest_in_progress_age,
           h.unknown, h.failed, h.stored_bytes, h.claims, h.replay_ratio,
           h.conflict_ratio, h.mismatch_ratio, h.tombstone_hits, h.counters_since
    FROM idempotency.health h;
$$;

-- The counters of every shard added up, as the shards' idempotency.stats
-- shows them (reset_at: the earliest reset of any shard).  Columns added
-- by a later version come after reset_at.
CREATE OR REPLACE VIEW idempotency.stats AS
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
FROM idempotency.idem_counters()
GROUP BY endpoint, untracked
ORDER BY endpoint IS NULL, untracked DESC, endpoint;

-- Health per shard and endpoint; diagnoses_withheld is the shard's counter
-- of the endpoint, as the shards' view shows it.
CREATE OR REPLACE VIEW idempotency.health AS
SELECT h.*, c.diagnoses_withheld
FROM idempotency.idem_health() h
LEFT JOIN idempotency.idem_counters(true) c ON c.shard = h.shard AND c.endpoint = h.endpoint
ORDER BY h.endpoint, h.shard;

REVOKE EXECUTE ON FUNCTION idempotency.idem_counters(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_counters(boolean) TO idempotency_admin;
