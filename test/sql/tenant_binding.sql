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

-- helpers every role of the test may call
CREATE SCHEMA regress_tb;
GRANT USAGE ON SCHEMA regress_tb TO PUBLIC;
CREATE FUNCTION regress_tb.fp(s text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT sha256(convert_to(s, 'UTF8')) $$;
-- run a statement; show "ok" and its first column, or the whole error
CREATE FUNCTION regress_tb.try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text; hnt text; res text;
BEGIN
    IF stmt ~* '^\s*select' THEN
        EXECUTE stmt INTO res;
    ELSE
        EXECUTE stmt;
    END IF;
    RETURN 'ok' || coalesce(': ' || res, '');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || coalesce(' / ' || nullif(det, ''), '')
           || coalesce(' / ' || nullif(hnt, ''), '');
END $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA regress_tb TO PUBLIC;

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
AS $$ SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g')) $$;
SHOW idempotency.tenant;

-- globex, bound to itself, keeps one key of each kind
\c - regress_tb_globex
SHOW idempotency.tenant;
BEGIN;
SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'));
SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-done', 201, '{"card": "globex secret"}');
COMMIT;
SELECT lease_token AS g_token
FROM idempotency.idem_claim('globex', 'POST /pay', 'g-leased', regress_tb.fp('g'),
                            lease => interval '1 hour') \gset
SELECT lease_token AS g_token2
FROM idempotency.idem_claim('globex', 'POST /pay', 'g-failed', regress_tb.fp('g'),
                            lease => interval '1 hour') \gset
SELECT idempotency.idem_fail('globex', 'POST /pay', 'g-failed', 'failed', lease_token => :g_token2);
-- globex itself may not act for acme either
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', regress_tb.fp('a'))$$);

-- what globex keeps, as the superuser sees it
\c - :su
SELECT tenant, key, state, response_status FROM idempotency.keys ORDER BY tenant, key;
CREATE TABLE regress_tb.before_attacks AS SELECT * FROM idempotency.keys;

\c - regress_tb_acme
SHOW idempotency.tenant;
SELECT current_setting('idempotency.tenant') AS bound_to;
-- its own tenant works
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', regress_tb.fp('a'));
SELECT idempotency.idem_finish('acme', 'POST /pay', 'a-1', 201, '{"acme": true}');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', regress_tb.fp('a'));

-- 1. direct calls naming globex: refused before anything is looked at, so
-- that an existing key answers exactly like a missing one
SELECT regress_tb.try($$SELECT action || ' ' || coalesce(convert_from(response_body, 'UTF8'), '') FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'))$$) AS claim_replay;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('other'))$$) AS claim_mismatch;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-failed', regress_tb.fp('g'))$$) AS claim_pending;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-new', regress_tb.fp('g'))$$) AS claim_new;
SELECT regress_tb.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-leased', 200, '{}', lease_token => 1)$$) AS finish_leased;
SELECT regress_tb.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-done', 200, '{}')$$) AS finish_done;
SELECT regress_tb.try($$SELECT idempotency.idem_finish_bytes('globex', 'POST /pay', 'g-leased', 200, '\x00', lease_token => 1)$$) AS finish_bytes;
SELECT regress_tb.try($$SELECT idempotency.idem_finish_ref('globex', 'POST /pay', 'g-leased', 200, 's3://x', lease_token => 1)$$) AS finish_ref;
SELECT regress_tb.try($$SELECT idempotency.idem_fail('globex', 'POST /pay', 'g-leased', 'failed', lease_token => 1)$$) AS fail;
SELECT regress_tb.try($$SELECT idempotency.idem_release('globex', 'POST /pay', 'g-leased', 1)$$) AS release;
SELECT regress_tb.try($$SELECT idempotency.idem_heartbeat('globex', 'POST /pay', 'g-leased', 1, interval '1 hour')$$) AS heartbeat;
-- the same answers for a key globex never had
SELECT regress_tb.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'g-leased', 200, '{}', lease_token => 1)$$)
     = regress_tb.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'never', 200, '{}', lease_token => 1)$$)
       AS leased_same_as_missing;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('other'))$$)
     = regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'never', regress_tb.fp('other'))$$)
       AS done_same_as_missing;
-- tenants are compared byte for byte
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('ACME', 'POST /pay', 'a-1', regress_tb.fp('a'))$$) AS upper_case;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('acme ', 'POST /pay', 'a-1', regress_tb.fp('a'))$$) AS trailing_space;
-- a malformed key or tenant is still IK400, checked first
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'bad key', regress_tb.fp('g'))$$) AS bad_key;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('', 'POST /pay', 'a-1', regress_tb.fp('g'))$$) AS empty_tenant;

-- 2. changing the setting: SET, SET LOCAL, RESET, RESET ALL, set_config
SELECT regress_tb.try($$SET idempotency.tenant = 'globex'$$) AS set;
SELECT regress_tb.try($$SET LOCAL idempotency.tenant = 'globex'$$) AS set_local;
SELECT regress_tb.try($$SET idempotency.tenant = ''$$) AS set_empty;
SELECT regress_tb.try($$RESET idempotency.tenant$$) AS reset;
SELECT regress_tb.try($$SET idempotency.tenant TO DEFAULT$$) AS set_default;
RESET ALL;
DISCARD ALL;
SELECT regress_tb.try($$SELECT set_config('idempotency.tenant', 'globex', false)$$) AS set_config;
SELECT regress_tb.try($$SELECT set_config('idempotency.tenant', 'globex', true)$$) AS set_config_local;
SHOW idempotency.tenant;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'))$$) AS after_settings;

-- 3. transactions and savepoints
BEGIN;
SAVEPOINT s1;
SELECT regress_tb.try($$SET LOCAL idempotency.tenant = 'globex'$$) AS set_local_in_savepoint;
ROLLBACK TO SAVEPOINT s1;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'))$$) AS after_savepoint;
ROLLBACK;

-- 4. SET ROLE to a role bound to nothing, and to the client role itself:
-- the binding is the session's, made at login from the login role
SET ROLE regress_tb_unbound;
SHOW idempotency.tenant;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'))$$) AS after_set_role;
SELECT regress_tb.try($$SET idempotency.tenant = 'globex'$$) AS set_after_set_role;
RESET ROLE;
SET ROLE idempotency_client;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'))$$) AS as_client_role;
RESET ROLE;

-- 5. PL/pgSQL: a DO block, a function with its own SET clause, ALTER ROLE
DO $$
BEGIN
    BEGIN
        PERFORM set_config('idempotency.tenant', 'globex', false);
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'set_config: % %', SQLSTATE, SQLERRM;
    END;
    PERFORM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'));
    RAISE NOTICE 'reached globex';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'claim: % %', SQLSTATE, SQLERRM;
END
$$;
SELECT regress_tb.try($$CREATE FUNCTION pg_temp.as_globex() RETURNS text LANGUAGE sql
                        SET idempotency.tenant = 'globex'
                        AS 'SELECT action FROM idempotency.idem_claim(''globex'', ''POST /pay'', ''g-done'', regress_tb.fp(''g''))'$$)
       AS function_set_clause;
SELECT regress_tb.try($$SELECT regress_tb.as_globex()$$) AS superusers_definer_function;
SELECT regress_tb.try($$ALTER ROLE regress_tb_acme SET idempotency.tenant = 'globex'$$) AS alter_own_role;
SELECT regress_tb.try($$ALTER ROLE regress_tb_acme RESET idempotency.tenant$$) AS alter_own_role_reset;
SELECT regress_tb.try($$ALTER ROLE regress_tb_acme RESET ALL$$) AS alter_own_role_reset_all;
SHOW idempotency.tenant;

-- 6. the operator functions the client may not call at all; the views of
-- every tenant's rows are not granted to clients
SELECT regress_tb.try($$SELECT count(*) FROM idempotency.idem_lookup('globex', 'POST /pay', 'g-done')$$) AS lookup;
SELECT regress_tb.try($$SELECT count(*) FROM idempotency.health$$) AS health;
SELECT regress_tb.try($$SELECT count(*) FROM idempotency.stats$$) AS stats;
SELECT regress_tb.try($$SELECT count(*) FROM idempotency.events$$) AS events;
SELECT regress_tb.try($$SELECT count(*) FROM idempotency.keys$$) AS keys;

-- an operator bound to acme: lookup and resolve take a tenant and enforce
-- the binding like the client's functions
\c - regress_tb_acme_ops
SELECT regress_tb.try($$SELECT state FROM idempotency.idem_lookup('globex', 'POST /pay', 'g-done')$$) AS ops_lookup_other;
SELECT regress_tb.try($$SELECT idempotency.idem_resolve('globex', 'POST /pay', 'g-failed', 200, '{}')$$) AS ops_resolve_other;
SELECT regress_tb.try($$SELECT state FROM idempotency.idem_lookup('acme', 'POST /pay', 'a-1')$$) AS ops_lookup_own;

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
SELECT regress_tb.try($$SET idempotency.tenant = 'globex'$$) AS superuser_set;
RESET idempotency.tenant;
SHOW idempotency.tenant;
SELECT regress_tb.try($$SELECT regress_tb.as_globex()$$) AS definer_set_clause;
SELECT regress_tb.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', regress_tb.fp('g'))$$) AS superuser_bound;
-- ALTER ROLE still validates other roles' values in a bound session
ALTER ROLE regress_tb_unbound SET idempotency.tenant = 'initech';
ALTER ROLE regress_tb_unbound RESET idempotency.tenant;

-- a value longer than any tenant binds too, and then no tenant matches
\c - :su
SELECT length(set_config('idempotency.tenant', repeat('t', 256), false)) AS bound_length;
SELECT left(regress_tb.try($$SELECT action FROM idempotency.idem_claim(repeat('t', 255), 'POST /pay', 'a-1', regress_tb.fp('a'))$$), 60) AS too_long_binding;

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
