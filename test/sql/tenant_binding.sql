--
-- Binding a session to a tenant with idempotency.tenant.  A login role
-- granted only idempotency_client and bound to tenant acme (ALTER ROLE ...
-- SET) tries every way to reach tenant globex's keys: direct calls, SET,
-- RESET, set_config, SET LOCAL and savepoints, SET ROLE, PL/pgSQL, function
-- SET clauses, ALTER ROLE; each must fail, and must fail the same way
-- whether globex's key exists or not.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

-- what the test keeps, in a schema of its own
CREATE SCHEMA regress_tb;
GRANT USAGE ON SCHEMA regress_tb TO PUBLIC;

SELECT current_user AS su \gset
CREATE ROLE regress_tb_acme LOGIN;
GRANT idempotency_client TO regress_tb_acme;
ALTER ROLE regress_tb_acme SET idempotency.tenant = 'acme';
CREATE ROLE regress_tb_globex LOGIN;
GRANT idempotency_client TO regress_tb_globex;
ALTER ROLE regress_tb_globex SET idempotency.tenant = 'globex';
-- a role acme may SET ROLE to, itself bound to nothing
CREATE ROLE regress_tb_unbound NOLOGIN;
GRANT idempotency_client TO regress_tb_unbound;
GRANT regress_tb_unbound TO regress_tb_acme;
-- an operator bound to acme
CREATE ROLE regress_tb_acme_ops LOGIN;
GRANT idempotency_admin TO regress_tb_acme_ops;
ALTER ROLE regress_tb_acme_ops SET idempotency.tenant = 'acme';

-- a superuser's SECURITY DEFINER function that sets the tenant.  CREATE
-- FUNCTION applies a SET clause while it checks the body, so making the
-- function binds the session that makes it
CREATE FUNCTION regress_tb.as_globex() RETURNS text LANGUAGE sql SECURITY DEFINER
SET idempotency.tenant = 'globex'
AS $$ SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g')) $$;
SHOW idempotency.tenant;

-- globex, bound to itself, keeps one key of each kind
\c - regress_tb_globex
SHOW idempotency.tenant;
BEGIN;
SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'));
SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-done', 201, '{"card": "globex secret"}');
COMMIT;
SELECT lease_token AS g_token
FROM idempotency.idem_claim('globex', 'POST /pay', 'g-leased', regress.fp('g'),
                            lease => interval '1 hour') \gset
SELECT lease_token AS g_token2
FROM idempotency.idem_claim('globex', 'POST /pay', 'g-failed', regress.fp('g'),
                            lease => interval '1 hour') \gset
SELECT idempotency.idem_fail('globex', 'POST /pay', 'g-failed', 'failed', lease_token => :g_token2);
-- globex itself may not act for acme either
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', regress.fp('a'))$$, 'verbose');

-- what globex keeps, as the superuser sees it
\c - :su
SELECT tenant, key, state, response_status FROM idempotency.keys ORDER BY tenant, key;
CREATE TABLE regress_tb.before_attacks AS SELECT * FROM idempotency.keys;

\c - regress_tb_acme
SHOW idempotency.tenant;
SELECT current_setting('idempotency.tenant') AS bound_to;
-- its own tenant works
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', regress.fp('a'));
SELECT idempotency.idem_finish('acme', 'POST /pay', 'a-1', 201, '{"acme": true}');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', regress.fp('a'));

-- 1. direct calls naming globex: refused before anything is looked at, so
-- that an existing key answers exactly like a missing one
SELECT regress.try($$SELECT action || ' ' || coalesce(convert_from(response_body, 'UTF8'), '') FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'))$$, 'verbose') AS claim_replay;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('other'))$$, 'verbose') AS claim_mismatch;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-failed', regress.fp('g'))$$, 'verbose') AS claim_pending;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-new', regress.fp('g'))$$, 'verbose') AS claim_new;
SELECT regress.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-leased', 200, '{}', lease_token => 1)$$, 'verbose') AS finish_leased;
SELECT regress.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-done', 200, '{}')$$, 'verbose') AS finish_done;
SELECT regress.try($$SELECT idempotency.idem_finish_bytes('globex', 'POST /pay', 'g-leased', 200, '\x00', lease_token => 1)$$, 'verbose') AS finish_bytes;
SELECT regress.try($$SELECT idempotency.idem_finish_ref('globex', 'POST /pay', 'g-leased', 200, 's3://x', lease_token => 1)$$, 'verbose') AS finish_ref;
SELECT regress.try($$SELECT idempotency.idem_fail('globex', 'POST /pay', 'g-leased', 'failed', lease_token => 1)$$, 'verbose') AS fail;
SELECT regress.try($$SELECT idempotency.idem_release('globex', 'POST /pay', 'g-leased', 1)$$, 'verbose') AS release;
SELECT regress.try($$SELECT idempotency.idem_heartbeat('globex', 'POST /pay', 'g-leased', 1, interval '1 hour')$$, 'verbose') AS heartbeat;
-- the same answers for a key globex never had
SELECT regress.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-leased', 200, '{}', lease_token => 1)$$, 'verbose')
     = regress.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'never', 200, '{}', lease_token => 1)$$, 'verbose')
       AS leased_same_as_missing;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('other'))$$, 'verbose')
     = regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'never', regress.fp('other'))$$, 'verbose')
       AS done_same_as_missing;
-- tenants are compared byte for byte
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('ACME', 'POST /pay', 'a-1', regress.fp('a'))$$, 'verbose') AS upper_case;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('acme ', 'POST /pay', 'a-1', regress.fp('a'))$$, 'verbose') AS trailing_space;
-- a malformed key or tenant is still IK400, checked first
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'bad key', regress.fp('g'))$$, 'verbose') AS bad_key;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('', 'POST /pay', 'a-1', regress.fp('g'))$$, 'verbose') AS empty_tenant;

-- 2. changing the setting: SET, SET LOCAL, RESET, RESET ALL, set_config
SELECT regress.try($$SET idempotency.tenant = 'globex'$$, 'verbose') AS set;
SELECT regress.try($$SET LOCAL idempotency.tenant = 'globex'$$, 'verbose') AS set_local;
SELECT regress.try($$SET idempotency.tenant = ''$$, 'verbose') AS set_empty;
SELECT regress.try($$RESET idempotency.tenant$$, 'verbose') AS reset;
SELECT regress.try($$SET idempotency.tenant TO DEFAULT$$, 'verbose') AS set_default;
RESET ALL;
DISCARD ALL;
SELECT regress.try($$SELECT set_config('idempotency.tenant', 'globex', false)$$, 'verbose') AS set_config;
SELECT regress.try($$SELECT set_config('idempotency.tenant', 'globex', true)$$, 'verbose') AS set_config_local;
SHOW idempotency.tenant;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'))$$, 'verbose') AS after_settings;

-- 3. transactions and savepoints
BEGIN;
SAVEPOINT s1;
SELECT regress.try($$SET LOCAL idempotency.tenant = 'globex'$$, 'verbose') AS set_local_in_savepoint;
ROLLBACK TO SAVEPOINT s1;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'))$$, 'verbose') AS after_savepoint;
ROLLBACK;

-- 4. SET ROLE to a role bound to nothing, and to the client role itself:
-- the binding is the session's, made at login from the login role
SET ROLE regress_tb_unbound;
SHOW idempotency.tenant;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'))$$, 'verbose') AS after_set_role;
SELECT regress.try($$SET idempotency.tenant = 'globex'$$, 'verbose') AS set_after_set_role;
RESET ROLE;
SET ROLE idempotency_client;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'))$$, 'verbose') AS as_client_role;
RESET ROLE;

-- 5. PL/pgSQL: a DO block, a function with its own SET clause, ALTER ROLE
DO $$
BEGIN
    BEGIN
        PERFORM set_config('idempotency.tenant', 'globex', false);
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'set_config: % %', SQLSTATE, SQLERRM;
    END;
    PERFORM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'));
    RAISE NOTICE 'reached globex';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'claim: % %', SQLSTATE, SQLERRM;
END
$$;
SELECT regress.try($$CREATE FUNCTION pg_temp.as_globex() RETURNS text LANGUAGE sql
                        SET idempotency.tenant = 'globex'
                        AS 'SELECT action FROM idempotency.idem_claim(''globex'', ''POST /pay'', ''g-done'', regress.fp(''g''))'$$, 'verbose')
       AS function_set_clause;
SELECT regress.try($$SELECT regress_tb.as_globex()$$, 'verbose') AS superusers_definer_function;
SELECT regress.try($$ALTER ROLE regress_tb_acme SET idempotency.tenant = 'globex'$$, 'verbose') AS alter_own_role;
SELECT regress.try($$ALTER ROLE regress_tb_acme RESET idempotency.tenant$$, 'verbose') AS alter_own_role_reset;
SELECT regress.try($$ALTER ROLE regress_tb_acme RESET ALL$$, 'verbose') AS alter_own_role_reset_all;
SHOW idempotency.tenant;

-- 6. the operator functions the client may not call at all; the views of
-- every tenant's rows are not granted to clients
SELECT regress.try($$SELECT count(*) FROM idempotency.idem_lookup('globex', 'POST /pay', 'g-done')$$, 'verbose') AS lookup;
SELECT regress.try($$SELECT count(*) FROM idempotency.health$$, 'verbose') AS health;
SELECT regress.try($$SELECT count(*) FROM idempotency.stats$$, 'verbose') AS stats;
SELECT regress.try($$SELECT count(*) FROM idempotency.events$$, 'verbose') AS events;
SELECT regress.try($$SELECT count(*) FROM idempotency.keys$$, 'verbose') AS keys;

-- an operator bound to acme: lookup and resolve take a tenant and enforce
-- the binding like the client's functions
\c - regress_tb_acme_ops
SELECT regress.try($$SELECT state FROM idempotency.idem_lookup('globex', 'POST /pay', 'g-done')$$, 'verbose') AS ops_lookup_other;
SELECT regress.try($$SELECT idempotency.idem_resolve('globex', 'POST /pay', 'g-failed', 200, '{}')$$, 'verbose') AS ops_resolve_other;
SELECT regress.try($$SELECT state FROM idempotency.idem_lookup('acme', 'POST /pay', 'a-1')$$, 'verbose') AS ops_lookup_own;

-- 7. a privileged session binds itself by SET; once bound, even a
-- superuser's SET, a superuser's SECURITY DEFINER function with a SET
-- clause, RESET and a rolled-back SET LOCAL leave the binding as it is.
\c - :su
SHOW idempotency.tenant;
SELECT state FROM idempotency.idem_lookup('globex', 'POST /pay', 'g-done') AS unbound_sees_all;
BEGIN;
SET LOCAL idempotency.tenant = 'acme';
ROLLBACK;
SHOW idempotency.tenant;
SELECT regress.try($$SET idempotency.tenant = 'globex'$$, 'verbose') AS superuser_set;
RESET idempotency.tenant;
SHOW idempotency.tenant;
SELECT regress.try($$SELECT regress_tb.as_globex()$$, 'verbose') AS definer_set_clause;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress.fp('g'))$$, 'verbose') AS superuser_bound;
-- ALTER ROLE still validates other roles' values in a bound session
ALTER ROLE regress_tb_unbound SET idempotency.tenant = 'initech';
ALTER ROLE regress_tb_unbound RESET idempotency.tenant;

-- a value longer than any tenant binds too, and then no tenant matches
\c - :su
SELECT length(set_config('idempotency.tenant', repeat('t', 256), false)) AS bound_length;
SELECT left(regress.try($$SELECT action FROM idempotency.idem_claim(repeat('t', 255), 'POST /pay', 'a-1', regress.fp('a'))$$, 'verbose'), 60) AS too_long_binding;

-- the binding of the login role does not follow SET ROLE
\c - :su
SET ROLE regress_tb_acme;
SHOW idempotency.tenant;
RESET ROLE;

-- acme's ALTER ROLE ... RESET ALL left its binding in place
SELECT setconfig FROM pg_db_role_setting WHERE setrole = 'regress_tb_acme'::regrole;

-- nothing of globex changed through all this
SELECT tenant, key, state, response_status FROM idempotency.keys ORDER BY tenant, key;
SELECT count(*) AS globex_rows_changed
FROM (SELECT * FROM idempotency.keys WHERE tenant = 'globex'
      EXCEPT SELECT * FROM regress_tb.before_attacks WHERE tenant = 'globex') d;

-- every function of the schema that takes a tenant, and whether a client
-- may call it: those that read or write keys enforce the binding (above;
-- idem_export_keys and idem_import_keys, with idem_transfer_check_tenant
-- that both call, in the test transfer), idem_downstream_key and
-- idem_key_hash only compute a hash of their arguments
SELECT p.proname, has_function_privilege('idempotency_client', p.oid, 'EXECUTE') AS client_may_call
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace AND 'tenant' = ANY (p.proargnames)
ORDER BY 1;

DELETE FROM idempotency.keys;
DROP SCHEMA regress_tb CASCADE;
DROP ROLE regress_tb_acme, regress_tb_globex, regress_tb_unbound, regress_tb_acme_ops;
