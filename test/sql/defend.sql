--
-- The tables defend themselves (doc/operations.md): every call that writes
-- key rows is refused in a read-only transaction (25006), a replay too;
-- the resolver check of idempotency.endpoints fires under
-- session_replication_role = replica; DDL that would make claims wrong on
-- the tables of keys and tombstones is refused by the event trigger
-- idempotency_ddl_guard, while what stays allowed still runs.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
\set VERBOSITY terse
CREATE SCHEMA defend_test;
SET search_path = defend_test, public;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

-- a completed key, a leased key in progress, an unknown key
BEGIN;
SELECT action FROM idempotency.idem_claim('ro', 'e', 'done', sha256('a'));
SELECT idempotency.idem_finish('ro', 'e', 'done', 201, '{"id": 1}');
COMMIT;
SELECT lease_token AS token FROM idempotency.idem_claim('ro', 'e', 'leased', sha256('b'),
                                                         lease => interval '1 hour') \gset
SELECT lease_token AS token2 FROM idempotency.idem_claim('ro', 'e', 'unknown', sha256('c'),
                                                          lease => interval '1 hour') \gset
SELECT idempotency.idem_fail('ro', 'e', 'unknown', 'unknown', 'timeout', :token2);

-- Read-only transactions: every writing call is refused with 25006, a
-- claim that would only replay too; idem_lookup reads.
BEGIN READ ONLY;
SELECT regress.try($$SELECT idempotency.idem_claim('ro', 'e', 'new', sha256('n'))$$) AS new_claim;
SELECT regress.try($$SELECT idempotency.idem_claim('ro', 'e', 'done', sha256('a'))$$) AS replay;
SELECT regress.try($$SELECT idempotency.idem_finish('ro', 'e', 'leased', 200, '{}', lease_token => $$ || :token || ')') AS finish;
SELECT regress.try($$SELECT idempotency.idem_finish_bytes('ro', 'e', 'leased', 200, '\x00', lease_token => $$ || :token || ')') AS finish_bytes;
SELECT regress.try($$SELECT idempotency.idem_finish_ref('ro', 'e', 'leased', 200, 's3://b', lease_token => $$ || :token || ')') AS finish_ref;
SELECT regress.try($$SELECT idempotency.idem_fail('ro', 'e', 'leased', 'failed', 'x', $$ || :token || ')') AS fail;
SELECT regress.try($$SELECT idempotency.idem_release('ro', 'e', 'leased', $$ || :token || ')') AS release;
SELECT regress.try($$SELECT idempotency.idem_heartbeat('ro', 'e', 'leased', $$ || :token || $$, interval '1 minute')$$) AS heartbeat;
SELECT regress.try($$SELECT idempotency.idem_resolve('ro', 'e', 'unknown', 200, '{}')$$) AS resolve;
SELECT regress.try($$SELECT idempotency.idem_import_keys(jsonb_agg(jsonb_set(k, '{key}', '"imported"')), 'keep')
             FROM idempotency.idem_export_keys('ro') k WHERE k->>'key' = 'done'$$) AS import;
SELECT regress.try($$SELECT * FROM idempotency.idem_maintenance()$$) AS maintenance;
SELECT regress.try($$SELECT * FROM idempotency.idem_maintenance(preview => true)$$) AS maintenance_preview;
SELECT state FROM idempotency.idem_lookup('ro', 'e', 'done');
COMMIT;

-- the whole message once
BEGIN READ ONLY;
\set VERBOSITY default
SELECT action FROM idempotency.idem_claim('ro', 'e', 'done', sha256('a'));
\set VERBOSITY terse
ROLLBACK;

-- default_transaction_read_only, and a transaction that turns read-only
-- after its claim: the finish is refused, and so is its COMMIT's check
SET default_transaction_read_only = on;
SELECT regress.try($$SELECT idempotency.idem_claim('ro', 'e', 'new', sha256('n'))$$) AS claim_by_default;
RESET default_transaction_read_only;
BEGIN;
SELECT action FROM idempotency.idem_claim('ro', 'e', 'turned', sha256('t'));
SET TRANSACTION READ ONLY;
SELECT regress.try($$SELECT idempotency.idem_finish('ro', 'e', 'turned', 200, '{}')$$) AS finish_after_turn;
ROLLBACK;
-- nothing was written by any of them; the leased key is untouched
SELECT k.key, l.state, l.lease_held FROM idempotency.keys k
CROSS JOIN LATERAL idempotency.idem_lookup(k.tenant, k.endpoint, k.key) l
WHERE k.tenant = 'ro' ORDER BY k.key;
SELECT idempotency.idem_finish('ro', 'e', 'leased', 200, '{}', lease_token => :token);

-- session_replication_role = replica: the resolver is still checked, and
-- resolver_role still defaults to the role that sets it
CREATE FUNCTION not_a_resolver(a int) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION a_resolver(t text, e text, k text) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
SET session_replication_role = replica;
SELECT regress.try($$INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
             VALUES ('replica-bad', 'resolve', 'defend_test.not_a_resolver(int)')$$) AS bad_resolver;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('replica-good', 'resolve', 'defend_test.a_resolver(text,text,text)');
RESET session_replication_role;
SELECT endpoint, resolver, resolver_role = current_user::regrole AS role_set
FROM idempotency.endpoints WHERE endpoint LIKE 'replica-%';
SELECT tgname, tgenabled FROM pg_trigger
WHERE tgrelid = 'idempotency.endpoints'::regclass AND NOT tgisinternal ORDER BY 1;
DELETE FROM idempotency.endpoints WHERE endpoint LIKE 'replica-%';

-- a dated partition, made by maintenance (quietly: leases other tests left
-- may expire)
SET client_min_messages = error;
SELECT count(*) > 0 AS partitions_made FROM idempotency.idem_maintenance() WHERE kind = 'create';
RESET client_min_messages;
SELECT min(c.relname) AS part FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'idempotency.keys'::regclass AND c.relname ~ '^keys_p' \gset
CREATE TABLE public.defend_loose (LIKE idempotency.keys);

-- DDL the guard refuses, on the parents and on the partitions (the dated
-- partition's name, which is today's, shown as keys_pYYYYMMDDtHHMM)
SELECT replace(stmt, :'part', 'keys_pYYYYMMDDtHHMM') AS stmt,
       replace(regress.try(stmt), :'part', 'keys_pYYYYMMDDtHHMM') AS try FROM (VALUES
    ('ALTER TABLE idempotency.keys ADD COLUMN note text NOT NULL DEFAULT ''x'''),
    ('ALTER TABLE idempotency.keys DROP COLUMN fail_reason'),
    ('ALTER TABLE idempotency.keys ALTER COLUMN body_ref TYPE varchar(10)'),
    ('ALTER TABLE idempotency.keys ALTER COLUMN body_ref SET DEFAULT ''x'''),
    ('ALTER TABLE idempotency.keys_default ADD CONSTRAINT no_unknown CHECK (state <> ''unknown'')'),
    ('ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY'),
    ('ALTER TABLE idempotency.keys_default ENABLE ROW LEVEL SECURITY'),
    ('ALTER TABLE idempotency.keys_default SET UNLOGGED'),
    ('ALTER TABLE idempotency.keys RENAME COLUMN fail_reason TO why'),
    ('ALTER TABLE idempotency.' || :'part' || ' RENAME TO elsewhere'),
    ('ALTER INDEX idempotency.keys_default_scope_idx RENAME TO scope'),
    ('ALTER TABLE idempotency.tombstones_default SET SCHEMA public'),
    ('ALTER TABLE idempotency.keys DETACH PARTITION idempotency.' || :'part'),
    ('ALTER TABLE idempotency.keys DETACH PARTITION idempotency.keys_default'),
    ('ALTER TABLE idempotency.keys ATTACH PARTITION public.defend_loose FOR VALUES FROM (''9000-01-01'') TO (''9000-02-01'')'),
    ('CREATE TABLE idempotency.mine PARTITION OF idempotency.keys FOR VALUES FROM (''9000-01-01'') TO (''9000-02-01'')'),
    ('DROP TABLE idempotency.' || :'part'),
    ('DROP TABLE idempotency.tombstones_default'),
    ('DROP INDEX idempotency.keys_default_lease_idx'),
    ('CREATE INDEX ON idempotency.keys (created_at)'),
    ('CREATE TRIGGER t BEFORE INSERT ON idempotency.keys_default FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()'),
    ('CREATE TRIGGER t AFTER UPDATE ON idempotency.keys FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()'),
    ('CREATE RULE r AS ON UPDATE TO idempotency.keys_default DO INSTEAD NOTHING'),
    ('CREATE POLICY p ON idempotency.tombstones USING (true)')
) v(stmt);

-- what stays allowed
SELECT stmt, regress.try(stmt) FROM (VALUES
    ('ALTER TABLE idempotency.keys_default SET (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.05)'),
    ('ALTER TABLE idempotency.keys_default RESET (fillfactor, autovacuum_vacuum_scale_factor)'),
    ('ALTER TABLE idempotency.keys ALTER COLUMN key SET STATISTICS 500'),
    ('ALTER TABLE idempotency.keys ALTER COLUMN key SET STATISTICS -1'),
    ('ALTER TABLE idempotency.keys_default ALTER COLUMN key SET (n_distinct = -1)'),
    ('ALTER TABLE idempotency.keys_default ALTER COLUMN key RESET (n_distinct)'),
    ('ALTER TABLE idempotency.keys_default SET TABLESPACE pg_default'),
    ('ALTER INDEX idempotency.keys_default_scope_idx SET (fillfactor = 80)'),
    ('ALTER INDEX idempotency.keys_default_scope_idx RESET (fillfactor)'),
    ('CREATE INDEX defend_created_idx ON idempotency.keys_default (created_at)'),
    ('DROP INDEX idempotency.defend_created_idx'),
    ('CREATE STATISTICS defend_test.s ON tenant, endpoint FROM idempotency.keys_default'),
    ('DROP STATISTICS defend_test.s'),
    ('ALTER TABLE idempotency.keys_default DISABLE TRIGGER ALL'),
    ('ALTER TABLE idempotency.keys_default ENABLE TRIGGER ALL'),
    ('ALTER TABLE idempotency.keys ENABLE ALWAYS TRIGGER keys_horizon'),
    ('COMMENT ON TABLE idempotency.keys_default IS NULL'),
    ('REINDEX TABLE idempotency.keys_default'),
    ('CLUSTER idempotency.keys_default USING keys_default_scope_idx'),
    ('ALTER TABLE idempotency.keys_default SET WITHOUT CLUSTER'),
    ('ANALYZE idempotency.keys')
) v(stmt);
REINDEX TABLE CONCURRENTLY idempotency.keys_default;
VACUUM (FULL) idempotency.keys_default;
-- a partition named as maintenance names them may be made (pg_restore
-- does that); the guard stood aside for maintenance's own DDL above
SELECT regress.try('CREATE TABLE idempotency.keys_p90000101 PARTITION OF idempotency.keys FOR VALUES FROM (''9000-01-01'') TO (''9000-01-02'')') AS maintenance_name;

-- a superuser may turn the guard off for a repair by hand
SET idempotency.ddl_guard = off;
DROP TABLE idempotency.keys_p90000101;
CREATE TRIGGER t BEFORE INSERT ON idempotency.keys_default FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
DROP TRIGGER t ON idempotency.keys_default;
RESET idempotency.ddl_guard;
-- what was changed while the guard was off (or before it existed) is
-- caught when claims cache the table's description: claims are refused
-- with a clear error, rather than storing NULL in a NOT NULL column or
-- skipping a trigger
SET idempotency.ddl_guard = off;
ALTER TABLE idempotency.keys ADD COLUMN note text NOT NULL DEFAULT 'x';
SELECT regress.try($$SELECT idempotency.idem_claim('ro', 'e', 'shape', sha256('s'))$$) AS new_column;
ALTER TABLE idempotency.keys DROP COLUMN note;
CREATE TRIGGER t BEFORE INSERT ON idempotency.keys FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
SELECT regress.try($$SELECT idempotency.idem_claim('ro', 'e', 'shape', sha256('s'), lease => '1 min')$$) AS row_trigger;
DROP TRIGGER t ON idempotency.keys;
ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY;
SELECT regress.try($$SELECT idempotency.idem_claim('ro', 'e', 'shape', sha256('s'))$$) AS row_security;
ALTER TABLE idempotency.keys DISABLE ROW LEVEL SECURITY;
RESET idempotency.ddl_guard;
SELECT k.key, l.state FROM idempotency.keys k
CROSS JOIN LATERAL idempotency.idem_lookup(k.tenant, k.endpoint, k.key) l
WHERE k.key = 'shape';

-- nobody else may
CREATE ROLE regress_defend_admin;
GRANT idempotency_admin TO regress_defend_admin;
SET ROLE regress_defend_admin;
SELECT regress.try('SET idempotency.ddl_guard = off') AS set_by_admin;
RESET ROLE;
DROP ROLE regress_defend_admin;

-- claims work after all of it, on the same tables
BEGIN;
SELECT action FROM idempotency.idem_claim('ro', 'e', 'after', sha256('x'));
SELECT idempotency.idem_finish('ro', 'e', 'after', 201, '{"id": 2}');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('ro', 'e', 'after', sha256('x'));
SELECT action, response_json FROM idempotency.idem_claim('ro', 'e', 'done', sha256('a'));
SELECT count(*) AS columns FROM pg_attribute
WHERE attrelid = 'idempotency.keys'::regclass AND attnum > 0 AND NOT attisdropped;

DELETE FROM idempotency.keys WHERE tenant = 'ro';
DROP TABLE public.defend_loose;
-- the dated partitions made above go (with the guard off), as the tests
-- that follow expect none
SET idempotency.ddl_guard = off;
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent IN ('idempotency.keys'::regclass, 'idempotency.tombstones'::regclass)
                  AND inhrelid NOT IN ('idempotency.keys_default'::regclass,
                                       'idempotency.tombstones_default'::regclass)
    LOOP
        EXECUTE format('DROP TABLE %s', part);
    END LOOP;
END $$;
RESET idempotency.ddl_guard;
DROP SCHEMA defend_test CASCADE;
