--
-- Security: what a role holding only idempotency_admin (and TEMP, as every
-- role by default) may not do through the extension (issue 35, items 1 and
-- 2).  Each attack records who ran its code, or crashed the server before:
-- the test fails if any of it ran as the extension's owner or a superuser.
--
-- Trigger functions: nobody but their owner may attach them to a table,
-- and each refuses a table that is not the extension's own (this part runs
-- on any server).  The maintenance pass: a resolver cannot change the
-- settings the pass's own SQL runs with (skipped where the worker may run
-- a pass meanwhile).
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
DROP ROLE IF EXISTS regress_sec_admin;
RESET client_min_messages;
\set VERBOSITY terse
SET TimeZone = 'UTC';

CREATE ROLE regress_sec_admin LOGIN;
GRANT idempotency_admin TO regress_sec_admin;
-- the admin's own schema, for the variant that needs a CREATE right
CREATE SCHEMA adm AUTHORIZATION regress_sec_admin;

-- No role but the owner may execute a trigger or event trigger function
-- (CREATE TRIGGER checks EXECUTE; firing does not).
SELECT p.proname,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public,
       has_function_privilege('idempotency_client', p.oid, 'EXECUTE') AS client,
       has_function_privilege('idempotency_admin', p.oid, 'EXECUTE') AS admin
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND p.prorettype IN ('trigger'::regtype, 'event_trigger'::regtype)
ORDER BY 1;

-- The admin attaches the C trigger functions to tables of its own whose
-- columns have the expected names and other types, or a NULL endpoint:
-- each of these crashed the server (signal 11).  Now CREATE TRIGGER is
-- refused.
SET ROLE regress_sec_admin;
CREATE TABLE adm.t_check (endpoint text, ttl text, lease text);
CREATE TABLE adm.t_redact (endpoint text, diagnostics_redact integer);
CREATE TABLE adm.t_resolver (endpoint text, resolver text, resolver_role oid);
CREATE TABLE adm.t_horizon (endpoint integer, expires_at timestamptz);
CREATE TABLE adm.t_tomb (scope_hash integer, fingerprint integer) PARTITION BY RANGE (scope_hash);
CREATE TABLE adm.t_tomb_1 PARTITION OF adm.t_tomb FOR VALUES FROM (0) TO (100);
SELECT regress.try(format('CREATE TRIGGER t BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s',
                          t, f)) AS create_trigger, t, f
FROM (VALUES ('adm.t_check', 'idempotency.idem_endpoints_check()'),
             ('adm.t_redact', 'idempotency.idem_endpoints_check()'),
             ('adm.t_resolver', 'idempotency.idem_endpoints_resolver()'),
             ('adm.t_horizon', 'idempotency.idem_keys_horizon_trigger()'),
             ('adm.t_tomb', 'idempotency.idem_tombstones_filter_trigger()')) v(t, f);
RESET ROLE;

-- Whoever may attach them (a superuser, by mistake): each refuses a table
-- that is not the extension's, with a clear error, and the server stays up.
CREATE TRIGGER t BEFORE INSERT ON adm.t_check
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_check();
CREATE TRIGGER t BEFORE INSERT ON adm.t_redact
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_check();
CREATE TRIGGER t BEFORE INSERT ON adm.t_resolver
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_resolver();
CREATE TRIGGER t BEFORE INSERT ON adm.t_horizon
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_keys_horizon_trigger();
CREATE TRIGGER t BEFORE INSERT ON adm.t_tomb
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_tombstones_filter_trigger();
CREATE TRIGGER t2 AFTER INSERT ON adm.t_check
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.idem_endpoints_changed();
CREATE TRIGGER t2 BEFORE DELETE ON adm.t_redact
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_events_guard();
SET ROLE regress_sec_admin;
INSERT INTO adm.t_check VALUES ('e', 'x', 'y');
INSERT INTO adm.t_redact VALUES ('e', 7);
INSERT INTO adm.t_resolver VALUES (NULL, 'pg_catalog.concat_ws(text,text,text)', 1);
INSERT INTO adm.t_horizon VALUES (7, now());
INSERT INTO adm.t_tomb VALUES (7, 8);
DELETE FROM adm.t_redact;
RESET ROLE;
DROP TABLE adm.t_check, adm.t_redact, adm.t_resolver, adm.t_horizon, adm.t_tomb;
-- and in the extension's schema (where only its owner makes tables: here
-- tables named as Citus names the shards of its own), each checks the type
-- of every column it reads, and a NULL endpoint
CREATE TABLE idempotency.endpoints_9 (endpoint text, ttl text, resolver text,
                                      resolver_role regrole);
CREATE TABLE idempotency.keys_9 (endpoint integer, expires_at timestamptz);
CREATE TRIGGER t BEFORE INSERT ON idempotency.endpoints_9
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_check();
INSERT INTO idempotency.endpoints_9 (endpoint, ttl) VALUES ('e', 'x');
DROP TRIGGER t ON idempotency.endpoints_9;
CREATE TRIGGER t BEFORE INSERT ON idempotency.endpoints_9
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_resolver();
INSERT INTO idempotency.endpoints_9 (endpoint, resolver)
VALUES (NULL, 'pg_catalog.concat_ws(text,text,text)');
CREATE TRIGGER t BEFORE INSERT ON idempotency.keys_9
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_keys_horizon_trigger();
INSERT INTO idempotency.keys_9 VALUES (7, now());
DROP TABLE idempotency.endpoints_9, idempotency.keys_9;
SELECT 'the server is up' AS up;

-- The maintenance pass runs as the extension's owner; an endpoint's
-- resolver runs as the admin that set it.
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
DROP SCHEMA adm CASCADE;
DROP ROLE regress_sec_admin;
\quit
\endif

CREATE FUNCTION pg_temp.put(endpoint text, key text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
                                  lease_token, locked_until, created_at, expires_at)
    VALUES ('t1', endpoint, key, regress.fp(key), 'in_progress', 42,
            '2030-01-01 00:00+00', '2029-12-31 00:00+00', '2030-02-01 00:00+00')
$$;

-- 1. A resolver that sets the search_path (SET, not SET LOCAL: it would
-- outlive the call) to the admin's schema, which shadows the functions and
-- operators the pass then uses on the answer.  Each records who ran it.
SET ROLE regress_sec_admin;
CREATE TABLE adm.seen (what text, who name, super boolean);
GRANT USAGE ON SCHEMA adm TO PUBLIC;
GRANT INSERT ON adm.seen TO PUBLIC;
CREATE FUNCTION adm.note(what text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO adm.seen SELECT what, current_user,
        (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)
$$;
CREATE FUNCTION adm.jsonb_typeof(j jsonb) RETURNS text
LANGUAGE sql AS $$ SELECT adm.note('jsonb_typeof'); SELECT pg_catalog.jsonb_typeof(j) $$;
CREATE FUNCTION adm.convert_to(t text, enc name) RETURNS bytea
LANGUAGE sql AS $$ SELECT adm.note('convert_to'); SELECT pg_catalog.convert_to(t, enc) $$;
CREATE FUNCTION adm.get(j jsonb, k text) RETURNS jsonb
LANGUAGE sql AS $$ SELECT adm.note('->'); SELECT j OPERATOR(pg_catalog.->) k $$;
CREATE OPERATOR adm.-> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = adm.get);
CREATE FUNCTION adm.resolver(tenant text, endpoint text, key text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM adm.note('resolver');
    PERFORM pg_catalog.set_config('search_path', 'adm, pg_catalog', false);
    RETURN '{"status": 201, "body": {"paid": true}}';
END $$;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('pay', 'resolve', 'adm.resolver(text,text,text)');
RESET ROLE;
SELECT pg_temp.put('pay', 'k1');
SELECT pg_temp.put('pay', 'k2');

SET ROLE regress_sec_admin;
SHOW search_path;
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-02 00:00+00', preview => false)
WHERE kind LIKE 'lease%' OR kind = 'resolver_error' ORDER BY kind, object;
-- the setting the resolver made ends with its call
SHOW search_path;
RESET ROLE;
RESET search_path;
-- the resolver ran (as the admin), nothing of the admin's as anyone else
SELECT what, who, super, count(*) FROM adm.seen GROUP BY 1, 2, 3 ORDER BY 1, 2;
-- the answer was read as the pass reads it, and stored in full
SELECT key, state, response_status, convert_from(response_body, 'UTF8') AS body
FROM idempotency.keys WHERE endpoint = 'pay' ORDER BY key;
DELETE FROM idempotency.keys WHERE endpoint = 'pay';
DELETE FROM idempotency.endpoints WHERE endpoint = 'pay';
TRUNCATE adm.seen;

-- 2. The variant that needs no CREATE right: a temporary domain text with
-- a CHECK, and a resolver (temporary too) that puts pg_temp first, where
-- the pass's casts to text would find the domain.
SET ROLE regress_sec_admin;
CREATE FUNCTION pg_temp.spy(t pg_catalog.text) RETURNS boolean
LANGUAGE sql AS $$ SELECT adm.note('domain check'); SELECT true $$;
CREATE FUNCTION pg_temp.resolver(tenant pg_catalog.text, endpoint pg_catalog.text,
                                 key pg_catalog.text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM adm.note('resolver');
    PERFORM pg_catalog.set_config('search_path', 'pg_temp, pg_catalog', false);
    RETURN '{"status": 200, "body": "done"}';
END $$;
SELECT pg_catalog.format('%I.resolver(text,text,text)', nspname) AS resolver
FROM pg_namespace WHERE oid = pg_my_temp_schema() \gset
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('ship', 'resolve', :'resolver');
CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.spy(VALUE));
RESET ROLE;
SELECT pg_temp.put('ship', 'k1');
SET ROLE regress_sec_admin;
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-02 00:00+00', preview => false)
WHERE kind LIKE 'lease%' OR kind = 'resolver_error' ORDER BY kind, object;
SHOW search_path;
RESET ROLE;
RESET search_path;
SELECT what, who, super, count(*) FROM adm.seen GROUP BY 1, 2, 3 ORDER BY 1, 2;
SELECT key, state, response_status, convert_from(response_body, 'UTF8') AS body
FROM idempotency.keys WHERE endpoint = 'ship' ORDER BY key;
DELETE FROM idempotency.keys WHERE endpoint = 'ship';
DELETE FROM idempotency.endpoints WHERE endpoint = 'ship';

DROP DOMAIN pg_temp.text;
DROP FUNCTION pg_temp.spy(pg_catalog.text),
    pg_temp.resolver(pg_catalog.text, pg_catalog.text, pg_catalog.text);
TRUNCATE adm.seen;

-- 3. A resolver is found by its name at each call: a role with CREATE on
-- its schema that re-creates it once dropped (or owns it, and may replace
-- it) would have its code run as the resolver's role.  A function that
-- runs as its caller must belong to a superuser or to a role with the
-- privileges of resolver_role, when it is set and at each call.
CREATE ROLE regress_sec_app;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app TO PUBLIC;
GRANT CREATE ON SCHEMA app TO regress_sec_app;
CREATE FUNCTION app.find(tenant text, endpoint text, key text) RETURNS jsonb
LANGUAGE sql AS $$ SELECT '{"status": 200}'::jsonb $$;
GRANT EXECUTE ON FUNCTION app.find(text, text, text) TO regress_sec_admin;
SET ROLE regress_sec_admin;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('find', 'resolve', 'app.find(text,text,text)');
RESET ROLE;
DROP FUNCTION app.find(text, text, text);
SET ROLE regress_sec_app;
CREATE FUNCTION app.find(tenant text, endpoint text, key text) RETURNS jsonb
LANGUAGE sql AS $$ SELECT adm.note('re-created'); SELECT '{"status": 200}'::jsonb $$;
GRANT EXECUTE ON FUNCTION app.find(text, text, text) TO PUBLIC;
RESET ROLE;
SELECT pg_temp.put('find', 'k1');
SET ROLE regress_sec_admin;
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-02 00:00+00', preview => false)
WHERE kind LIKE 'lease%' OR kind = 'resolver_error' ORDER BY kind, object;
RESET ROLE;
SELECT what, who, super, count(*) FROM adm.seen GROUP BY 1, 2, 3 ORDER BY 1, 2;
SELECT key, state FROM idempotency.keys WHERE endpoint = 'find' ORDER BY key;
-- nor may the admin name a function of such a role; a SECURITY DEFINER
-- one runs as its owner, and may be named
\set VERBOSITY default
SET ROLE regress_sec_admin;
UPDATE idempotency.endpoints SET resolver = 'app.find(text,text,text)', resolver_role = NULL
WHERE endpoint = 'find';
\set VERBOSITY terse
RESET ROLE;
ALTER FUNCTION app.find(text, text, text) SECURITY DEFINER;
SET ROLE regress_sec_admin;
UPDATE idempotency.endpoints SET resolver = 'app.find(text,text,text)', resolver_role = NULL
WHERE endpoint = 'find';
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-02 00:00+00', preview => false)
WHERE kind LIKE 'lease%' OR kind = 'resolver_error' ORDER BY kind, object;
RESET ROLE;
SELECT what, who, super, count(*) FROM adm.seen GROUP BY 1, 2, 3 ORDER BY 1, 2;
DELETE FROM idempotency.keys WHERE endpoint = 'find';
DELETE FROM idempotency.endpoints WHERE endpoint = 'find';
DROP SCHEMA app CASCADE;
DROP ROLE regress_sec_app;

DROP SCHEMA adm CASCADE;
DROP ROLE regress_sec_admin;
