-- idempotency_plproxy: the proxy database of a deployment sharded by tenant.
--
-- Every shard has the idempotency extension; the proxy has this one, whose
-- functions have the names and arguments of the extension's and run them
-- on the shard that owns the tenant: partition hashtext(tenant) of the
-- PL/Proxy cluster named "idempotency" (a power of two of partitions,
-- defined by CREATE SERVER idempotency FOREIGN DATA WRAPPER plproxy, see
-- README "Scaling out").  Maintenance, counters and health run on every
-- shard (RUN ON ALL) and name the shard that answered.
--
-- Each proxied call is a transaction of its own on its shard, so atomic
-- mode (claim and finish in one transaction) cannot span two calls: claim
-- through the proxy in lease mode, or run claim, business write and finish
-- in one shard-side function proxied as a whole (doc/scaling.md, "PL/Proxy: atomic mode and the shard-side template").

-- complain if the script is sourced in psql rather than run by CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency_plproxy" to load this file. \quit

-- The schema is the extension's, as on the shards, so that applications
-- call the same names on a proxy as on a single server.
CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

-- The same shape as the shards' type: PL/Proxy reads the columns by name.
CREATE TYPE idempotency.claim_result AS (
    action           text,
    http_status      integer,
    error_code       text,
    retry_after      integer,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    response_json    jsonb,
    lease_token      bigint,
    expires_at       timestamptz,
    replayed         boolean,
    response_body_ref text,
    mismatch         jsonb
);

-- Per key: on the shard of the tenant.

CREATE FUNCTION idempotency.idem_claim(
    tenant text, endpoint text, key text, fingerprint bytea,
    ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
    wait interval DEFAULT NULL, digest bytea DEFAULT NULL)
RETURNS idempotency.claim_result
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_claim;
$$;

-- keyed with the secret of the tenant's shard, which alone can compare it
CREATE FUNCTION idempotency.idem_request_digest(
    tenant text, endpoint text, key text, body jsonb,
    method text DEFAULT NULL, path text DEFAULT NULL, exclude text[] DEFAULT NULL)
RETURNS bytea
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_request_digest;
$$;

CREATE FUNCTION idempotency.idem_finish(
    tenant text, endpoint text, key text, status integer,
    body jsonb DEFAULT NULL, headers jsonb DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_finish;
$$;

CREATE FUNCTION idempotency.idem_finish_bytes(
    tenant text, endpoint text, key text, status integer,
    body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_finish_bytes;
$$;

CREATE FUNCTION idempotency.idem_finish_ref(
    tenant text, endpoint text, key text, status integer, body_ref text,
    headers jsonb DEFAULT NULL, lease_token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_finish_ref;
$$;

CREATE FUNCTION idempotency.idem_fail(
    tenant text, endpoint text, key text,
    outcome text DEFAULT 'unknown', reason text DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_fail;
$$;

CREATE FUNCTION idempotency.idem_release(
    tenant text, endpoint text, key text, lease_token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_release;
$$;

CREATE FUNCTION idempotency.idem_heartbeat(
    tenant text, endpoint text, key text, lease_token bigint, extend interval)
RETURNS timestamptz
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_heartbeat;
$$;

CREATE FUNCTION idempotency.idem_resolve(
    tenant text, endpoint text, key text, status integer, body jsonb,
    headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_resolve;
$$;

CREATE FUNCTION idempotency.idem_lookup(tenant text, endpoint text, key text)
RETURNS TABLE (state text, fingerprint bytea, lease_held boolean,
               created_at timestamptz, completed_at timestamptz,
               expires_at timestamptz, locked_until timestamptz,
               response_status integer)
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_lookup;
$$;

-- A tenant's keys, on the shard that owns the tenant now: export before a
-- re-partitioning changes the owner, import after (doc/scaling.md, "PL/Proxy: re-partitioning and keys").
-- The keys imported should be the tenant's own: the call goes to the
-- tenant's shard whatever they hold.
CREATE FUNCTION idempotency.idem_export_keys(tenant text)
RETURNS SETOF jsonb
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET idempotency.idem_export_keys;
$$;

CREATE FUNCTION idempotency.idem_import_keys(tenant text, keys jsonb,
                                             on_conflict text DEFAULT 'error')
RETURNS TABLE (outcome text, rows bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    SELECT i.outcome, i.rows FROM idempotency.idem_import_keys(keys, on_conflict) i;
$$;

-- Fingerprints are the same on every shard: any of them computes one.
CREATE FUNCTION idempotency.idem_fingerprint(method text, path text, body jsonb)
RETURNS bytea
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ANY;
    TARGET idempotency.idem_fingerprint;
$$;

CREATE FUNCTION idempotency.idem_fingerprint(method text, path text, body jsonb,
                                             exclude text[])
RETURNS bytea
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ANY;
    TARGET idempotency.idem_fingerprint;
$$;

-- Every shard: one row per shard and row of its answer; shard is the
-- shard's database and port.

CREATE FUNCTION idempotency.idem_maintenance(
    as_of timestamptz DEFAULT pg_catalog.now(), preview boolean DEFAULT NULL)
RETURNS TABLE (shard text, kind text, object text, rows bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.current_database() || ':' || pg_catalog.current_setting('port') AS shard,
           m.kind, m.object, m.rows
    FROM idempotency.idem_maintenance(as_of, preview) m;
$$;

-- The shards' counters in the shape of 0.3.0 (as the shards keep it: their
-- idem_stats); idem_counters has every counter.
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
    OUT reset_at timestamptz)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.current_database() || ':' || pg_catalog.current_setting('port') AS shard,
           s.*
    FROM idempotency.idem_stats(missing_ok) s;
$$;

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

CREATE FUNCTION idempotency.idem_stats_reset(OUT shard text, OUT reset_at timestamptz)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.current_database() || ':' || pg_catalog.current_setting('port') AS shard,
           idempotency.idem_stats_reset() AS reset_at;
$$;

-- The shards' health in the shape of 0.3.0, column by column (the shards'
-- view has gained columns since); the view health adds the new ones.
CREATE FUNCTION idempotency.idem_health()
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
FROM idempotency.idem_counters()
GROUP BY endpoint, untracked
ORDER BY endpoint IS NULL, untracked DESC, endpoint;

-- Health per shard and endpoint; diagnoses_withheld is the shard's counter
-- of the endpoint, as the shards' view shows it.
CREATE VIEW idempotency.health AS
SELECT h.*, c.diagnoses_withheld
FROM idempotency.idem_health() h
LEFT JOIN idempotency.idem_counters(true) c ON c.shard = h.shard AND c.endpoint = h.endpoint
ORDER BY h.endpoint, h.shard;

-- Privileges as on the shards: PUBLIC gets nothing, idempotency_client the
-- per-key functions of the protocol, idempotency_admin everything.  The
-- shards check the roles again: PL/Proxy connects to them as the user of
-- the user mapping of the server idempotency.
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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency FROM PUBLIC;
GRANT USAGE ON SCHEMA idempotency TO idempotency_client, idempotency_admin;
GRANT EXECUTE ON FUNCTION
    idempotency.idem_claim(text, text, text, bytea, interval, interval, interval, bytea),
    idempotency.idem_request_digest(text, text, text, jsonb, text, text, text[]),
    idempotency.idem_finish(text, text, text, integer, jsonb, jsonb, bigint),
    idempotency.idem_finish_bytes(text, text, text, integer, bytea, jsonb, bigint),
    idempotency.idem_finish_ref(text, text, text, integer, text, jsonb, bigint),
    idempotency.idem_fail(text, text, text, text, text, bigint),
    idempotency.idem_release(text, text, text, bigint),
    idempotency.idem_heartbeat(text, text, text, bigint, interval),
    idempotency.idem_fingerprint(text, text, jsonb),
    idempotency.idem_fingerprint(text, text, jsonb, text[])
    TO idempotency_client;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO idempotency_admin;
GRANT SELECT ON idempotency.stats, idempotency.health TO idempotency_admin;
