-- idempotency 0.2.0 to 0.3.0
--
-- Kept as it is once released; the install script of 0.3.0 is assembled
-- from sql/parts.  Every change of the schema between the two versions is
-- made here too, so that an updated database equals a fresh install (the
-- regression test "upgrade" compares them).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- idem_maintenance gains preview: a future as_of only reports what a pass
-- would do unless preview => false; as_of is range-checked, so the
-- function is no longer STRICT.
DROP FUNCTION idempotency.idem_maintenance(timestamptz);
CREATE FUNCTION idempotency.idem_maintenance(as_of timestamptz DEFAULT pg_catalog.now(),
                                             preview boolean DEFAULT NULL)
RETURNS TABLE (kind text, object text, rows bigint)
AS 'MODULE_PATHNAME', 'idem_maintenance'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION idempotency.idem_maintenance(timestamptz, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_maintenance(timestamptz, boolean) TO idempotency_admin;

-- A resolver runs as the endpoint's resolver_role, the role that set it
-- (checked by the trigger endpoints_resolver: EXECUTE, signature, the right
-- to name the role), no longer as the function's owner.  Rows written
-- before keep what they ran as: the function's owner.
ALTER TABLE idempotency.endpoints ADD COLUMN resolver_role regrole;
UPDATE idempotency.endpoints e
SET resolver_role = p.proowner::regrole
FROM pg_catalog.pg_proc p
WHERE p.oid = e.resolver;

CREATE FUNCTION idempotency.idem_endpoints_resolver()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_resolver'
LANGUAGE C;
REVOKE EXECUTE ON FUNCTION idempotency.idem_endpoints_resolver() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_endpoints_resolver() TO idempotency_admin;

CREATE TRIGGER endpoints_resolver
    BEFORE INSERT OR UPDATE ON idempotency.endpoints
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_resolver();

-- Export and import of a tenant's keys (sql/parts/60_transfer.sql), for
-- re-partitioning a sharded deployment; admin only.
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

-- Every live key of the tenant, in (endpoint, key) order, without
-- request_digest (mismatch diagnostics, below), which the import compares
-- without too.
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
REVOKE EXECUTE ON FUNCTION idempotency.idem_transfer_check_tenant(text),
    idempotency.idem_export_keys(text),
    idempotency.idem_import_keys(jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_transfer_check_tenant(text),
    idempotency.idem_export_keys(text),
    idempotency.idem_import_keys(jsonb, text) TO idempotency_admin;

-- ----------------------------------------------------------------
-- Mismatch diagnostics (issue 17, part 1; sql/parts/72_diagnostics.sql)
-- ----------------------------------------------------------------

ALTER TABLE idempotency.endpoints ADD COLUMN diagnostics boolean NOT NULL DEFAULT true;
ALTER TABLE idempotency.keys ADD COLUMN request_digest bytea;
ALTER TYPE idempotency.claim_result ADD ATTRIBUTE mismatch jsonb;

DROP FUNCTION idempotency.idem_claim(text, text, text, bytea, interval, interval, interval);
CREATE FUNCTION idempotency.idem_claim(
    tenant text, endpoint text, key text, fingerprint bytea,
    ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
    wait interval DEFAULT NULL, digest bytea DEFAULT NULL)
RETURNS idempotency.claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION idempotency.idem_claim(text, text, text, bytea, interval, interval, interval, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_claim(text, text, text, bytea, interval, interval, interval, bytea)
    TO idempotency_client, idempotency_admin;

-- ---------------------------------------------------------------------
-- Tombstones for expired keys (issue 17, sql/parts/74_tombstones.sql):
-- per-endpoint policy, the table of tombstones, and the counter of claims
-- that met an expired key (idem_stats, views stats and health).
-- Keys that expired before the update leave no tombstone.
-- ---------------------------------------------------------------------
ALTER TABLE idempotency.endpoints
    ADD COLUMN tombstone_ttl interval
        CONSTRAINT endpoints_tombstone_ttl_range
        CHECK (tombstone_ttl >= interval '0' AND tombstone_ttl <= interval '10 years'),
    ADD COLUMN on_expired_reuse text NOT NULL DEFAULT 'execute'
        CONSTRAINT endpoints_on_expired_reuse_check
        CHECK (on_expired_reuse IN ('execute', 'conflict'));

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

REVOKE EXECUTE ON FUNCTION idempotency.idem_tombstone_hash(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_tombstone_hash(text, text, text) TO idempotency_admin;

-- the counters diagnosed and tombstone_hits: idem_stats gains two columns,
-- its views are made again
DROP VIEW idempotency.health;
DROP VIEW idempotency.stats;
DROP FUNCTION idempotency.idem_stats(boolean);

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
REVOKE EXECUTE ON FUNCTION idempotency.idem_stats(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_stats(boolean) TO idempotency_admin;
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
GRANT SELECT ON idempotency.stats, idempotency.health TO idempotency_admin;

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
REVOKE EXECUTE ON FUNCTION idempotency.idem_request_digest(text, text, text, jsonb, text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_request_digest(text, text, text, jsonb, text, text, text[])
    TO idempotency_client, idempotency_admin;
-- ---------------------------------------------------------------------
-- The Citus mode (README "Scaling out", "Citus"): sql/parts/70_citus.sql
-- ---------------------------------------------------------------------
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
REVOKE EXECUTE ON FUNCTION idempotency.idem_citus_drop_local_partitions(),
    idempotency.citus_distribute(regclass) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_citus_drop_local_partitions(),
    idempotency.citus_distribute(regclass) TO idempotency_admin;
