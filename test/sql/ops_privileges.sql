--
-- The privilege model: roles idempotency_client and idempotency_admin,
-- nothing for PUBLIC, no direct access to the storage for clients.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
\set VERBOSITY terse

SELECT rolname, rolcanlogin FROM pg_roles
WHERE rolname IN ('idempotency_client', 'idempotency_admin') ORDER BY 1;
SELECT pg_has_role('idempotency_admin', 'idempotency_client', 'MEMBER') AS admin_is_client;

-- no function of the schema is executable by PUBLIC
SELECT p.oid::regprocedure AS executable_by_public
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND has_function_privilege('public', p.oid, 'EXECUTE');
-- nor any table, view or sequence readable by PUBLIC
SELECT c.oid::regclass AS readable_by_public
FROM pg_class c
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
  AND (has_table_privilege('public', c.oid, 'SELECT')
       OR has_table_privilege('public', c.oid, 'INSERT, UPDATE, DELETE'));

-- what the client may execute (the admin may execute every function but
-- the trigger functions, which no role but their owner may execute, and
-- idem_import_check, which only the import, as the owner, calls)
SELECT p.proname
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND has_function_privilege('idempotency_client', p.oid, 'EXECUTE')
ORDER BY 1;
SELECT p.oid::regprocedure AS not_executable_by_admin
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND NOT has_function_privilege('idempotency_admin', p.oid, 'EXECUTE')
ORDER BY p.proname;

-- relations: the client reads and writes nothing directly
SELECT c.relname,
       has_table_privilege('idempotency_client', c.oid, 'SELECT') AS client_select,
       has_table_privilege('idempotency_client', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE') AS client_write,
       has_table_privilege('idempotency_admin', c.oid, 'SELECT') AS admin_select,
       has_table_privilege('idempotency_admin', c.oid, 'INSERT, UPDATE, DELETE') AS admin_write,
       has_table_privilege('idempotency_admin', c.oid, 'TRUNCATE') AS admin_truncate
FROM pg_class c
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p', 'v')
  AND c.relname IN ('keys', 'keys_default', 'endpoints', 'events', 'stats', 'health')
ORDER BY 1;

-- a login role granted only idempotency_client
CREATE ROLE regress_idem_app LOGIN;
GRANT idempotency_client TO regress_idem_app;
CREATE ROLE regress_idem_ops LOGIN;
GRANT idempotency_admin TO regress_idem_ops;
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
                              created_at, expires_at)
VALUES ('t1', 'POST /x', 'k-priv', sha256('r'), 'in_progress', now(), now() + interval '1 hour');

SET ROLE regress_idem_app;
SELECT idempotency.idem_key_valid('k-1') AS client_can_validate,
       length(idempotency.idem_token()) AS client_can_mint;
SELECT count(*) FROM idempotency.keys;
SELECT count(*) FROM idempotency.keys_default;
UPDATE idempotency.keys SET state = 'completed';
DELETE FROM idempotency.keys;
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('t1', 'POST /x', 'k-forged', sha256('r'), 'completed', now(), now() + interval '1 hour');
TRUNCATE idempotency.keys;
SELECT count(*) FROM idempotency.events;
INSERT INTO idempotency.events (tenant, endpoint, key_hash) VALUES ('t1', 'e', 'x');
SELECT count(*) FROM idempotency.endpoints;
INSERT INTO idempotency.endpoints (endpoint, store_response) VALUES ('POST /x', false);
SELECT count(*) FROM idempotency.stats;
SELECT count(*) FROM idempotency.health;
SELECT count(*) FROM idempotency.idem_stats();
SELECT idempotency.idem_stats_reset();
SELECT idempotency.idem_key_hash('t1', 'POST /x', 'k-priv');
RESET ROLE;

-- the admin reads the views and the audit trail and edits policies, but
-- writes neither the storage nor the audit trail
SET ROLE regress_idem_ops;
SELECT endpoint, live_keys, in_progress FROM idempotency.health WHERE endpoint = 'POST /x';
SELECT count(*) >= 1 AS admin_reads_stats FROM idempotency.stats;
SELECT count(*) >= 0 AS admin_reads_events FROM idempotency.events;
INSERT INTO idempotency.endpoints (endpoint, max_response_bytes) VALUES ('POST /x', 1024);
DELETE FROM idempotency.endpoints WHERE endpoint = 'POST /x';
SELECT count(*) FROM idempotency.keys;
INSERT INTO idempotency.events (tenant, endpoint, key_hash) VALUES ('t1', 'e', 'x');
DELETE FROM idempotency.events;
RESET ROLE;

DELETE FROM idempotency.keys WHERE key = 'k-priv';
DROP ROLE regress_idem_app;
DROP ROLE regress_idem_ops;
