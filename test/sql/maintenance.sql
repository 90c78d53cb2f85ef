--
-- One maintenance pass, with as_of: stale leases, the default partition,
-- premade partitions, retention.  (Skipped where the worker may run a pass
-- meanwhile.)
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
-- start from an empty store, whatever earlier tests left
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
RESET client_min_messages;
\set VERBOSITY terse
SET TimeZone = 'UTC';
SET idempotency.partition_interval = '1d';
SET idempotency.max_ttl = '7d';

-- CREATE EXTENSION makes the default partition only
SELECT inhrelid::regclass AS partition FROM pg_inherits
WHERE inhparent = 'idempotency.keys'::regclass;

-- admin only
SELECT has_function_privilege('public', 'idempotency.idem_maintenance(timestamptz,boolean)', 'EXECUTE')
    AS public_may_run;

CREATE FUNCTION pg_temp.put(tenant text, endpoint text, key text, state text,
                            expires_at timestamptz, locked_until timestamptz DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
                                  lease_token, locked_until, created_at, expires_at)
    VALUES (tenant, endpoint, key, decode(repeat('ab', 32), 'hex'), state,
            CASE WHEN state = 'in_progress' THEN 42 END, locked_until,
            '2029-12-31 00:00+00', expires_at)
$$;

-- Claims never fail before maintenance ran: these rows land in the default
-- partition.
SELECT pg_temp.put('t1', 'pay', 'soon',      'completed',   '2030-01-03 12:00+00');
SELECT pg_temp.put('t1', 'pay', 'far',       'completed',   '2030-02-01 00:00+00');
SELECT pg_temp.put('t1', 'pay', 'dead',      'completed',   '2029-12-31 12:00+00');
SELECT pg_temp.put('t1', 'pay', 'stale',     'in_progress', '2030-01-05 00:00+00', '2029-12-31 23:00+00');
SELECT pg_temp.put('t2', 'pay', 'stale',     'in_progress', '2030-01-05 00:00+00', '2029-12-31 23:00+00');
SELECT pg_temp.put('t1', 'pay', 'leased',    'in_progress', '2030-01-05 00:00+00', '2030-01-01 01:00+00');
SELECT pg_temp.put('t1', 'pay', 'deadlease', 'in_progress', '2029-12-31 23:30+00', '2029-12-31 23:00+00');
SELECT key, tableoid::regclass AS partition FROM idempotency.keys ORDER BY tenant, key;

-- The pass: stale leases become unknown (with a WARNING that shows a hash of
-- the key, never the key), the expired row leaves the default partition,
-- partitions cover as_of to as_of + max_ttl + one interval, and rows of
-- their ranges move out of the default partition.
SELECT * FROM idempotency.idem_maintenance('2030-01-01 00:00+00', preview => false) ORDER BY kind, object;

SELECT tenant, key, state, lease_token, locked_until, tableoid::regclass AS partition
FROM idempotency.keys ORDER BY tenant, key;

-- every dated partition: its range, its unique (key, endpoint, tenant) and
-- its index of leased claims in progress
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique) AS unique_indexes,
       to_regclass('idempotency.' || c.relname || '_lease_idx') IS NOT NULL AS lease_index
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'idempotency.keys'::regclass ORDER BY 1;

-- a partition is an ordinary table, not a member of the extension
SELECT count(*) AS partitions_in_extension FROM pg_depend
WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND classid = 'pg_class'::regclass AND objid::regclass::text LIKE 'idempotency.keys_p%';

-- a second pass at the same time has nothing to do
SELECT * FROM idempotency.idem_maintenance('2030-01-01 00:00+00', preview => false);

-- Three days later: partitions whose range has ended are dropped whole
-- (rows: the planner's estimate, here after ANALYZE), new ones are made.
ANALYZE idempotency.keys;
SELECT * FROM idempotency.idem_maintenance('2030-01-04 00:00+00', preview => false) ORDER BY kind, object;
SELECT tenant, key, state, tableoid::regclass AS partition
FROM idempotency.keys ORDER BY tenant, key;

-- a narrower partition_interval fills only what is not covered yet
SET idempotency.partition_interval = '12h';
SELECT * FROM idempotency.idem_maintenance('2030-01-05 00:00+00', preview => false) ORDER BY kind, object;
WITH parts AS (
    SELECT c.oid, tstzrange(m[1]::timestamptz, m[2]::timestamptz) AS r
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
         LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                              'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') m
    WHERE i.inhparent = 'idempotency.keys'::regclass AND m IS NOT NULL)
SELECT count(*) AS dated_partitions,
       (SELECT count(*) FROM parts a JOIN parts b ON a.oid < b.oid AND a.r && b.r) AS overlaps,
       max(upper(r)) AS covered_until
FROM parts;
RESET idempotency.partition_interval;

-- The far row moves out of the default partition once premake covers it;
-- the unknown rows expire with their partition.
SELECT * FROM idempotency.idem_maintenance('2030-01-28 00:00+00', preview => false)
WHERE kind <> 'create' OR rows > 0 ORDER BY kind, object;
SELECT tenant, key, state, tableoid::regclass AS partition
FROM idempotency.keys ORDER BY tenant, key;

-- Resolvers settle stale leases of endpoints that ask for it.
CREATE FUNCTION public.find_payment(tenant text, endpoint text, key text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF key LIKE 'ok%' THEN
        RETURN jsonb_build_object('status', 201,
                                  'body', jsonb_build_object('payment', key, 'tenant', tenant),
                                  'headers', jsonb_build_object('Location', '/payments/' || key));
    ELSIF key LIKE 'scalar%' THEN
        RETURN '{"status": 200, "body": "done"}';
    ELSIF key LIKE 'none%' THEN
        RETURN NULL;
    ELSIF key LIKE 'bad%' THEN
        RETURN '{"status": "created"}';
    ELSE
        RAISE EXCEPTION 'payments service unavailable';
    END IF;
END $$;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('charge', 'resolve', 'public.find_payment(text,text,text)');

SELECT pg_temp.put('t1', 'charge', k, 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00')
FROM unnest(ARRAY['ok1', 'scalar1', 'none1', 'bad1', 'boom1']) k;
SELECT pg_temp.put('t1', 'pay', 'plain', 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00');

SELECT * FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE kind NOT IN ('create', 'drop') ORDER BY kind, object;
SELECT key, state, response_status, response_headers, body_kind,
       convert_from(response_body, 'UTF8') AS body, fail_reason,
       completed_at = '2030-01-29 00:00+00' AS completed_at_as_of, lease_token
FROM idempotency.keys WHERE endpoint IN ('charge', 'pay') AND expires_at > '2030-01-29'
ORDER BY endpoint, key;

-- the rows the resolver could not settle are tried again by the next pass
SELECT * FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false) ORDER BY kind, object;
-- a preview names them without calling the resolver (no WARNING)
SELECT * FROM idempotency.idem_maintenance('2030-01-29 00:00+00')
WHERE kind LIKE 'lease%' ORDER BY kind, object;

-- A resolver runs as the endpoint's resolver_role: the role that set it.
-- An admin without access to idempotency.keys names one that reads it: the
-- pass runs it as that admin, and it cannot read the table.
CREATE ROLE idem_oncall NOLOGIN IN ROLE idempotency_admin;
CREATE ROLE idem_other NOLOGIN;
CREATE FUNCTION public.peek_keys(tenant text, endpoint text, key text)
RETURNS jsonb LANGUAGE sql
AS $$ SELECT jsonb_build_object('status', 200, 'body', count(*)) FROM idempotency.keys $$;
-- a superuser's function that only it may execute
CREATE FUNCTION public.secret_lookup(tenant text, endpoint text, key text)
RETURNS jsonb LANGUAGE sql
AS $$ SELECT jsonb_build_object('status', 200, 'body', 'the secret') $$;
REVOKE EXECUTE ON FUNCTION public.secret_lookup(text, text, text) FROM PUBLIC;
SET ROLE idem_oncall;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('peek', 'resolve', 'public.peek_keys(text,text,text)');
SELECT endpoint, resolver, resolver_role FROM idempotency.endpoints WHERE endpoint = 'peek';
-- it may not name a function it may not execute, nor one that is no
-- resolver, nor make another role run its resolver
\set VERBOSITY default
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('secret', 'resolve', 'public.secret_lookup(text,text,text)');
UPDATE idempotency.endpoints SET resolver = 'public.secret_lookup(text,text,text)'
WHERE endpoint = 'peek';
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('wrong', 'resolve', 'pg_catalog.replace(text,text,text)');
UPDATE idempotency.endpoints SET resolver_role = 'idem_other' WHERE endpoint = 'peek';
\set VERBOSITY terse
-- editing what is not the resolver keeps it and its role
UPDATE idempotency.endpoints SET ttl = '1 day' WHERE endpoint = 'peek';
RESET ROLE;
SELECT endpoint, resolver_role FROM idempotency.endpoints WHERE endpoint = 'peek';
SELECT pg_temp.put('t1', 'peek', 'p1', 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00');
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE kind LIKE 'lease%' OR kind = 'resolver_error' ORDER BY kind, object;
SELECT key, state FROM idempotency.keys WHERE endpoint = 'peek';
DELETE FROM idempotency.keys WHERE endpoint = 'peek';

-- The pass checks EXECUTE again before each call: once the right is
-- revoked, the resolver is not run and the key stays in_progress.
GRANT EXECUTE ON FUNCTION public.secret_lookup(text, text, text) TO idem_oncall;
SET ROLE idem_oncall;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('secret', 'resolve', 'public.secret_lookup(text,text,text)');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION public.secret_lookup(text, text, text) FROM idem_oncall;
SELECT pg_temp.put('t1', 'secret', 's1', 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00');
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE object = 'secret' ORDER BY kind, object;
SELECT key, state, response_body FROM idempotency.keys WHERE endpoint = 'secret';
-- a superuser may name another role, which must have EXECUTE itself
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver, resolver_role)
VALUES ('other', 'resolve', 'public.secret_lookup(text,text,text)', 'idem_other');
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver, resolver_role)
VALUES ('other', 'resolve', 'public.peek_keys(text,text,text)', 'idem_other')
RETURNING endpoint, resolver_role;
-- without a resolver there is no role
UPDATE idempotency.endpoints SET on_lease_expiry = 'unknown', resolver = NULL
WHERE endpoint = 'other' RETURNING endpoint, resolver_role;
-- the trigger functions are no functions to call
SELECT idempotency.idem_endpoints_changed();
SELECT idempotency.idem_endpoints_resolver();
-- nor to fire otherwise than BEFORE INSERT OR UPDATE FOR EACH ROW: the
-- same error, in the same words, as the extension's other row triggers
BEGIN;
CREATE TRIGGER zz_after AFTER INSERT ON idempotency.endpoints
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_resolver();
INSERT INTO idempotency.endpoints (endpoint) VALUES ('after');
ROLLBACK;
DELETE FROM idempotency.keys WHERE endpoint = 'secret';
DELETE FROM idempotency.endpoints WHERE endpoint IN ('peek', 'secret', 'other');
DROP FUNCTION public.peek_keys(text, text, text);
DROP FUNCTION public.secret_lookup(text, text, text);
DROP ROLE idem_oncall;
DROP ROLE idem_other;

-- A resolver that does not answer within idempotency.resolver_timeout is
-- cancelled: its keys stay in_progress and the pass goes on with the next
-- one (both keys are tried); the session is left with no cancel pending.
CREATE FUNCTION public.slow_lookup(tenant text, endpoint text, key text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(30);
    RETURN '{"status": 200}';
END $$;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('slow', 'resolve', 'public.slow_lookup(text,text,text)');
SELECT pg_temp.put('t1', 'slow', k, 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00')
FROM unnest(ARRAY['s1', 's2']) k;
SET idempotency.resolver_timeout = '200ms';
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE kind LIKE 'lease%' OR kind = 'resolver_error' ORDER BY kind, object;
SELECT key, state FROM idempotency.keys WHERE endpoint = 'slow' ORDER BY key;
SELECT pg_sleep(0.3), 'no cancel pending' AS session;
RESET idempotency.resolver_timeout;
DELETE FROM idempotency.keys WHERE endpoint = 'slow';
DELETE FROM idempotency.endpoints WHERE endpoint = 'slow';
DROP FUNCTION public.slow_lookup(text, text, text);

-- The resolver is stored as text, by its canonical name (schema-qualified,
-- with its argument types), whatever form it was given in: pg_upgrade keeps
-- no function OIDs.  Each call finds the function again by that name: one
-- renamed or dropped since is reported at the call, and its keys stay
-- in_progress; renamed back, it runs again.
CREATE SCHEMA resolvers;
CREATE FUNCTION resolvers."Named Lookup"(tenant text, endpoint text, key text)
RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"status": 200}'::jsonb $$;
SET search_path = resolvers, public;
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('named', 'resolve', '"Named Lookup"( text, TEXT, pg_catalog.text )');
-- a regprocedure value, as applications wrote it before 0.4.0
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('named-reg', 'resolve', '"Named Lookup"(text,text,text)'::regprocedure);
RESET search_path;
SELECT endpoint, resolver, pg_typeof(resolver), resolver::regprocedure::oid = 'resolvers."Named Lookup"(text,text,text)'::regprocedure::oid AS same
FROM idempotency.endpoints WHERE endpoint LIKE 'named%' ORDER BY endpoint;
-- a name must name a function, by name and argument types, not by OID
\set VERBOSITY default
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('e', 'resolve', 'public.no_such_lookup(text,text,text)');
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('e', 'resolve', '12345');
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('e', 'resolve', '-');
INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
VALUES ('e', 'resolve', 'resolvers."Named Lookup"');
UPDATE idempotency.endpoints SET resolver = 'public.no_such_lookup(text,text,text)'
WHERE endpoint = 'named';
\set VERBOSITY terse
SELECT pg_temp.put('t1', 'named', 'n1', 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00');
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE object LIKE 'named%' ORDER BY kind, object;
ALTER FUNCTION resolvers."Named Lookup"(text, text, text) RENAME TO renamed_lookup;
SELECT pg_temp.put('t1', 'named', 'n2', 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00');
-- editing what is not the resolver keeps the name, which names nothing now
UPDATE idempotency.endpoints SET ttl = '1 day' WHERE endpoint = 'named';
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE object LIKE 'named%' ORDER BY kind, object;
SELECT key, state FROM idempotency.keys WHERE endpoint = 'named' ORDER BY key;
ALTER FUNCTION resolvers.renamed_lookup(text, text, text) RENAME TO "Named Lookup";
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE object LIKE 'named%' ORDER BY kind, object;
SELECT key, state FROM idempotency.keys WHERE endpoint = 'named' ORDER BY key;
DROP FUNCTION resolvers."Named Lookup"(text, text, text);
SELECT pg_temp.put('t1', 'named', 'n3', 'in_progress', '2030-02-03 00:00+00', '2030-01-28 00:00+00');
SELECT kind, object, rows FROM idempotency.idem_maintenance('2030-01-29 00:00+00', preview => false)
WHERE object LIKE 'named%' ORDER BY kind, object;
SELECT key, state FROM idempotency.keys WHERE endpoint = 'named' ORDER BY key;
DELETE FROM idempotency.keys WHERE endpoint = 'named';
DELETE FROM idempotency.endpoints WHERE endpoint LIKE 'named%';
DROP SCHEMA resolvers;

-- With the core's own functions: a claim in lease mode whose holder vanished.
-- Once maintenance saw the lease expire, a duplicate gets outcome_pending
-- instead of running the operation a second time.
SELECT action, lease_token IS NOT NULL AS has_token
FROM idempotency.idem_claim('t9', 'pay', 'leased-claim', decode(repeat('cd', 32), 'hex'),
                            lease => '1 minute');
SELECT action, error_code FROM idempotency.idem_claim('t9', 'pay', 'leased-claim',
                                                      decode(repeat('cd', 32), 'hex'));
SELECT kind, object, rows FROM idempotency.idem_maintenance(now() + interval '2 minutes', preview => false)
WHERE kind LIKE 'lease%';
SELECT state FROM idempotency.keys WHERE tenant = 't9';
-- the warning's hash is the one idem_key_hash gives
SELECT idempotency.idem_key_hash('t9', 'pay', 'leased-claim');
SELECT action, http_status, error_code FROM idempotency.idem_claim('t9', 'pay', 'leased-claim',
                                                                   decode(repeat('cd', 32), 'hex'));

-- A pass as of a future time would drop keys and mark leases unknown that
-- are live now: unless told preview => false, it only reports what it would
-- do (lease_resolve for the keys an endpoint's resolver would be asked
-- about) and changes nothing.
SELECT action FROM idempotency.idem_claim('t9', 'pay', 'live-lease', decode(repeat('ef', 32), 'hex'),
                                          lease => '1 minute');
BEGIN;
SELECT action FROM idempotency.idem_claim('t9', 'pay', 'live-done', decode(repeat('ef', 32), 'hex'),
                                          ttl => '1 hour');
SELECT idempotency.idem_finish('t9', 'pay', 'live-done', 201, '{"id": 1}');
COMMIT;
SELECT kind, object, rows FROM idempotency.idem_maintenance(now() + interval '2 hours')
WHERE kind LIKE 'lease%' ORDER BY kind, object;
SELECT count(*) FILTER (WHERE kind = 'drop') > 0 AS would_drop,
       count(*) FILTER (WHERE kind = 'busy') AS busy
FROM idempotency.idem_maintenance(now() + interval '2 days', preview => true);
SELECT key, state FROM idempotency.keys WHERE tenant = 't9' AND key LIKE 'live%' ORDER BY key;
SELECT action, http_status FROM idempotency.idem_claim('t9', 'pay', 'live-done',
                                                       decode(repeat('ef', 32), 'hex'));
-- a preview as of now finds nothing stale
SELECT kind, object, rows FROM idempotency.idem_maintenance(preview => true)
WHERE kind LIKE 'lease%';

-- as_of is range-checked
\set VERBOSITY sqlstate
SELECT * FROM idempotency.idem_maintenance('infinity');
SELECT * FROM idempotency.idem_maintenance('294000-01-01 00:00+00');
SELECT * FROM idempotency.idem_maintenance('0044-03-15 00:00+00 BC');
SELECT * FROM idempotency.idem_maintenance('9000-01-01 00:00+00', preview => true);
SELECT * FROM idempotency.idem_maintenance(NULL);
\set VERBOSITY default
SELECT * FROM idempotency.idem_maintenance('294000-01-01 00:00+00');
SELECT * FROM idempotency.idem_maintenance(NULL);
\set VERBOSITY terse

-- DROP EXTENSION removes the dated partitions with everything else
DROP EXTENSION idempotency;
SELECT count(*) AS partitions_left FROM pg_class WHERE relname LIKE 'keys_p%';
DROP FUNCTION public.find_payment(text, text, text);
CREATE EXTENSION idempotency CASCADE;
