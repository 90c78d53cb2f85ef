-- idempotency 0.3.0 to 0.4.0
--
-- Kept as it is once released; the install script of 0.4.0 is assembled
-- from sql/parts.  Every change of the schema between the two versions is
-- made here too, so that an updated database equals a fresh install (the
-- regression test "upgrade" compares them).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- The Citus mode (doc/scaling.md, "Citus: updating"): Citus carries ALTER
-- EXTENSION idempotency UPDATE from the coordinator to every worker, where
-- this script runs again, with citus.enable_ddl_propagation off.  Citus
-- would also carry each ALTER TABLE or CREATE TRIGGER of this script on a
-- distributed or reference table to the workers and shards, with the whole
-- script as the text of the statement, which a worker refuses ("cannot
-- insert multiple commands into a prepared statement").  So every node
-- changes its own objects only: DDL on the extension's tables runs through
-- idem_update_ddl, which switches the propagation off for the statement and
-- applies it to the table and to each of its shards placed on this node
-- (the coordinator's placements of reference tables included), as Citus
-- would have made them: a trigger on a shard is named after the table's
-- with "_" and the shard id appended.  The coordinator and the workers
-- change in the one distributed transaction of ALTER EXTENSION.  Without
-- Citus, or for a table Citus does not know, the statement runs on the
-- table alone.  Both functions are dropped at the end of this script.

-- The table rel and, when Citus knows it, its shards placed on this node,
-- each with the suffix Citus appends to the names of its triggers.
CREATE FUNCTION idempotency.idem_update_targets(rel regclass)
RETURNS TABLE (target regclass, suffix text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    target := rel;
    suffix := '';
    RETURN NEXT;
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN;
    END IF;
    -- dynamic: the catalogs of Citus exist only where it is installed
    RETURN QUERY EXECUTE
        'SELECT pg_catalog.shard_name($1, s.shardid)::regclass, ''_'' || s.shardid
         FROM pg_catalog.pg_dist_shard s
         JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid
         WHERE s.logicalrelid = $1
           AND p.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group)
         ORDER BY s.shardid'
        USING rel;
END
$$;

-- Run command on rel and, unless shards is false, on its shards placed on
-- this node (idem_update_targets); in command, %1$s is the relation and
-- %2$s the suffix of the names of its triggers.  Citus's DDL propagation
-- (when Citus is loaded) is off meanwhile.
CREATE FUNCTION idempotency.idem_update_ddl(rel regclass, command text, shards boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    propagation text := current_setting('citus.enable_ddl_propagation', true);
    t record;
BEGIN
    IF propagation IS NOT NULL THEN
        PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
    END IF;
    FOR t IN SELECT * FROM idempotency.idem_update_targets(rel) LOOP
        EXIT WHEN t.suffix <> '' AND NOT shards;
        EXECUTE format(command, t.target, t.suffix);
    END LOOP;
    IF propagation IS NOT NULL THEN
        PERFORM set_config('citus.enable_ddl_propagation', propagation, true);
    END IF;
END
$$;

-- Replica identity of every table the extension writes (doc/operations.md,
-- "Logical replication and blue/green switch-over"): lease updates and
-- maintenance's deletes work under a publication FOR ALL TABLES and Citus
-- moves shards online.  Partitions do not inherit it: the existing ones,
-- made by maintenance or CREATE EXTENSION, each get their own; partitions of
-- keys name their unique index on (key, endpoint, tenant), partitions of
-- tombstones are FULL.
-- (The shards of the two partitioned tables keep theirs, as Citus makes
-- them: only the partitions' shards hold rows.)
SELECT idempotency.idem_update_ddl('idempotency.keys', 'ALTER TABLE %1$s REPLICA IDENTITY FULL', shards => false);
SELECT idempotency.idem_update_ddl('idempotency.tombstones', 'ALTER TABLE %1$s REPLICA IDENTITY FULL', shards => false);

-- Tombstones in the Citus mode (doc/tombstones.md, doc/scaling.md): the
-- column tenant, NULL but in the Citus mode, by which citus_distribute now
-- distributes idempotency.tombstones colocated with the keys.  A database
-- distributed by 0.3.0 keeps no tombstones until citus_distribute is
-- called again on the coordinator after this update: it distributes what
-- is missing (the tombstones), and changes nothing else.  Here, while the
-- table and its partitions are locked for their replica identity anyway.
SELECT idempotency.idem_update_ddl('idempotency.tombstones', 'ALTER TABLE %1$s ADD COLUMN tenant text COLLATE "C"');
-- In the Citus mode each partition is a Citus table of its own, whose shards
-- are the partitions of the parent's shards; each gets its replica identity
-- as the partition does, its index found by its columns (Citus appends the
-- shard id to the names of indexes, shortening long ones), and named by
-- parse_ident (on the coordinator Citus hides shards from pg_class).
DO $replica_identity$
DECLARE
    propagation text := pg_catalog.current_setting('citus.enable_ddl_propagation', true);
    r record;
    idx regclass;
BEGIN
    IF propagation IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
    END IF;
    FOR r IN
        SELECT t.target AS part
        FROM pg_catalog.pg_inherits i,
             idempotency.idem_update_targets(i.inhrelid::regclass) t
        WHERE i.inhparent = 'idempotency.keys'::regclass
        ORDER BY i.inhrelid::regclass::text, t.suffix
    LOOP
        SELECT x.indexrelid::regclass INTO idx
        FROM pg_catalog.pg_index x
        WHERE x.indrelid = r.part AND x.indisunique AND x.indisvalid
          AND x.indpred IS NULL AND x.indexprs IS NULL AND x.indnkeyatts = 3
          AND (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attname)
               FROM pg_catalog.pg_attribute a
               WHERE a.attrelid = r.part
                 AND a.attnum = ANY (x.indkey::int2[]))
              = ARRAY['endpoint', 'key', 'tenant']
        ORDER BY x.indexrelid LIMIT 1;
        IF idx IS NULL THEN
            RAISE EXCEPTION 'partition % of idempotency.keys has no unique index on (key, endpoint, tenant)', r.part
                USING ERRCODE = '55000',
                      HINT = 'Every partition needs that index; partitions made by idem_maintenance() have it.';
        END IF;
        EXECUTE pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY USING INDEX %I',
                                  r.part, (SELECT n[pg_catalog.array_upper(n, 1)]
                                           FROM pg_catalog.parse_ident(idx::text) n));
    END LOOP;
    FOR r IN
        SELECT t.target AS part
        FROM pg_catalog.pg_inherits i,
             idempotency.idem_update_targets(i.inhrelid::regclass) t
        WHERE i.inhparent = 'idempotency.tombstones'::regclass
        ORDER BY i.inhrelid::regclass::text, t.suffix
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY FULL', r.part);
    END LOOP;
    IF propagation IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', propagation, true);
    END IF;
END
$replica_identity$;

-- The tables defend themselves (doc/operations.md): the triggers of
-- idempotency.endpoints fire under session_replication_role = replica too.
SELECT idempotency.idem_update_ddl('idempotency.endpoints', 'ALTER TABLE %1$s ENABLE ALWAYS TRIGGER endpoints_resolver%2$s');
SELECT idempotency.idem_update_ddl('idempotency.endpoints', 'ALTER TABLE %1$s ENABLE ALWAYS TRIGGER endpoints_changed%2$s');

-- The tables defend themselves (doc/operations.md): the DDL guard of the
-- tables of keys and tombstones, as in sql/parts/76_ddl_guard.sql.
CREATE FUNCTION idempotency.idem_ddl_guard()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_ddl_guard'
LANGUAGE C;
REVOKE EXECUTE ON FUNCTION idempotency.idem_ddl_guard() FROM PUBLIC;

CREATE EVENT TRIGGER idempotency_ddl_guard ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE', 'ALTER INDEX', 'ALTER TRIGGER', 'ALTER RULE',
                 'ALTER POLICY', 'CREATE TABLE', 'CREATE INDEX',
                 'CREATE TRIGGER', 'CREATE RULE', 'CREATE POLICY',
                 'DROP TABLE', 'DROP INDEX')
    EXECUTE FUNCTION idempotency.idem_ddl_guard();

-- idempotency.endpoints.resolver: text, not regprocedure.  pg_upgrade
-- refuses a database with a reg* column that names functions (their OIDs are
-- not kept); the resolver is now stored by its canonical name, checked and
-- normalized by the trigger endpoints_resolver, and found again at each
-- call.  The names are written with the search_path pg_catalog alone, so
-- that every one is schema-qualified as the trigger writes them; a resolver
-- whose function was dropped becomes its former OID in digits, which names
-- no function (a call reports it, as it did before).
DO $resolver_text$
DECLARE
    saved text := pg_catalog.current_setting('search_path');
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
    PERFORM idempotency.idem_update_ddl('idempotency.endpoints',
        'ALTER TABLE %1$s ALTER COLUMN resolver TYPE text USING resolver::text');
    PERFORM pg_catalog.set_config('search_path', saved, true);
END
$resolver_text$;

-- Reliability round 3: what mismatch answers teach, bad inputs, ranges.
--
-- idempotency.endpoints: diagnostics_redact (pointers never named in a
-- mismatch answer), and the trigger endpoints_check, which refuses a ttl
-- or lease outside (0, 100 years] and malformed pointers.  Rows stored
-- before with a ttl or lease out of that range (every claim of such an
-- endpoint without its own ttl failed) stop the update, which then
-- changes nothing: set them to what was meant, then update again.  In the
-- Citus mode endpoints is a reference table, checked on the coordinator:
-- a worker runs this script inside the coordinator's ALTER EXTENSION, where
-- Citus refuses a query of a reference table (a nested distributed query).
DO $$
DECLARE
    bad text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        -- apart: without Citus, the function does not exist
        IF NOT pg_catalog.citus_is_coordinator() THEN
            RETURN;
        END IF;
    END IF;
    SELECT pg_catalog.string_agg(pg_catalog.format('%L', e.endpoint), ', ' ORDER BY e.endpoint)
    INTO bad
    FROM idempotency.endpoints e
    WHERE e.ttl <= interval '0' OR e.ttl > interval '100 years'
       OR e.lease <= interval '0' OR e.lease > interval '100 years';
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency.endpoints holds a ttl or lease out of range'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('Endpoints whose ttl or lease is not positive or longer than 100 years, which 0.4.0 refuses: %s.', bad),
                  HINT = 'Set their ttl and lease to values from 1 microsecond to 100 years (or NULL for the settings), then run ALTER EXTENSION idempotency UPDATE again.';
    END IF;
END
$$;

SELECT idempotency.idem_update_ddl('idempotency.endpoints', 'ALTER TABLE %1$s ADD COLUMN diagnostics_redact text[]');

-- The ranges of ttl and lease (positive, at most 100 years) and the
-- pointers of diagnostics_redact, refused with 22023 naming the column
-- (src/endpoint.c).  Named to fire before endpoints_resolver.
CREATE FUNCTION idempotency.idem_endpoints_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_check'
LANGUAGE C;

SELECT idempotency.idem_update_ddl('idempotency.endpoints', $ddl$
CREATE TRIGGER endpoints_check%2$s
    BEFORE INSERT OR UPDATE ON %1$s
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_check()$ddl$);
SELECT idempotency.idem_update_ddl('idempotency.endpoints', 'ALTER TABLE %1$s ENABLE ALWAYS TRIGGER endpoints_check%2$s');

REVOKE EXECUTE ON FUNCTION idempotency.idem_endpoints_check() FROM PUBLIC;

-- idem_key_hash checks its scope as the claim does: NULL is IK400 too
ALTER FUNCTION idempotency.idem_key_hash(text, text, text) CALLED ON NULL INPUT;

-- the counter diagnoses_withheld: idem_stats keeps its columns (and its
-- OID: an update changes no result type an application or monitoring
-- query depends on); the new function idem_counters has every counter, and
-- the views, made again in place over it (CREATE OR REPLACE keeps them and
-- their privileges), gain the new column last
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
REVOKE EXECUTE ON FUNCTION idempotency.idem_counters(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_counters(boolean) TO idempotency_admin;

-- One row per endpoint counted, then the endpoints that found the table of
-- counters full (endpoint NULL, untracked), then the totals (endpoint NULL).
-- Columns added by a later version come after reset_at.
CREATE OR REPLACE VIEW idempotency.stats AS
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
CREATE OR REPLACE VIEW idempotency.health AS
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
GRANT SELECT ON idempotency.stats, idempotency.health TO idempotency_admin;

-- The checks of each row idem_import_keys writes (src/transfer.c): those
-- of a claim and a finish, by the same C functions; the row as a finish
-- would have stored it.  For the import alone: EXECUTE is granted to
-- nobody (sql/parts/99_privileges.sql), the import runs as the owner.
CREATE FUNCTION idempotency.idem_import_check(pos bigint, item idempotency.keys)
RETURNS idempotency.keys
AS 'MODULE_PATHNAME', 'idem_import_check'
LANGUAGE C VOLATILE;

-- A stored body as a replay reads it (decrypted when marked encrypted), for
-- idem_import_keys's comparison of a row with the live one.  The import's
-- alone, as idem_import_check.
CREATE FUNCTION idempotency.idem_import_plain_body(body bytea, encrypted boolean)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_import_plain_body'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION idempotency.idem_import_plain_body(bytea, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idempotency.idem_import_check(bigint, idempotency.keys) FROM PUBLIC;

-- idem_import_keys: an infinite expires_at, or one beyond
-- idempotency.max_ttl from now, refused; a request_digest dropped; each row checked
-- as a claim and a finish check what they store (idem_import_check)
CREATE OR REPLACE FUNCTION idempotency.idem_import_keys(keys jsonb, on_conflict text DEFAULT 'error')
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
    max_ttl interval;
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
        -- what a claim and a finish check, by the same C functions: the
        -- scope, the fingerprint, the state, created_at <= expires_at, the
        -- status, the headers (sensitive ones dropped), the body (JSON,
        -- decryptable, within the size cap, omitted where the endpoint
        -- keeps none); an error names the element and its column
        r := idempotency.idem_import_check(pos, r);
        PERFORM idempotency.idem_transfer_check_tenant(r.tenant);
        -- the setting in seconds, read once the library is loaded (the
        -- checks above call it)
        IF max_ttl IS NULL THEN
            SELECT pg_catalog.make_interval(secs => s.setting::double precision) INTO max_ttl
            FROM pg_catalog.pg_settings s WHERE s.name = 'idempotency.max_ttl';
        END IF;
        IF r.expires_at > pg_catalog.now() + max_ttl THEN
            RAISE EXCEPTION 'expires_at of element % of the keys to import is beyond idempotency.max_ttl from now', pos
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = pg_catalog.format('It is %s; keys may be kept until %s at the latest.',
                                                 r.expires_at, pg_catalog.now() + max_ttl),
                      HINT = 'Raise idempotency.max_ttl in this database to what the source database allowed.';
        END IF;
        -- a digest is keyed with the source database's secret: dropped
        r.request_digest := NULL;

        IF r.expires_at <= pg_catalog.now() THEN
            n_expired := n_expired + 1;
            CONTINUE;
        END IF;

        SELECT * INTO cur
        FROM idempotency.keys k
        WHERE k.key = r.key AND k.endpoint = r.endpoint AND k.tenant = r.tenant
          AND k.expires_at > pg_catalog.now();
        IF FOUND THEN
            -- the same row, its body compared as a replay reads it (an
            -- encryption is new each time: a plain body imported again
            -- under a key, or an encrypted one, is unchanged)
            IF pg_catalog.to_jsonb(cur) OPERATOR(pg_catalog.-) ARRAY['request_digest', 'response_body', 'body_encrypted']
               = pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.-) ARRAY['request_digest', 'response_body', 'body_encrypted']
               AND idempotency.idem_import_plain_body(cur.response_body, cur.body_encrypted)
                   IS NOT DISTINCT FROM
                   idempotency.idem_import_plain_body(r.response_body, r.body_encrypted) THEN
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

-- the documentation moved from the README to doc/
COMMENT ON FUNCTION idempotency.idem_fingerprint(text, text, jsonb) IS
'SHA-256 over "idem-fingerprint-v1", the upper-cased method, the path and the canonical body (see doc/fingerprints.md)';
COMMENT ON FUNCTION idempotency.idem_fingerprint(text, text, jsonb, text[]) IS
'SHA-256 over "idem-fingerprint-v1", the upper-cased method, the path and the canonical body without the members named in exclude (see doc/fingerprints.md)';

-- citus_distribute and its step on the workers (sql/parts/70_citus.sql):
-- they distribute idempotency.tombstones too (see the column tenant above)

/*
 * Run on each worker by citus_distribute, before idempotency.keys and
 * idempotency.tombstones are distributed: drop this node's dated partitions
 * of its local (not yet distributed) tables, which Citus would otherwise
 * try to create again as shells of the coordinator's partitions.  Refuses
 * when this node's keys hold rows: they would be lost.  This node's own
 * tombstones (of keys that expired here before the Citus mode) have no
 * tenant, by which Citus would place them: they are deleted, with a
 * notice.  A table distributed already is left alone.
 */
CREATE OR REPLACE FUNCTION idempotency.idem_citus_drop_local_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
    t regclass;
    n integer := 0;
    gone bigint;
BEGIN
    FOREACH t IN ARRAY ARRAY['idempotency.keys', 'idempotency.tombstones']::regclass[]
    LOOP
        CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                              WHERE logicalrelid = t);
        IF t = 'idempotency.keys'::regclass AND EXISTS (SELECT FROM idempotency.keys) THEN
            RAISE EXCEPTION 'idempotency.keys of this node holds keys'
                USING ERRCODE = '55000',
                      DETAIL = 'Distributing idempotency.keys drops the dated partitions of each worker''s own table of keys.',
                      HINT = 'Move them with idem_export_keys on this node and idem_import_keys on the coordinator before distributing, or delete them.';
        END IF;
        IF t = 'idempotency.tombstones'::regclass THEN
            DELETE FROM idempotency.tombstones;
            GET DIAGNOSTICS gone = ROW_COUNT;
            IF gone > 0 THEN
                RAISE NOTICE 'deleted % tombstones of this node''s own expired keys', gone
                    USING DETAIL = 'They were written before the Citus mode and name no tenant, by which Citus places tombstones; those keys are no longer refused with another payload.';
            END IF;
        END IF;
        FOR r IN
            SELECT c.oid::regclass AS rel
            FROM pg_catalog.pg_inherits i
            JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = t
              AND c.oid NOT IN ('idempotency.keys_default'::regclass,
                                'idempotency.tombstones_default'::regclass)
            ORDER BY 1
        LOOP
            EXECUTE pg_catalog.format('DROP TABLE %s', r.rel);
            n := n + 1;
        END LOOP;
    END LOOP;
    RETURN n;
END
$$;
COMMENT ON FUNCTION idempotency.idem_citus_drop_local_partitions() IS
    'Citus mode: drop the dated partitions of this worker''s local idempotency.keys and idempotency.tombstones before they are distributed';

CREATE OR REPLACE FUNCTION idempotency.citus_distribute(colocate_with regclass)
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
    gone bigint;
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
    END IF;
    IF keys_coloc IS NULL OR NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                                WHERE logicalrelid = 'idempotency.tombstones'::regclass) THEN
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
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                   WHERE logicalrelid = 'idempotency.keys'::regclass) THEN
        -- its trigger keys_horizon (sql/parts/00_schema.sql) goes to the
        -- shards too; it only raises a horizon, which no node of a Citus
        -- cluster reads (src/horizon.c)
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM pg_catalog.create_distributed_table('idempotency.keys', 'tenant',
                                                    colocate_with => colocate_with::text);
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'off', true);
    END IF;

    -- tombstones (doc/tombstones.md), colocated with the keys by tenant, so
    -- that a claim on a worker reads the tombstones of its tenant there; a
    -- database distributed by 0.3.0 gets them at this call after the update.
    -- The coordinator's tombstones of before the Citus mode name no tenant,
    -- by which Citus would place them: they are deleted, with a notice.
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                   WHERE logicalrelid = 'idempotency.tombstones'::regclass) THEN
        DELETE FROM idempotency.tombstones WHERE tenant IS NULL;
        GET DIAGNOSTICS gone = ROW_COUNT;
        IF gone > 0 THEN
            RAISE NOTICE 'deleted % tombstones written before the Citus mode', gone
                USING DETAIL = 'They name no tenant, by which Citus places tombstones; those expired keys are no longer refused with another payload.';
        END IF;
        -- likewise its trigger tombstones_filter (src/tombstone_filter.c: no
        -- filter is used in the Citus mode)
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM pg_catalog.create_distributed_table('idempotency.tombstones', 'tenant',
                                                    colocate_with => 'idempotency.keys');
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'off', true);
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
    'Citus mode: distribute idempotency.keys and idempotency.tombstones by tenant colocated with the given table, endpoints as a reference table, the per-key functions by tenant';

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
REVOKE EXECUTE ON FUNCTION idempotency.idem_keys_horizon_trigger() FROM PUBLIC;
SELECT idempotency.idem_update_ddl('idempotency.keys', $ddl$
CREATE TRIGGER keys_horizon%2$s BEFORE INSERT OR UPDATE ON %1$s
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_keys_horizon_trigger()$ddl$);
SELECT idempotency.idem_update_ddl('idempotency.keys', 'ALTER TABLE %1$s ENABLE ALWAYS TRIGGER keys_horizon%2$s');

/*
 * Membership filters of the tombstone partitions (src/tombstone_filter.c): a
 * claim opens a partition only when its filter says the key may be there.
 * Every row written into the table adds its hash to its partition's filter
 * first, from this trigger, which each partition has as a clone; ALWAYS,
 * so that a logical replication apply adds them too.
 */
CREATE FUNCTION idempotency.idem_tombstones_filter_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_tombstones_filter_trigger'
LANGUAGE C;
COMMENT ON FUNCTION idempotency.idem_tombstones_filter_trigger() IS
    'Adds a tombstone written into idempotency.tombstones to its partition''s filter (trigger tombstones_filter)';
REVOKE EXECUTE ON FUNCTION idempotency.idem_tombstones_filter_trigger() FROM PUBLIC;
SELECT idempotency.idem_update_ddl('idempotency.tombstones', $ddl$
CREATE TRIGGER tombstones_filter%2$s BEFORE INSERT OR UPDATE ON %1$s
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_tombstones_filter_trigger()$ddl$);
SELECT idempotency.idem_update_ddl('idempotency.tombstones', 'ALTER TABLE %1$s ENABLE ALWAYS TRIGGER tombstones_filter%2$s');

-- the helpers of the Citus mode, at the top of this script
DROP FUNCTION idempotency.idem_update_ddl(regclass, text, boolean);
DROP FUNCTION idempotency.idem_update_targets(regclass);

-- Trigger and event trigger functions: no role but their owner may execute
-- them.  CREATE TRIGGER checks EXECUTE and firing a trigger does not: a role
-- that may execute one could attach it to a table of its own, whose columns
-- it would read as what they are not (each also refuses any table but the
-- extension's, src/util.c).  Revoked from every role that holds the right.
DO $$
DECLARE
    f regprocedure;
    r text;
BEGIN
    FOR f, r IN
        SELECT p.oid::pg_catalog.regprocedure,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END
        FROM pg_catalog.pg_proc p
        CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(p.proacl,
            pg_catalog.acldefault('f', p.proowner))) a
        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
          AND p.prorettype OPERATOR(pg_catalog.=) ANY
              (ARRAY['pg_catalog.trigger'::pg_catalog.regtype,
                     'pg_catalog.event_trigger'::pg_catalog.regtype]::pg_catalog.oid[])
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
        ORDER BY 1, 2
    LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s', f, r);
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------
-- The outbox (sql/parts/80_outbox.sql, doc/calling.md)
-- ---------------------------------------------------------------------
CREATE TABLE idempotency.outbox (
    id                  bigserial PRIMARY KEY,
    -- the session's bound tenant (idempotency.tenant), NULL when unbound
    tenant              text COLLATE "C",
    key                 text COLLATE "C" NOT NULL,
    method              text NOT NULL
                        CHECK (method IN ('POST', 'PUT', 'PATCH', 'DELETE', 'GET')),
    url                 text NOT NULL,
    body                jsonb NOT NULL,
    headers             jsonb NOT NULL DEFAULT '{}',
    state               text NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'in_flight', 'succeeded', 'failed', 'attention')),
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL,
    lease_token         bigint,
    locked_until        timestamptz,
    -- when the current lease was taken: the start of the attempt it records
    leased_at           timestamptz,
    last_status         integer,
    last_error          text,
    response_status     integer,
    response_headers    jsonb,
    response_body       text,
    created_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    first_attempt_at    timestamptz,
    finished_at         timestamptz,
    -- a key names one operation of a tenant (the unbound sessions' NULL
    -- tenant is one tenant too)
    CONSTRAINT outbox_tenant_key_key UNIQUE NULLS NOT DISTINCT (tenant, key),
    CHECK ((state = 'in_flight') = (lease_token IS NOT NULL AND locked_until IS NOT NULL)),
    CHECK ((state IN ('succeeded', 'failed', 'attention')) = (finished_at IS NOT NULL))
);
-- what a lease looks for: due pending operations, lapsed leases
CREATE INDEX outbox_pending_idx ON idempotency.outbox (next_attempt_at, id)
    WHERE state = 'pending';
CREATE INDEX outbox_in_flight_idx ON idempotency.outbox (locked_until)
    WHERE state = 'in_flight';
-- what maintenance removes
CREATE INDEX outbox_finished_idx ON idempotency.outbox (finished_at)
    WHERE state IN ('succeeded', 'failed');
COMMENT ON TABLE idempotency.outbox IS
    'Calls of idempotent APIs to be sent, each with its Idempotency-Key (idem_outbox_add)';
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_id_seq', '');

-- One row per attempt of an operation: recorded (idem_outbox_record), or
-- lapsed (a lease taken over by another sender: outcome 'lapsed').
CREATE TABLE idempotency.outbox_attempts (
    outbox_id           bigint NOT NULL
                        REFERENCES idempotency.outbox (id) ON DELETE CASCADE,
    attempt             integer NOT NULL,
    started_at          timestamptz,
    ended_at            timestamptz,
    status              integer,
    error               text,
    outcome             text NOT NULL
                        CHECK (outcome IN ('succeeded', 'failed', 'attention', 'retry', 'lapsed'))
);
CREATE INDEX outbox_attempts_outbox_id_idx ON idempotency.outbox_attempts (outbox_id, attempt);
COMMENT ON TABLE idempotency.outbox_attempts IS
    'Every attempt of an operation of idempotency.outbox';
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_attempts', '');
-- Replica identity (doc/operations.md): maintenance deletes rows of both.
ALTER TABLE idempotency.outbox_attempts REPLICA IDENTITY FULL;
-- the final responses are compressed with lz4 where the server has it, as
-- the keys' stored bodies are
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_settings
               WHERE name = 'default_toast_compression'
                 AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE idempotency.outbox ALTER COLUMN response_body SET COMPRESSION lz4;
    END IF;
END
$$;

REVOKE ALL ON idempotency.outbox, idempotency.outbox_attempts, idempotency.outbox_id_seq
    FROM PUBLIC;

-- The tenant the session is bound to (idempotency.tenant), NULL when
-- unbound, read as the claim functions read it (src/tenant.c): without
-- shared_preload_libraries too, where a value a role's startup packet gave
-- the setting is refused and the role's own setting binds.  Called by the
-- outbox functions, which run as the owner.
CREATE FUNCTION idempotency.idem_outbox_tenant()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_outbox_tenant'
LANGUAGE C STABLE;

-- The largest body or response body the outbox keeps: the setting
-- idempotency.max_response_bytes, in bytes (the library, which defines it,
-- is loaded first: without shared_preload_libraries a session may not have
-- loaded it yet).
CREATE FUNCTION idempotency.idem_outbox_max_bytes()
RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    PERFORM idempotency.idem_outbox_tenant();
    SELECT s.setting::pg_catalog.int4 INTO n FROM pg_catalog.pg_settings s
    WHERE s.name OPERATOR(pg_catalog.=) 'idempotency.max_response_bytes';
    IF n IS NULL THEN
        RAISE EXCEPTION 'the setting idempotency.max_response_bytes is not defined'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Check that the library idempotency can be loaded.';
    END IF;
    RETURN n;
END
$$;

-- The operation to call: method, url, body (JSON), headers (an object of
-- strings, never an Idempotency-Key: the key is its own column); key NULL:
-- 16 random bytes in base64url (idem_token).  Its first attempt is due at
-- not_before (NULL: now).
CREATE FUNCTION idempotency.idem_outbox_add(method text, url text, body jsonb,
                                            headers jsonb DEFAULT '{}',
                                            key text DEFAULT NULL,
                                            not_before timestamptz DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    m text := pg_catalog.upper(idem_outbox_add.method);
    k text := idem_outbox_add.key;
    h record;
    bound text := idempotency.idem_outbox_tenant();
    max_bytes integer := idempotency.idem_outbox_max_bytes();
    body_bytes integer;
BEGIN
    IF m IS NULL OR url IS NULL OR body IS NULL OR headers IS NULL THEN
        RAISE EXCEPTION 'method, url, body and headers of an outbox operation must not be NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the JSON null (''null''::jsonb) for an empty body and ''{}'' for no headers.';
    END IF;
    IF m OPERATOR(pg_catalog.<>) ALL (ARRAY['POST', 'PUT', 'PATCH', 'DELETE', 'GET']) THEN
        RAISE EXCEPTION 'method "%" is not supported by the outbox', method
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use POST, PUT, PATCH, DELETE or GET.';
    END IF;
    IF url OPERATOR(pg_catalog.!~*) '^https?://[^/?#[:space:][:cntrl:]]+' OR
       url OPERATOR(pg_catalog.~) '[[:space:][:cntrl:]]' THEN
        RAISE EXCEPTION 'url of an outbox operation must be an absolute http or https URL'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It must start with http:// or https:// and a host, and contain no white space or control characters.';
    END IF;
    IF pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'headers of an outbox operation must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass an object of header names and string values, such as ''{"Content-Type": "application/json"}''.';
    END IF;
    FOR h IN SELECT e.key AS name, e.value FROM pg_catalog.jsonb_each(headers) e
    LOOP
        IF pg_catalog.lower(h.name) OPERATOR(pg_catalog.=) 'idempotency-key' THEN
            RAISE EXCEPTION 'headers of an outbox operation must not contain Idempotency-Key'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'The sender sends the operation''s own key, which is the argument key.',
                      HINT = 'Pass the key as the argument key, or leave it NULL to have one made.';
        END IF;
        IF pg_catalog.jsonb_typeof(h.value) OPERATOR(pg_catalog.<>) 'string' THEN
            RAISE EXCEPTION 'header "%" of an outbox operation is not a string', h.name
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = pg_catalog.format('Its value is a JSON %s.', pg_catalog.jsonb_typeof(h.value));
        END IF;
        IF h.name OPERATOR(pg_catalog.!~) '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR
           (h.value OPERATOR(pg_catalog.#>>) '{}'::text[]) OPERATOR(pg_catalog.~) '[\r\n]' THEN
            RAISE EXCEPTION 'header "%" of an outbox operation is not a valid HTTP header', h.name
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'A name is a token of RFC 9110 and a value holds no line break.';
        END IF;
    END LOOP;
    body_bytes := pg_catalog.octet_length(body::text);
    IF body_bytes OPERATOR(pg_catalog.>) max_bytes THEN
        RAISE EXCEPTION 'body of an outbox operation is too large'
            USING ERRCODE = 'IK413',
                  DETAIL = pg_catalog.format('It has %s bytes; idempotency.max_response_bytes allows %s.',
                                             body_bytes, max_bytes);
    END IF;
    IF k IS NULL THEN
        k := idempotency.idem_token();
    ELSIF NOT idempotency.idem_key_valid(k) THEN
        RAISE EXCEPTION 'idempotency key of an outbox operation is not valid'
            USING ERRCODE = 'IK400',
                  DETAIL = 'A key has 1 to 255 characters from A-Z, a-z, 0-9, "-" and "_".',
                  HINT = 'Leave the key NULL to have one made, or use a UUID, a ULID or another base32 or base64url string.';
    END IF;
    BEGIN
        INSERT INTO idempotency.outbox (tenant, key, method, url, body, headers,
                                        next_attempt_at)
        VALUES (bound, k, m, url, body, headers,
                coalesce(not_before, pg_catalog.now()));
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'idempotency key "%" is already in the outbox', k
            USING ERRCODE = 'unique_violation',
                  DETAIL = 'A key names one operation; adding the same operation twice is a mistake of the caller.',
                  HINT = 'Make a new key for a new operation; the operation already added is sent once.';
    END;
    RETURN k;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_add(text, text, jsonb, jsonb, text, timestamptz) IS
    'Add a call to the outbox in the caller''s transaction; returns its Idempotency-Key';

-- Lease due operations for a sender: pending ones whose next attempt is
-- due, and in-flight ones whose lease lapsed (their sender froze or died:
-- taken over with the same key, the lapsed attempt recorded as 'lapsed').
CREATE FUNCTION idempotency.idem_outbox_lease(max_operations integer DEFAULT 10,
                                              lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, key text, method text, url text, body jsonb, headers jsonb,
               attempts integer, lease_token bigint, created_at timestamptz,
               first_attempt_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound text := idempotency.idem_outbox_tenant();
BEGIN
    IF max_operations IS NULL OR max_operations OPERATOR(pg_catalog.<) 1
       OR max_operations OPERATOR(pg_catalog.>) 10000 THEN
        RAISE EXCEPTION 'max_operations must be between 1 and 10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval
       OR lease OPERATOR(pg_catalog.>) '1 day'::pg_catalog.interval THEN
        RAISE EXCEPTION 'lease must be longer than 0 and at most 1 day'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Lease for longer than one attempt takes, timeout included.';
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT o.id, o.state, o.attempts, o.leased_at
        FROM idempotency.outbox o
        WHERE (bound IS NULL OR o.tenant OPERATOR(pg_catalog.=) bound)
          AND ((o.state OPERATOR(pg_catalog.=) 'pending'
                AND o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now())
               OR (o.state OPERATOR(pg_catalog.=) 'in_flight'
                   AND o.locked_until OPERATOR(pg_catalog.<) pg_catalog.now()))
        ORDER BY o.next_attempt_at, o.id
        LIMIT max_operations
        FOR UPDATE SKIP LOCKED
    ), lapsed AS (
        INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, started_at, outcome, error)
        SELECT d.id, d.attempts, d.leased_at, 'lapsed', 'the lease lapsed before an outcome was recorded'
        FROM due d WHERE d.state OPERATOR(pg_catalog.=) 'in_flight'
    ), leased AS (
        UPDATE idempotency.outbox o
        SET state = 'in_flight',
            attempts = o.attempts OPERATOR(pg_catalog.+) 1,
            lease_token = ('x' OPERATOR(pg_catalog.||)
                           pg_catalog.substr(pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), 1, 12)
                           OPERATOR(pg_catalog.||)
                           pg_catalog.substr(pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), 17, 4)
                          )::pg_catalog.bit(64)::pg_catalog.int8,
            locked_until = pg_catalog.now() OPERATOR(pg_catalog.+) lease,
            leased_at = pg_catalog.now(),
            first_attempt_at = coalesce(o.first_attempt_at, pg_catalog.now())
        FROM due d
        WHERE o.id OPERATOR(pg_catalog.=) d.id
        RETURNING o.id, o.key, o.method, o.url, o.body, o.headers, o.attempts,
                  o.lease_token, o.created_at, o.first_attempt_at, o.next_attempt_at
    )
    SELECT l.id, l.key::text, l.method, l.url, l.body, l.headers, l.attempts,
           l.lease_token, l.created_at, l.first_attempt_at
    FROM leased l
    ORDER BY l.next_attempt_at, l.id;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_lease(integer, interval) IS
    'Lease due operations of the outbox for a sender (FOR UPDATE SKIP LOCKED)';

-- Find an operation by id and lock it, refusing another tenant's (IK401).
-- NULL when there is none, or, with a lease_token, when the operation is
-- not in flight under that lease (another sender took it over).
CREATE FUNCTION idempotency.idem_outbox_lock(id bigint, lease_token bigint DEFAULT NULL)
RETURNS idempotency.outbox
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound text := idempotency.idem_outbox_tenant();
    o idempotency.outbox;
BEGIN
    SELECT * INTO o FROM idempotency.outbox x
    WHERE x.id OPERATOR(pg_catalog.=) idem_outbox_lock.id
    FOR UPDATE;
    IF FOUND AND bound IS NOT NULL
       AND o.tenant IS DISTINCT FROM bound COLLATE "C" THEN
        -- the other tenant is not named
        RAISE EXCEPTION 'this session may not act for the tenant of outbox operation %', id
            USING ERRCODE = 'IK401',
                  DETAIL = pg_catalog.format('The setting idempotency.tenant binds this session to tenant "%s", and the operation belongs to another.', bound),
                  HINT = 'Connect as a role bound to the operation''s tenant.';
    END IF;
    IF NOT FOUND
       OR (idem_outbox_lock.lease_token IS NOT NULL
           AND (o.state OPERATOR(pg_catalog.<>) 'in_flight'
                OR o.lease_token IS DISTINCT FROM idem_outbox_lock.lease_token)) THEN
        RETURN NULL;
    END IF;
    RETURN o;
END
$$;

-- A text cut to at most max_bytes bytes, on a character boundary.
CREATE FUNCTION idempotency.idem_outbox_cut(t text, max_bytes integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    excess integer;
BEGIN
    IF t IS NULL OR max_bytes IS NULL
       OR pg_catalog.octet_length(t) OPERATOR(pg_catalog.<=) max_bytes THEN
        RETURN t;
    END IF;
    n := max_bytes;
    LOOP
        excess := pg_catalog.octet_length(pg_catalog.left(t, n)) OPERATOR(pg_catalog.-) max_bytes;
        EXIT WHEN excess OPERATOR(pg_catalog.<=) 0;
        n := n OPERATOR(pg_catalog.-) GREATEST(1, excess OPERATOR(pg_catalog./) 4);
    END LOOP;
    RETURN pg_catalog.left(t, n);
END
$$;

-- Record the outcome of an attempt under the lease of idem_outbox_lease:
-- 'succeeded', 'failed' or 'attention' (final), or 'retry' (pending again,
-- due at retry_at).  False, changing nothing, when the lease is no longer
-- the operation's (another sender took over) or it is not in flight.
CREATE FUNCTION idempotency.idem_outbox_record(id bigint, lease_token bigint, outcome text,
                                               status integer DEFAULT NULL,
                                               error text DEFAULT NULL,
                                               retry_at timestamptz DEFAULT NULL,
                                               response_headers jsonb DEFAULT NULL,
                                               response_body text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o idempotency.outbox;
    max_bytes integer := idempotency.idem_outbox_max_bytes();
    err text := idempotency.idem_outbox_cut(error, 2000);
BEGIN
    IF id IS NULL OR lease_token IS NULL OR outcome IS NULL THEN
        RAISE EXCEPTION 'id, lease_token and outcome must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF outcome OPERATOR(pg_catalog.<>) ALL (ARRAY['succeeded', 'failed', 'attention', 'retry']) THEN
        RAISE EXCEPTION 'invalid outcome: "%"', outcome
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Valid outcomes are "succeeded", "failed", "attention" and "retry".';
    END IF;
    IF outcome OPERATOR(pg_catalog.=) 'retry' AND retry_at IS NULL THEN
        RAISE EXCEPTION 'outcome "retry" needs retry_at'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass when the next attempt is due: now plus Retry-After or the backoff.';
    END IF;
    IF status IS NOT NULL AND (status OPERATOR(pg_catalog.<) 100 OR status OPERATOR(pg_catalog.>) 599) THEN
        RAISE EXCEPTION 'invalid HTTP status: %', status
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An HTTP status lies between 100 and 599; pass NULL when no response came.';
    END IF;
    IF response_headers IS NOT NULL
       AND pg_catalog.jsonb_typeof(response_headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'response_headers must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    o := idempotency.idem_outbox_lock(id, idem_outbox_record.lease_token);
    IF o.id IS NULL THEN
        RETURN false;
    END IF;

    INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, started_at, ended_at,
                                             status, error, outcome)
    VALUES (o.id, o.attempts, o.leased_at, pg_catalog.clock_timestamp(), status, err, outcome);

    IF outcome OPERATOR(pg_catalog.=) 'retry' THEN
        UPDATE idempotency.outbox x
        SET state = 'pending', next_attempt_at = retry_at,
            lease_token = NULL, locked_until = NULL, leased_at = NULL,
            last_status = status, last_error = err
        WHERE x.id OPERATOR(pg_catalog.=) o.id;
    ELSE
        UPDATE idempotency.outbox x
        SET state = outcome, finished_at = pg_catalog.now(),
            lease_token = NULL, locked_until = NULL, leased_at = NULL,
            last_status = status, last_error = err,
            response_status = status,
            response_headers = idem_outbox_record.response_headers,
            response_body = idempotency.idem_outbox_cut(idem_outbox_record.response_body, max_bytes)
        WHERE x.id OPERATOR(pg_catalog.=) o.id;
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_record(bigint, bigint, text, integer, text, timestamptz, jsonb, text) IS
    'Record the outcome of an attempt of an outbox operation under its lease';

-- Give a leased operation back unsent (a sender stopping): pending and
-- due now, its attempt not counted.  False when the lease is not the
-- operation's.
CREATE FUNCTION idempotency.idem_outbox_release(id bigint, lease_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o idempotency.outbox;
BEGIN
    IF id IS NULL OR lease_token IS NULL THEN
        RAISE EXCEPTION 'id and lease_token must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    o := idempotency.idem_outbox_lock(id, idem_outbox_release.lease_token);
    IF o.id IS NULL THEN
        RETURN false;
    END IF;
    UPDATE idempotency.outbox x
    SET state = 'pending', next_attempt_at = pg_catalog.now(),
        attempts = x.attempts OPERATOR(pg_catalog.-) 1,
        first_attempt_at = CASE WHEN x.attempts OPERATOR(pg_catalog.<=) 1 THEN NULL
                                ELSE x.first_attempt_at END,
        lease_token = NULL, locked_until = NULL, leased_at = NULL
    WHERE x.id OPERATOR(pg_catalog.=) o.id;
    RETURN true;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_release(bigint, bigint) IS
    'Give a leased outbox operation back unsent';

-- An operator's decision: an operation that needs attention, or failed,
-- goes back to pending with the same key, due now, with a new budget of
-- attempts and time (attempts 0, first_attempt_at NULL; its earlier
-- attempts stay in idempotency.outbox_attempts).
CREATE FUNCTION idempotency.idem_outbox_retry(id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o idempotency.outbox;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    o := idempotency.idem_outbox_lock(id);
    IF o.id IS NULL THEN
        RAISE EXCEPTION 'outbox operation % does not exist', id
            USING ERRCODE = 'IK404';
    END IF;
    IF o.state OPERATOR(pg_catalog.<>) ALL (ARRAY['attention', 'failed']) THEN
        RAISE EXCEPTION 'outbox operation % is in state "%", not attention or failed', id, o.state
            USING ERRCODE = 'IK409',
                  DETAIL = 'Only an operation that needs attention or failed can be put back.';
    END IF;
    UPDATE idempotency.outbox x
    SET state = 'pending', next_attempt_at = pg_catalog.now(), finished_at = NULL,
        attempts = 0, first_attempt_at = NULL
    WHERE x.id OPERATOR(pg_catalog.=) o.id;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_retry(bigint) IS
    'Put an outbox operation that needs attention or failed back to pending, with the same key';

-- The outbox per tenant (NULL: operations added by unbound sessions); a
-- session bound to a tenant (idempotency.tenant) sees that tenant's row alone.
-- Alert on attention > 0, a growing oldest_pending_age, lapsed leases.
CREATE VIEW idempotency.outbox_health AS
SELECT tenant,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'pending' AND next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE state = 'in_flight') AS in_flight,
       count(*) FILTER (WHERE state = 'in_flight' AND locked_until < now()) AS lapsed_leases,
       now() - min(created_at) FILTER (WHERE state IN ('pending', 'in_flight'))
           AS oldest_pending_age,
       count(*) FILTER (WHERE state = 'attention') AS attention,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded
FROM idempotency.outbox
WHERE idempotency.idem_outbox_tenant() IS NULL
   OR tenant = idempotency.idem_outbox_tenant() COLLATE "C"
GROUP BY tenant
ORDER BY tenant NULLS FIRST;

-- The operations of the outbox for an operator (idempotency_admin), who
-- finds here the id that idem_outbox_retry takes: never the key, the body
-- or the headers (a key is a secret, the body and headers may hold some).
-- A session bound to a tenant (idempotency.tenant) sees that tenant's
-- operations alone, as idem_outbox_retry acts on those alone; the barrier
-- keeps a caller's function in a WHERE clause from seeing the others'.
CREATE VIEW idempotency.outbox_operations WITH (security_barrier) AS
SELECT id, tenant, method, url, state, attempts, next_attempt_at, locked_until,
       state = 'in_flight' AND locked_until < now() AS lease_lapsed,
       last_status, last_error, created_at, first_attempt_at, finished_at
FROM idempotency.outbox
WHERE idempotency.idem_outbox_tenant() IS NULL
   OR tenant = idempotency.idem_outbox_tenant() COLLATE "C";
COMMENT ON VIEW idempotency.outbox_operations IS
    'The operations of the outbox for an operator, without their keys, bodies and headers';

-- The attempts of the outbox's operations for an operator: what each
-- attempt got (status, error) and how it ended, to decide on an operation
-- that needs attention before idem_outbox_retry.  Tenant-filtered as
-- outbox_operations, through the operation's row.
CREATE VIEW idempotency.outbox_operation_attempts WITH (security_barrier) AS
SELECT a.outbox_id AS id, o.tenant, a.attempt, a.started_at, a.ended_at,
       a.status, a.outcome, a.error
FROM idempotency.outbox_attempts a
JOIN idempotency.outbox o ON o.id OPERATOR(pg_catalog.=) a.outbox_id
WHERE idempotency.idem_outbox_tenant() IS NULL
   OR o.tenant = idempotency.idem_outbox_tenant() COLLATE "C";
COMMENT ON VIEW idempotency.outbox_operation_attempts IS
    'The attempts of the operations of the outbox for an operator';

-- its privileges, as sql/parts/99_privileges.sql gives them
REVOKE EXECUTE ON FUNCTION idempotency.idem_outbox_tenant(),
    idempotency.idem_outbox_max_bytes(), idempotency.idem_outbox_lock(bigint, bigint),
    idempotency.idem_outbox_cut(text, integer),
    idempotency.idem_outbox_add(text, text, jsonb, jsonb, text, timestamptz),
    idempotency.idem_outbox_lease(integer, interval),
    idempotency.idem_outbox_record(bigint, bigint, text, integer, text, timestamptz, jsonb, text),
    idempotency.idem_outbox_release(bigint, bigint),
    idempotency.idem_outbox_retry(bigint)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    idempotency.idem_outbox_add(text, text, jsonb, jsonb, text, timestamptz),
    idempotency.idem_outbox_lease(integer, interval),
    idempotency.idem_outbox_record(bigint, bigint, text, integer, text, timestamptz, jsonb, text),
    idempotency.idem_outbox_release(bigint, bigint)
    TO idempotency_client;
GRANT EXECUTE ON FUNCTION
    idempotency.idem_outbox_add(text, text, jsonb, jsonb, text, timestamptz),
    idempotency.idem_outbox_lease(integer, interval),
    idempotency.idem_outbox_record(bigint, bigint, text, integer, text, timestamptz, jsonb, text),
    idempotency.idem_outbox_release(bigint, bigint),
    idempotency.idem_outbox_retry(bigint)
    TO idempotency_admin;
GRANT SELECT ON idempotency.outbox_health TO idempotency_admin;
GRANT SELECT ON idempotency.outbox_operations, idempotency.outbox_operation_attempts TO idempotency_admin;
-- the views read the session's tenant as the caller
GRANT EXECUTE ON FUNCTION idempotency.idem_outbox_tenant() TO idempotency_admin;
