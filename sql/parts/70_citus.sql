-- idempotency install script: the Citus mode (doc/scaling.md, the
-- "Citus" sections).  citus_distribute makes idempotency.keys (and the
-- tombstones of expired keys) distributed tables colocated by tenant with
-- the application's tables, endpoints a
-- reference table, and the per-key functions distributed functions, so that
-- a claim runs on the node that holds the tenant's shard (src/keystore_rel.c
-- resolves that shard and refuses a tenant whose shard is elsewhere).

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
CREATE FUNCTION idempotency.idem_citus_drop_local_partitions()
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
