-- idempotency 0.3.0 to 0.4.0
--
-- Kept as it is once released; the install script of 0.4.0 is assembled
-- from sql/parts.  Every change of the schema between the two versions is
-- made here too, so that an updated database equals a fresh install (the
-- regression test "upgrade" compares them).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- Replica identity of every table the extension writes (doc/operations.md,
-- "Logical replication and blue/green switch-over"): lease updates and
-- maintenance's deletes work under a publication FOR ALL TABLES and Citus
-- moves shards online.  Partitions do not inherit it: the existing ones,
-- made by maintenance or CREATE EXTENSION, each get their own; partitions of
-- keys name their unique index on (key, endpoint, tenant), partitions of
-- tombstones are FULL.
ALTER TABLE idempotency.keys REPLICA IDENTITY FULL;
ALTER TABLE idempotency.tombstones REPLICA IDENTITY FULL;
DO $replica_identity$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT i.inhrelid::regclass AS part,
               (SELECT x.indexrelid::regclass
                FROM pg_catalog.pg_index x
                WHERE x.indrelid = i.inhrelid AND x.indisunique AND x.indisvalid
                  AND x.indpred IS NULL AND x.indexprs IS NULL AND x.indnkeyatts = 3
                  AND (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attname)
                       FROM pg_catalog.pg_attribute a
                       WHERE a.attrelid = i.inhrelid
                         AND a.attnum = ANY (x.indkey::int2[]))
                      = ARRAY['endpoint', 'key', 'tenant']
                ORDER BY x.indexrelid LIMIT 1) AS idx
        FROM pg_catalog.pg_inherits i
        WHERE i.inhparent = 'idempotency.keys'::regclass
        ORDER BY 1
    LOOP
        IF r.idx IS NULL THEN
            RAISE EXCEPTION 'partition % of idempotency.keys has no unique index on (key, endpoint, tenant)', r.part
                USING ERRCODE = '55000',
                      HINT = 'Every partition needs that index; partitions made by idem_maintenance() have it.';
        END IF;
        EXECUTE pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY USING INDEX %I',
                                  r.part, (SELECT relname FROM pg_catalog.pg_class WHERE oid = r.idx));
    END LOOP;
    FOR r IN
        SELECT i.inhrelid::regclass AS part
        FROM pg_catalog.pg_inherits i
        WHERE i.inhparent = 'idempotency.tombstones'::regclass
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY FULL', r.part);
    END LOOP;
END
$replica_identity$;

-- The tables defend themselves (doc/operations.md): the triggers of
-- idempotency.endpoints fire under session_replication_role = replica too.
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_resolver;
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_changed;

-- The tables defend themselves (doc/operations.md): the DDL guard of the
-- tables of keys and tombstones, as in sql/parts/76_ddl_guard.sql.
CREATE FUNCTION idempotency.idem_ddl_guard()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_ddl_guard'
LANGUAGE C;
REVOKE EXECUTE ON FUNCTION idempotency.idem_ddl_guard() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_ddl_guard() TO idempotency_admin;

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
    ALTER TABLE idempotency.endpoints
        ALTER COLUMN resolver TYPE text USING resolver::text;
    PERFORM pg_catalog.set_config('search_path', saved, true);
END
$resolver_text$;
