-- idempotency install script: the Citus mode (doc/scaling.md, the
-- "Citus" sections).  citus_distribute makes idempotency.keys a distributed
-- table colocated by tenant with the application's tables, endpoints a
-- reference table, and the per-key functions distributed functions, so that
-- a claim runs on the node that holds the tenant's shard (src/keystore_rel.c
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
        -- its trigger keys_horizon (sql/parts/00_schema.sql) goes to the
        -- shards too; it only raises a horizon, which no node of a Citus
        -- cluster reads (src/horizon.c)
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM pg_catalog.create_distributed_table('idempotency.keys', 'tenant',
                                                    colocate_with => colocate_with::text);
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
    'Citus mode: distribute idempotency.keys by tenant colocated with the given table, endpoints as a reference table, the per-key functions by tenant';
