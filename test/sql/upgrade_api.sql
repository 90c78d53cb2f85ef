--
-- ALTER EXTENSION idempotency UPDATE from the previous release (0.3.0), as
-- running applications see it: every function of that release keeps its
-- OID (a session that looked it up, or a plan that calls it, still finds
-- it: "cache lookup failed for function" otherwise), its arguments and its
-- result type, the columns of a row type it returns included (a statement
-- prepared as SELECT * FROM idem_claim(...) fails with "cached plan must not
-- change result type" otherwise).  Statements prepared before the update
-- run after it in the same session.  (test/t/081_update_under_load.pl does
-- the same under pgbench.)
--
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idempotency CASCADE;
CREATE EXTENSION idempotency VERSION '0.3.0' CASCADE;
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- What an application depends on, per function: its OID, name and
-- arguments (names and defaults included: calls name them), its result,
-- and the columns of the row type it returns, if it returns one.
CREATE FUNCTION pg_temp.idem_api()
RETURNS TABLE (oid oid, signature text, result text, result_columns text)
LANGUAGE sql AS $$
    SELECT p.oid, p.proname || '(' || pg_get_function_arguments(p.oid) || ')',
           pg_get_function_result(p.oid),
           (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '
                              ORDER BY a.attnum)
            FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
            WHERE t.oid = p.prorettype AND a.attnum > 0 AND NOT a.attisdropped)
    FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
$$;
CREATE TEMP TABLE idem_api_before AS SELECT * FROM pg_temp.idem_api();
SELECT count(*) >= 30 AS functions_recorded,
       count(*) FILTER (WHERE result_columns IS NOT NULL) >= 1 AS row_types_recorded
FROM idem_api_before;

-- Statements an application prepared before the update, with plans kept
-- across executions.
SET plan_cache_mode = force_generic_plan;
PREPARE claim_atomic(text) AS
    SELECT * FROM idempotency.idem_claim('acme', 'POST /api', $1, sha256(convert_to($1, 'UTF8')));
PREPARE claim_lease(text) AS
    SELECT * FROM idempotency.idem_claim('acme', 'POST /api', $1, sha256(convert_to($1, 'UTF8')),
                                         lease => interval '1 hour');
PREPARE finish(text, bigint) AS
    SELECT idempotency.idem_finish('acme', 'POST /api', $1, 201, jsonb_build_object('key', $1),
                                   lease_token => $2);
PREPARE lookup(text) AS
    SELECT * FROM idempotency.idem_lookup('acme', 'POST /api', $1);
-- before the update: an atomic key completed, a lease claimed
BEGIN;
EXECUTE claim_atomic('api-1') \gset
SELECT :'action' AS action;
EXECUTE finish('api-1', NULL);
COMMIT;
EXECUTE claim_lease('api-2') \gset
SELECT :'action' AS action, :'lease_token' <> '' AS lease_token_given;
\set token_2 :lease_token
EXECUTE lookup('api-2') \gset
SELECT :'state' AS state, :'lease_held' AS lease_held;

ALTER EXTENSION idempotency UPDATE;
SELECT extversion <> '0.3.0' AS updated FROM pg_extension WHERE extname = 'idempotency';

-- the same statements, in the same session, after it
EXECUTE claim_atomic('api-1') \gset
SELECT :'action' AS action, :'response_status' AS status, :'response_json' AS body;
EXECUTE finish('api-2', :token_2);
EXECUTE claim_lease('api-2') \gset
SELECT :'action' AS action, :'response_status' AS status, :'response_json' AS body;
BEGIN;
EXECUTE claim_atomic('api-3') \gset
SELECT :'action' AS action;
EXECUTE finish('api-3', NULL);
COMMIT;
EXECUTE claim_atomic('api-3') \gset
SELECT :'action' AS action, :'response_json' AS body;
EXECUTE lookup('api-3') \gset
SELECT :'state' AS state, :'response_status' AS status;
RESET plan_cache_mode;

-- Every function of 0.3.0 is still there, under the same OID, with the
-- same arguments and result: none listed.
CREATE TEMP VIEW idem_api_changes AS
SELECT 'gone' AS change, b.signature AS function, b.result || coalesce(' (' || b.result_columns || ')', '') AS before,
       NULL AS after
FROM idem_api_before b
WHERE NOT EXISTS (SELECT 1 FROM pg_temp.idem_api() a WHERE a.oid = b.oid)
UNION ALL
SELECT 'changed', b.signature, b.result || coalesce(' (' || b.result_columns || ')', ''),
       a.signature || ' ' || a.result || coalesce(' (' || a.result_columns || ')', '')
FROM idem_api_before b JOIN pg_temp.idem_api() a USING (oid)
WHERE (a.signature, a.result, a.result_columns) IS DISTINCT FROM (b.signature, b.result, b.result_columns);
SELECT * FROM idem_api_changes ORDER BY 1, 2;

-- the check sees what breaks applications: a function dropped and made
-- again under the same name (as 0.2.0 to 0.3.0 did with idem_claim), a
-- column added to a row type a function returns
BEGIN;
CREATE FUNCTION idempotency.idem_api_probe() RETURNS integer LANGUAGE sql AS 'SELECT 1';
INSERT INTO idem_api_before SELECT * FROM pg_temp.idem_api() WHERE signature = 'idem_api_probe()';
DROP FUNCTION idempotency.idem_api_probe();
CREATE FUNCTION idempotency.idem_api_probe() RETURNS bigint LANGUAGE sql AS 'SELECT 1';
ALTER TYPE idempotency.claim_result ADD ATTRIBUTE probe integer;
SELECT change, left(function, 30) AS function, right(after, 15) AS after_ends
FROM idem_api_changes ORDER BY 1, 2;
ROLLBACK;

DELETE FROM idempotency.keys WHERE endpoint = 'POST /api';
DEALLOCATE ALL;
-- leave a fresh install of the current version for the tests after this one
SET client_min_messages = warning;
DROP EXTENSION idempotency CASCADE;
CREATE EXTENSION idempotency CASCADE;
RESET client_min_messages;
