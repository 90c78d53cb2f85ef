--
-- The outbox (sql/parts/80_outbox.sql, doc/calling.md): operations added
-- in the caller's transaction, leased by senders (SKIP LOCKED), taken over
-- when a lease lapses, their attempts recorded under the lease, given back,
-- put back by an operator; every refused input with its SQLSTATE; a role
-- granted only idempotency_client; tenant binding.  Needs no maintenance
-- pass (the retention is in outbox_retention), so it runs on a server with
-- default settings too.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

SELECT current_user AS su \gset
CREATE ROLE regress_ob_client LOGIN;
GRANT idempotency_client TO regress_ob_client;
CREATE ROLE regress_ob_ops LOGIN;
GRANT idempotency_admin TO regress_ob_ops;
CREATE ROLE regress_ob_acme LOGIN;
GRANT idempotency_client TO regress_ob_acme;
ALTER ROLE regress_ob_acme SET idempotency.tenant = 'acme';
CREATE ROLE regress_ob_globex LOGIN;
GRANT idempotency_client TO regress_ob_globex;
ALTER ROLE regress_ob_globex SET idempotency.tenant = 'globex';

-- what the superuser sees of the outbox (nobody else reads the tables)
CREATE FUNCTION pg_temp.outbox() RETURNS TABLE (key text, tenant text, method text, state text,
    attempts integer, leased boolean, due boolean, last_status integer, last_error text,
    response_status integer, finished boolean)
LANGUAGE sql AS $$
    SELECT CASE WHEN key LIKE 'op-%' THEN key ELSE '(made)' END, tenant, method, state,
           attempts, lease_token IS NOT NULL,
           next_attempt_at <= now(), last_status, last_error, response_status,
           finished_at IS NOT NULL
    FROM idempotency.outbox ORDER BY id
$$;

-- the client's rights: the four functions, no table, no view
SELECT p.proname, has_function_privilege('regress_ob_client', p.oid, 'EXECUTE') AS client,
       has_function_privilege('regress_ob_ops', p.oid, 'EXECUTE') AS admin,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public, p.prosecdef
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proname LIKE 'idem\_outbox\_%'
ORDER BY 1;
SELECT c.relname, has_table_privilege('regress_ob_client', c.oid, 'SELECT') AS client_reads,
       has_table_privilege('regress_ob_ops', c.oid, 'SELECT') AS admin_reads
FROM pg_class c
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relname LIKE 'outbox%' AND c.relkind IN ('r', 'v', 'S')
ORDER BY 1;

SET ROLE regress_ob_client;
SELECT regress.try('SELECT * FROM idempotency.outbox');

-- 1. an add rolled back, with its transaction or its savepoint, is never
-- leased; the add that committed is
BEGIN;
SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/charges', '{"amount": 1}',
                                   key => 'op-rolled-back');
ROLLBACK;
BEGIN;
SAVEPOINT before_add;
SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/charges', '{"amount": 2}',
                                   key => 'op-savepoint');
ROLLBACK TO SAVEPOINT before_add;
SELECT idempotency.idem_outbox_add('post', 'https://pay.example/charges', '{"amount": 3}',
                                   '{"Content-Type": "application/json"}', 'op-1');
COMMIT;
-- leased: in flight, one attempt begun, the key and the request as added
CREATE TEMP TABLE lease1 AS SELECT * FROM idempotency.idem_outbox_lease(10, '1 hour');
SELECT key, method, url, body, headers, attempts, created_at <= now() AS created,
       first_attempt_at = now() AS first_attempt_now
FROM lease1;
SELECT id AS op1, lease_token AS tok1 FROM lease1 \gset
RESET ROLE;
SELECT * FROM pg_temp.outbox();
SELECT key FROM idempotency.outbox WHERE key IN ('op-rolled-back', 'op-savepoint');

-- 2. a second lease does not see what is leased
SET ROLE regress_ob_client;
SELECT count(*) AS leased_again FROM idempotency.idem_outbox_lease(10, '1 hour');

-- 3. a lapsed lease (its sender froze): taken over with the same key and a
-- new token, the lapsed attempt recorded
RESET ROLE;
UPDATE idempotency.outbox SET locked_until = now() - interval '1 second' WHERE id = :op1;
SET ROLE regress_ob_client;
SELECT lease_token AS tok2
FROM idempotency.idem_outbox_lease(10, '1 hour') \gset
SELECT :tok2 <> :tok1 AS new_token;
RESET ROLE;
SELECT * FROM pg_temp.outbox();

-- 4. the old token records nothing and releases nothing
SET ROLE regress_ob_client;
SELECT idempotency.idem_outbox_record(:op1, :tok1, 'succeeded', 201) AS stale_record;
SELECT idempotency.idem_outbox_release(:op1, :tok1) AS stale_release;
SELECT idempotency.idem_outbox_record(-1, :tok1, 'succeeded', 201) AS unknown_id;
RESET ROLE;
SELECT * FROM pg_temp.outbox();

-- 5. retry: pending again, not due before retry_at
SET ROLE regress_ob_client;
SELECT idempotency.idem_outbox_record(:op1, :tok2, 'retry', 503, 'service unavailable',
                                      retry_at => now() + interval '1 hour') AS recorded;
SELECT count(*) AS leased_before_retry_at FROM idempotency.idem_outbox_lease(10, '1 hour');
RESET ROLE;
SELECT * FROM pg_temp.outbox();
UPDATE idempotency.outbox SET next_attempt_at = now() - interval '1 second' WHERE id = :op1;

-- 6. due again: the third attempt succeeds, with its response stored
SET ROLE regress_ob_client;
SELECT lease_token AS tok3, attempts FROM idempotency.idem_outbox_lease(10, '1 hour') \gset
SELECT :attempts AS third_attempt;
SELECT idempotency.idem_outbox_record(:op1, :tok3, 'succeeded', 201,
                                      response_headers => '{"content-type": "application/json"}',
                                      response_body => '{"id": "ch_1"}') AS recorded;
-- finished: recording again, or releasing, changes nothing
SELECT idempotency.idem_outbox_record(:op1, :tok3, 'failed', 500) AS record_finished;
SELECT idempotency.idem_outbox_release(:op1, :tok3) AS release_finished;
SELECT count(*) AS leased_finished FROM idempotency.idem_outbox_lease(10, '1 hour');
RESET ROLE;
SELECT * FROM pg_temp.outbox();
SELECT response_headers, response_body, first_attempt_at <= finished_at AS ordered
FROM idempotency.outbox WHERE id = :op1;
SELECT attempt, outcome, status, error, started_at IS NOT NULL AS started,
       ended_at IS NOT NULL AS ended
FROM idempotency.outbox_attempts WHERE outbox_id = :op1 ORDER BY attempt, outcome;

-- 7. the other outcomes, a release, a key made by the outbox, not_before
SET ROLE regress_ob_client;
SELECT idempotency.idem_outbox_add('PUT', 'http://internal.example/orders/7', 'null', key => 'op-failed');
SELECT idempotency.idem_outbox_add('PATCH', 'https://pay.example/x', '[1, 2]', key => 'op-attention');
SELECT idempotency.idem_outbox_add('DELETE', 'https://pay.example/y', '{}', key => 'op-released');
SELECT idempotency.idem_outbox_add('GET', 'https://pay.example/z', '{}', key => 'op-later',
                                   not_before => now() + interval '1 hour');
SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/charges', '{}') AS made_key \gset
SELECT length(:'made_key') AS made_key_length, idempotency.idem_key_valid(:'made_key') AS valid;
CREATE TEMP TABLE leased AS SELECT * FROM idempotency.idem_outbox_lease(10, '1 hour');
SELECT key = :'made_key' AS made, method, attempts FROM leased ORDER BY id;
SELECT idempotency.idem_outbox_record(l.id, l.lease_token, 'failed', 422, 'key reused with another payload')
FROM leased l WHERE l.key = 'op-failed';
SELECT idempotency.idem_outbox_record(l.id, l.lease_token, 'attention', NULL, 'timeout after 10 attempts')
FROM leased l WHERE l.key = 'op-attention';
SELECT idempotency.idem_outbox_release(l.id, l.lease_token)
FROM leased l WHERE l.key IN ('op-released', :'made_key') ORDER BY l.id;
RESET ROLE;
SELECT * FROM pg_temp.outbox();
SELECT key = :'made_key' AS made, first_attempt_at IS NULL AS first_attempt_cleared
FROM idempotency.outbox WHERE key IN ('op-released', :'made_key') ORDER BY id;

-- 8. an operator puts an operation back (the client may not)
SELECT id AS op_attention FROM idempotency.outbox WHERE key = 'op-attention' \gset
SELECT id AS op_failed FROM idempotency.outbox WHERE key = 'op-failed' \gset
SET ROLE regress_ob_client;
SELECT regress.try(format('SELECT idempotency.idem_outbox_retry(%s)', :op_attention));
SET ROLE regress_ob_ops;
SELECT idempotency.idem_outbox_retry(:op_attention);
SELECT idempotency.idem_outbox_retry(:op_failed);
SELECT regexp_replace(regress.try(format('SELECT idempotency.idem_outbox_retry(%s)', :op1), 'detail'),
                      'operation \d+', 'operation N') AS retry_succeeded;
SELECT regress.try('SELECT idempotency.idem_outbox_retry(-1)', 'detail') AS retry_unknown;
SELECT regress.try('SELECT idempotency.idem_outbox_retry(NULL)') AS retry_null;
SELECT tenant, pending, due, in_flight, lapsed_leases, oldest_pending_age IS NOT NULL AS has_oldest,
       attention, failed, succeeded
FROM idempotency.outbox_health;
RESET ROLE;
SELECT * FROM pg_temp.outbox();
SET ROLE regress_ob_client;
SELECT regress.try('SELECT * FROM idempotency.outbox_health');

-- 9. every refused input, with its SQLSTATE
SELECT regress.try($$SELECT idempotency.idem_outbox_add(NULL, 'https://a.example/', '{}')$$, 'detail') AS method_null;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', NULL, '{}')$$, 'detail') AS url_null;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', NULL)$$, 'detail') AS body_null;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', NULL)$$, 'detail') AS headers_null;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('TRACE', 'https://a.example/', '{}')$$, 'verbose') AS method_trace;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('', 'https://a.example/', '{}')$$) AS method_empty;
SELECT replace(u, E'\n', '\n') AS url, regress.try(format('SELECT idempotency.idem_outbox_add(%L, %L, %L)', 'POST', u, '{}'), 'detail') AS refused
FROM unnest(ARRAY['ftp://a.example/', 'https://', 'https:///path', 'a.example/x',
                  'javascript:alert(1)', 'https://a.example/a b', E'https://a.example/\n']) u;
SELECT h AS headers, regress.try(format('SELECT idempotency.idem_outbox_add(%L, %L, %L, %L)', 'POST', 'https://a.example/', '{}', h), 'detail') AS refused
FROM unnest(ARRAY['[]', '"x"', '{"Idempotency-Key": "k1"}', '{"idempotency-KEY": "k1"}',
                  '{"X-Count": 1}', '{"X-Null": null}', '{"X-A": "a\r\nX-B: b"}',
                  '{"bad name": "x"}', '{"": "x"}']) h;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', '{}', 'bad key!')$$, 'detail') AS key_chars;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', '{}', '')$$) AS key_empty;
SELECT regress.try(format('SELECT idempotency.idem_outbox_add(%L, %L, %L, %L, %L)', 'POST', 'https://a.example/', '{}', '{}', repeat('k', 256))) AS key_too_long;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', '{}', 'op-1')$$, 'verbose') AS key_again;
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', '{}', 'op-1')$$) AS key_again;
SELECT regress.try('SELECT idempotency.idem_outbox_lease(0)') AS lease_none;
SELECT regress.try('SELECT idempotency.idem_outbox_lease(10001)') AS lease_too_many;
SELECT regress.try('SELECT idempotency.idem_outbox_lease(NULL)') AS lease_null;
SELECT regress.try($$SELECT idempotency.idem_outbox_lease(1, '0 seconds')$$, 'verbose') AS lease_zero;
SELECT regress.try($$SELECT idempotency.idem_outbox_lease(1, '-1 second')$$) AS lease_negative;
SELECT regress.try($$SELECT idempotency.idem_outbox_lease(1, '2 days')$$) AS lease_too_long;
SELECT regress.try('SELECT idempotency.idem_outbox_lease(1, NULL)') AS lease_interval_null;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, 1, %L)', :op1, 'done'), 'verbose') AS outcome_unknown;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, 1, %L)', :op1, 'lapsed')) AS outcome_lapsed;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, 1, NULL)', :op1)) AS outcome_null;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, 1, %L, 503)', :op1, 'retry'), 'verbose') AS retry_without_time;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, 1, %L, 42)', :op1, 'failed'), 'verbose') AS status_42;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, 1, %L, 600)', :op1, 'failed')) AS status_600;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, 1, %L, 200, response_headers => %L)', :op1, 'succeeded', '[]')) AS response_headers_array;
SELECT regress.try($$SELECT idempotency.idem_outbox_record(NULL, 1, 'succeeded')$$) AS record_id_null;
SELECT regress.try(format('SELECT idempotency.idem_outbox_record(%s, NULL, %L)', :op1, 'succeeded')) AS record_token_null;
SELECT regress.try('SELECT idempotency.idem_outbox_release(NULL, 1)') AS release_id_null;
SELECT regress.try(format('SELECT idempotency.idem_outbox_release(%s, NULL)', :op1)) AS release_token_null;
-- none of them added or changed anything
RESET ROLE;
SELECT * FROM pg_temp.outbox();

-- 10. bodies are bounded like stored responses (idempotency.max_response_bytes):
-- a larger request body is refused, a larger response body is cut on a
-- character boundary
SET idempotency.max_response_bytes = 100;
SET ROLE regress_ob_client;
SELECT regress.try(format('SELECT idempotency.idem_outbox_add(%L, %L, %L)', 'POST', 'https://a.example/',
                          jsonb_build_object('memo', repeat('x', 100))), 'detail') AS body_too_large;
SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', jsonb_build_object('memo', repeat('x', 80)),
                                   key => 'op-big');
SELECT id AS op_big, lease_token AS tok_big FROM idempotency.idem_outbox_lease(10, '1 hour')
WHERE key = 'op-big' \gset
SELECT idempotency.idem_outbox_record(:op_big, :tok_big, 'succeeded', 200,
                                      response_body => repeat('é', 51) || 'tail',
                                      error => repeat('e', 3000)) AS recorded;
RESET ROLE;
RESET idempotency.max_response_bytes;
SELECT octet_length(response_body) AS body_bytes, response_body = repeat('é', 50) AS cut_on_character,
       length(last_error) AS error_chars
FROM idempotency.outbox WHERE id = :op_big;

-- 11. tenant binding: a bound session adds under its tenant, and leases,
-- records and releases only its tenant's operations
DELETE FROM idempotency.outbox;
\c - regress_ob_acme
SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/charges', '{"t": "acme"}', key => 'shared-key');
\c - regress_ob_globex
SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/charges', '{"t": "globex"}', key => 'shared-key');
SELECT regress.try($$SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/charges', '{}', key => 'shared-key')$$) AS same_tenant_again;
SELECT id AS g_id, lease_token AS g_tok, body AS g_body FROM idempotency.idem_outbox_lease(10, '1 hour') \gset
SELECT :'g_body' AS globex_leased;
\c - :su
SELECT id AS a_id FROM idempotency.outbox WHERE tenant = 'acme' \gset
-- acme's operation leased by an unbound sender, which sees every tenant
UPDATE idempotency.outbox SET state = 'in_flight', lease_token = 7, locked_until = now() + interval '1 hour',
    attempts = 1 WHERE id = :a_id;
\c - regress_ob_globex
SELECT regexp_replace(regress.try(format('SELECT idempotency.idem_outbox_record(%s, 7, %L, 201)', :a_id, 'succeeded'), 'verbose'),
                      'operation \d+', 'operation N') AS record_other_tenant;
SELECT regexp_replace(regress.try(format('SELECT idempotency.idem_outbox_release(%s, 7)', :a_id), 'detail'),
                      'operation \d+', 'operation N') AS release_other_tenant;
SELECT idempotency.idem_outbox_record(:g_id, :g_tok, 'succeeded', 201) AS record_own;
\c - :su
UPDATE idempotency.outbox SET state = 'pending', lease_token = NULL, locked_until = NULL,
    attempts = 0 WHERE id = :a_id;
\c - regress_ob_acme
SELECT key, body FROM idempotency.idem_outbox_lease(10, '1 hour');
\c - regress_ob_ops
SELECT tenant, pending, in_flight, succeeded FROM idempotency.outbox_health;
\c - :su
SELECT key, tenant, state, attempts FROM idempotency.outbox ORDER BY id;

-- 12. two senders do not lease the same operation: the first lease's
-- transaction holds its rows, the second skips them (the isolation spec
-- iso_outbox races them); here in one session, the rows of a lease
-- rolled back are due again
DELETE FROM idempotency.outbox;
SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', key => k)
FROM unnest(ARRAY['r1', 'r2', 'r3']) k;
BEGIN;
SELECT key, attempts FROM idempotency.idem_outbox_lease(2, '1 hour');
ROLLBACK;
SELECT key, attempts FROM idempotency.idem_outbox_lease(10, '1 hour');

-- 13. the caller's settings do not reach the functions, which run as the
-- owner with a pinned search_path: an = operator of the caller's that
-- would match every row is never used (it would say so)
DELETE FROM idempotency.outbox;
CREATE SCHEMA regress_ob_evil;
CREATE FUNCTION regress_ob_evil.texteq(text, text) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'the caller''s = operator was used'; RETURN true; END $$;
CREATE OPERATOR regress_ob_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = regress_ob_evil.texteq);
GRANT USAGE ON SCHEMA regress_ob_evil TO regress_ob_client;
SET ROLE regress_ob_client;
SET search_path = regress_ob_evil, pg_catalog, public;
SELECT 'a' = 'b' AS callers_operator_in_effect;
SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', key => k)
FROM unnest(ARRAY['e1', 'e2']) k;
SELECT id AS e_id, lease_token AS e_tok FROM idempotency.idem_outbox_lease(1, '1 hour') \gset
SELECT idempotency.idem_outbox_record(:e_id, :e_tok, 'failed', 400) AS recorded;
SELECT idempotency.idem_outbox_release(:e_id, :e_tok) AS released_finished;
RESET search_path;
RESET ROLE;
SELECT key, state, attempts FROM idempotency.outbox ORDER BY id;
DROP SCHEMA regress_ob_evil CASCADE;

-- 14. the view outbox_operations: what an operator reads to find the id
-- that idem_outbox_retry takes, never a key, a body or headers; refused to
-- a client; a session bound to a tenant sees its tenant's operations alone
DELETE FROM idempotency.outbox;
CREATE ROLE regress_ob_acme_ops LOGIN;
GRANT idempotency_admin TO regress_ob_acme_ops;
ALTER ROLE regress_ob_acme_ops SET idempotency.tenant = 'acme';
\c - regress_ob_acme
SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/charges', '{"secret": "acme-body"}',
                                   '{"Authorization": "Bearer acme"}', key => 'key-acme') IS NOT NULL AS added;
\c - regress_ob_globex
SELECT idempotency.idem_outbox_add('PUT', 'https://pay.example/globex', '{"secret": "globex-body"}',
                                   key => 'key-globex') IS NOT NULL AS added;
\c - :su
SELECT idempotency.idem_outbox_add('DELETE', 'https://pay.example/unbound', '{}', key => k) IS NOT NULL AS added
FROM unnest(ARRAY['key-unbound', 'key-lapsed']) k;
UPDATE idempotency.outbox SET state = 'attention', finished_at = now(), attempts = 5,
    first_attempt_at = now(), last_status = 503, last_error = 'attempts ran out'
WHERE key = 'key-acme';
UPDATE idempotency.outbox SET state = 'in_flight', lease_token = 9, attempts = 1,
    first_attempt_at = now(), leased_at = now() - interval '2 hours',
    locked_until = now() - interval '1 hour'
WHERE key = 'key-lapsed';
-- attempts of acme's and globex's operations, as senders record them
INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, started_at, ended_at, status, error, outcome)
SELECT o.id, a.n, now(), now(), a.status, a.error, a.outcome
FROM idempotency.outbox o,
     (VALUES ('key-acme', 1, 503, NULL, 'retry'), ('key-acme', 2, NULL, 'timeout', 'attention'),
             ('key-globex', 1, 429, NULL, 'retry')) AS a(key, n, status, error, outcome)
WHERE o.key = a.key;
-- its columns: no key, body nor headers
SELECT string_agg(attname, ', ' ORDER BY attnum) AS columns FROM pg_attribute
WHERE attrelid = 'idempotency.outbox_operations'::regclass AND attnum > 0;
\c - regress_ob_ops
SELECT o.tenant, o.method, o.url, o.state, o.attempts, o.lease_lapsed, o.last_status, o.last_error,
       o.next_attempt_at IS NOT NULL AS has_next, o.locked_until IS NOT NULL AS locked,
       o.created_at IS NOT NULL AS has_created, o.first_attempt_at IS NOT NULL AS attempted,
       o.finished_at IS NOT NULL AS finished
FROM idempotency.outbox_operations o ORDER BY o.id;
SELECT regress.try('SELECT key FROM idempotency.outbox_operations') AS no_key;
-- the attempts, for an operator: every tenant's to an unbound session
SELECT o.tenant, a.attempt, a.outcome, a.status, a.error, a.started_at IS NOT NULL AS started
FROM idempotency.outbox_operation_attempts a JOIN idempotency.outbox_operations o USING (id)
ORDER BY a.id, a.attempt, a.outcome;
SELECT count(*) AS rows_naming_a_secret FROM idempotency.outbox_operations o
WHERE o::text ~ 'key-|body|Bearer';
-- the operator finds what needs attention and puts it back by its id
SELECT idempotency.idem_outbox_retry(id) FROM idempotency.outbox_operations WHERE state = 'attention';
SELECT tenant, state, attempts, finished_at IS NULL AS unfinished
FROM idempotency.outbox_operations WHERE tenant = 'acme';
\c - regress_ob_client
SELECT regress.try('SELECT * FROM idempotency.outbox_operations') AS client;
SELECT regress.try('SELECT * FROM idempotency.outbox_operation_attempts') AS client_attempts;
\c - regress_ob_acme
SELECT regress.try('SELECT * FROM idempotency.outbox_operations') AS bound_client;
-- bound to acme: acme's operations alone, also through a function of the
-- caller's in the WHERE clause, which the barrier runs after the view's
-- own condition
\c - regress_ob_acme_ops
SELECT tenant, method, state FROM idempotency.outbox_operations ORDER BY id;
-- and outbox_health its row alone
SELECT tenant, pending + due + in_flight + attention + failed + succeeded > 0 AS counted
FROM idempotency.outbox_health;
-- and outbox_operation_attempts its operations' attempts alone
SELECT tenant, count(*) > 0 AS has_attempts FROM idempotency.outbox_operation_attempts GROUP BY tenant;
CREATE FUNCTION pg_temp.peek(t text, u text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS
$$ BEGIN RAISE NOTICE 'peeked at % %', coalesce(t, 'NULL'), u; RETURN true; END $$;
SELECT count(*) AS seen FROM idempotency.outbox_operations o WHERE pg_temp.peek(o.tenant, o.url);
\c - :su
SELECT key, tenant, state FROM idempotency.outbox ORDER BY id;

DELETE FROM idempotency.outbox;
DROP ROLE regress_ob_client, regress_ob_ops, regress_ob_acme, regress_ob_globex, regress_ob_acme_ops;
