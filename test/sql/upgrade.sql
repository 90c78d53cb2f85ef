--
-- ALTER EXTENSION idempotency UPDATE from every earlier version: the keys
-- stored before keep answering, and the result is what a fresh install of
-- the current version makes (functions, columns and their collations,
-- constraints, indexes, views, triggers, privileges).
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idempotency CASCADE;
CREATE EXTENSION idempotency VERSION '0.1.0' CASCADE;
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- The schema's objects as text, without OIDs; dated partitions left out
-- (maintenance makes them, not the install script).
CREATE FUNCTION pg_temp.idem_catalog() RETURNS TABLE (kind text, object text, detail text)
LANGUAGE sql AS $$
    SELECT 'function', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
           concat_ws(' ', pg_get_function_result(p.oid), p.provolatile, p.proisstrict,
                     p.prosecdef, p.proconfig::text, p.prosrc, p.probin, p.proacl::text)
    FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT 'column', c.relname || '.' || a.attname,
           concat_ws(' ', format_type(a.atttypid, a.atttypmod), co.collname, a.attnotnull,
                     pg_get_expr(d.adbin, d.adrelid), a.attnum)
    FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relname !~ '^(keys|tombstones)_p[0-9]'
      AND c.relkind IN ('r', 'p', 'v', 'c')
    UNION ALL
    SELECT 'constraint', conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'idempotency'::regnamespace AND conrelid::regclass::text !~ '(keys|tombstones)_p[0-9]'
    UNION ALL
    SELECT 'index', indexrelid::regclass::text, pg_get_indexdef(indexrelid)
    FROM pg_index WHERE indrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
                                     AND relname !~ '^(keys|tombstones)_p[0-9]')
    UNION ALL
    SELECT 'view', c.relname, pg_get_viewdef(c.oid)
    FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'v'
    UNION ALL
    SELECT 'privileges', c.relname, c.relacl::text
    FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relname !~ '^(keys|tombstones)_p[0-9]'
    UNION ALL
    SELECT 'trigger', tgrelid::regclass::text || '.' || tgname, pg_get_triggerdef(oid) || ' ' || tgenabled::text
    FROM pg_trigger WHERE NOT tgisinternal
      AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
                      AND relname !~ '^(keys|tombstones)_p[0-9]')
    UNION ALL
    SELECT 'event trigger', evtname, concat_ws(' ', evtevent, evtfoid::regprocedure, evtenabled, evttags::text)
    FROM pg_event_trigger
    UNION ALL
    SELECT 'replica identity', c.relname,
           concat_ws(' ', c.relreplident, (SELECT i.indexrelid::regclass::text FROM pg_index i
                                           WHERE i.indrelid = c.oid AND i.indisreplident))
    FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
      AND c.relname !~ '^(keys|tombstones)_p[0-9]'
    UNION ALL
    SELECT 'member', classid::regclass::text, count(*)::text
    FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
      AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
    GROUP BY classid
$$;

-- what 0.1.0 stored: a dated partition, a completed key, a leased one
SELECT count(*) > 0 AS partitions_made FROM idempotency.idem_maintenance(now()) WHERE kind = 'create';
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /up', 'up-1', sha256('one'));
SELECT idempotency.idem_finish('acme', 'POST /up', 'up-1', 201, '{"id": 1}');
COMMIT;
SELECT lease_token AS token FROM idempotency.idem_claim('acme', 'POST /up', 'up-2', sha256('two'),
                                                         lease => interval '1 hour') \gset

-- a view of the user's over the scope columns stops the update, which
-- changes nothing then
CREATE VIEW public.regress_idem_my_keys AS SELECT tenant, key FROM idempotency.keys;
\set SHOW_CONTEXT never
ALTER EXTENSION idempotency UPDATE;
\set SHOW_CONTEXT errors
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
DROP VIEW public.regress_idem_my_keys;

-- so does an endpoint whose ttl or lease 0.4.0 refuses (here: longer than
-- 100 years, which made every claim of it fail), named in the error; set
-- to what was meant, the update goes through
INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('POST /forever', '178000000 years');
\set SHOW_CONTEXT never
ALTER EXTENSION idempotency UPDATE;
\set SHOW_CONTEXT errors
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
UPDATE idempotency.endpoints SET ttl = '1 day' WHERE endpoint = 'POST /forever';

ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
DELETE FROM idempotency.endpoints WHERE endpoint = 'POST /forever';

-- the keys answer as before, from the partitions they were stored in
SELECT action, response_status, response_json FROM idempotency.idem_claim('acme', 'POST /up', 'up-1', sha256('one'));
SELECT action FROM idempotency.idem_claim('acme', 'POST /up', 'up-1', sha256('other'));
SELECT action, http_status FROM idempotency.idem_claim('acme', 'POST /up', 'up-2', sha256('two'));
SELECT idempotency.idem_finish('acme', 'POST /up', 'up-2', 200, '{"id": 2}', lease_token => :token);
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /up', 'up-2', sha256('two'));
SELECT key, state, tableoid::regclass <> 'idempotency.keys_default'::regclass AS in_dated_partition
FROM idempotency.keys WHERE endpoint = 'POST /up' ORDER BY key;
-- a new key after the update
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /up', 'up-3', sha256('three'));
SELECT idempotency.idem_finish('acme', 'POST /up', 'up-3', 201, '{"id": 3}');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /up', 'up-3', sha256('three'));

-- the dated partitions made before the update have a replica identity too
SELECT c.relname ~ '^keys_p' AS of_keys, c.relreplident, count(*) > 0 AS some
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent IN ('idempotency.keys'::regclass, 'idempotency.tombstones'::regclass)
  AND c.relname ~ '_p[0-9]'
GROUP BY 1, 2 ORDER BY 1, 2;

-- and every partition, dated or default, has the trigger that keeps its
-- horizons or filters (src/horizon.c, src/tombstone_filter.c), fired ALWAYS
SELECT c.relname ~ '^keys' AS of_keys, count(*) > 0 AS some,
       count(*) FILTER (WHERE t.tgenabled = 'A') = count(*) AS all_have_it
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
LEFT JOIN pg_trigger t ON t.tgrelid = c.oid AND t.tgname IN ('keys_horizon', 'tombstones_filter')
WHERE i.inhparent IN ('idempotency.keys'::regclass, 'idempotency.tombstones'::regclass)
GROUP BY 1 ORDER BY 1;

-- the updated schema is the fresh one: no difference either way
CREATE TEMP TABLE idem_updated AS SELECT * FROM pg_temp.idem_catalog();
SET client_min_messages = warning;
DROP EXTENSION idempotency CASCADE;
CREATE EXTENSION idempotency CASCADE;
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT 'only after the update' AS side, * FROM (TABLE idem_updated EXCEPT SELECT * FROM pg_temp.idem_catalog()) u
UNION ALL
SELECT 'only in a fresh install', * FROM (SELECT * FROM pg_temp.idem_catalog() EXCEPT TABLE idem_updated) f
ORDER BY 1, 2, 3;
SELECT count(*) > 100 AS catalog_compared FROM idem_updated;

-- this session cached the dropped tables' descriptions: claims work on
-- the new ones
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /up', 'up-1', sha256('one'));
SELECT idempotency.idem_finish('acme', 'POST /up', 'up-1', 201, '{"id": "fresh"}');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /up', 'up-1', sha256('one'));
DELETE FROM idempotency.keys WHERE endpoint = 'POST /up';
