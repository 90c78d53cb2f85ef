--
-- Moving a tenant's keys between databases: idem_export_keys and
-- idem_import_keys.  The "other database" is this one with the tenant's
-- rows deleted in between.
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;

\i :abs_srcdir/include/helpers.sql

-- the tenant's keys: completed (atomic), in progress under a lease, failed;
-- and one of another tenant
BEGIN;
SELECT action FROM idempotency.idem_claim('xf-a', 'pay', 'k-done', regress.fp('1'));
SELECT idempotency.idem_finish('xf-a', 'pay', 'k-done', 201, '{"id": 1}');
COMMIT;
SELECT action, lease_token IS NOT NULL AS leased
FROM idempotency.idem_claim('xf-a', 'pay', 'k-lease', regress.fp('2'), lease => '1 hour');
SELECT lease_token AS token
FROM idempotency.keys WHERE tenant = 'xf-a' AND key = 'k-lease' \gset
SELECT action FROM idempotency.idem_claim('xf-a', 'ship', 'k-fail', regress.fp('3'), lease => '1 hour');
SELECT idempotency.idem_fail('xf-a', 'ship', 'k-fail', 'failed', 'carrier down',
    (SELECT lease_token FROM idempotency.keys WHERE tenant = 'xf-a' AND key = 'k-fail'));
BEGIN;
SELECT action FROM idempotency.idem_claim('xf-b', 'pay', 'k-done', regress.fp('9'), ttl => '2 days');
SELECT idempotency.idem_finish('xf-b', 'pay', 'k-done', 200);
COMMIT;

-- the export: the tenant's live keys only, in (endpoint, key) order, every column
CREATE TEMP TABLE xf_export AS
SELECT row_number() OVER () AS n, e AS doc FROM idempotency.idem_export_keys('xf-a') e;
SELECT n, doc->>'endpoint' AS endpoint, doc->>'key' AS key, doc->>'state' AS state,
       doc->>'response_status' AS status, (doc->>'lease_token') IS NOT NULL AS leased
FROM xf_export ORDER BY n;
SELECT count(*) = (SELECT count(*) FROM idempotency.keys WHERE tenant = 'xf-a') AS all_exported,
       bool_and(doc ?& ARRAY['fingerprint', 'expires_at', 'created_at', 'response_body', 'locked_until'])
           AS every_column
FROM xf_export;

-- imported where they are already: nothing changes, whatever the repetition
SELECT * FROM idempotency.idem_import_keys((SELECT jsonb_agg(doc ORDER BY n) FROM xf_export));

-- "another database": the rows are gone, the import writes them back as they were
CREATE TEMP TABLE xf_before AS
SELECT to_jsonb(k) AS doc FROM idempotency.keys k WHERE tenant = 'xf-a';
DELETE FROM idempotency.keys WHERE tenant = 'xf-a';
SELECT * FROM idempotency.idem_import_keys((SELECT jsonb_agg(doc ORDER BY n) FROM xf_export));
SELECT (SELECT count(*) FROM xf_before) AS rows_before,
       count(*) AS rows_after,
       count(*) FILTER (WHERE b.doc = to_jsonb(k)) AS identical_rows
FROM idempotency.keys k
LEFT JOIN xf_before b ON b.doc->>'key' = k.key AND b.doc->>'endpoint' = k.endpoint
WHERE k.tenant = 'xf-a';
-- and run twice, it changes nothing
SELECT * FROM idempotency.idem_import_keys((SELECT jsonb_agg(doc ORDER BY n) FROM xf_export));
-- one object alone is accepted too
SELECT * FROM idempotency.idem_import_keys((SELECT doc FROM xf_export WHERE n = 1));

-- the imported keys behave as before the move: a retry replays, the lease
-- token still finishes, the failed key stays pending
SELECT action, response_status, convert_from(response_body, 'UTF8') AS body
FROM idempotency.idem_claim('xf-a', 'pay', 'k-done', regress.fp('1'));
SELECT action FROM idempotency.idem_claim('xf-a', 'pay', 'k-lease', regress.fp('2'));
SELECT idempotency.idem_finish('xf-a', 'pay', 'k-lease', 200, '{"ok": true}', lease_token => :token);
SELECT action, response_status FROM idempotency.idem_claim('xf-a', 'pay', 'k-lease', regress.fp('2'));
SELECT action, error_code FROM idempotency.idem_claim('xf-a', 'ship', 'k-fail', regress.fp('3'));

-- a live key with other content is never overwritten: the in-progress copy
-- of k-lease differs from the completed row now
SELECT regress.try($$SELECT idempotency.idem_import_keys(
    (SELECT jsonb_agg(doc ORDER BY n) FROM xf_export))$$);
SELECT state, response_status FROM idempotency.keys WHERE tenant = 'xf-a' AND key = 'k-lease';
-- unless told to keep what is here: counted, left alone
SELECT * FROM idempotency.idem_import_keys(
    (SELECT jsonb_agg(doc ORDER BY n) FROM xf_export), on_conflict => 'keep');
SELECT state, response_status FROM idempotency.keys WHERE tenant = 'xf-a' AND key = 'k-lease';

-- an expired key is skipped; one whose expired row is still stored replaces it
SELECT * FROM idempotency.idem_import_keys((SELECT doc || '{"key": "k-old", "created_at": "2000-12-31 00:00:00+00", "completed_at": "2000-12-31 00:00:01+00", "expires_at": "2001-01-01 00:00:00+00"}'
                                           FROM xf_export WHERE n = 1));
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
WHERE tenant = 'xf-a' AND key = 'k-done';
SELECT * FROM idempotency.idem_import_keys((SELECT doc FROM xf_export WHERE n = 1));
SELECT count(*) AS rows, bool_and(to_jsonb(k) - 'request_digest' = (SELECT doc FROM xf_export WHERE n = 1)) AS as_exported
FROM idempotency.keys k WHERE tenant = 'xf-a' AND key = 'k-done';

-- malformed input
SELECT regress.try($$SELECT idempotency.idem_export_keys('')$$);
SELECT regress.try($$SELECT idempotency.idem_export_keys(NULL)$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys(NULL)$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys('"x"')$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys('[1]')$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys('[]', on_conflict => 'replace')$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys('{"tenant": "xf-a", "endpoint": "pay"}')$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys(
    (SELECT doc - 'expires_at' || '{"key": "k-new"}' FROM xf_export WHERE n = 1))$$);
SELECT * FROM idempotency.idem_import_keys('[]');

-- expires_at infinite (either sign), or later than idempotency.max_ttl
-- (7 days here) from now, is refused (22023), naming the element; nothing
-- of the import stays
SELECT regress.try($$SELECT idempotency.idem_import_keys(
    (SELECT jsonb_build_array(doc || '{"key": "k-fine"}', doc || '{"key": "k-inf", "expires_at": "infinity"}') FROM xf_export WHERE n = 1))$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys(
    (SELECT doc || '{"key": "k-inf", "expires_at": "-infinity"}' FROM xf_export WHERE n = 1))$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys(
    (SELECT doc || jsonb_build_object('key', 'k-far', 'expires_at', now() + interval '7 days 1 second') FROM xf_export WHERE n = 1))$$);
SELECT count(*) AS nothing_imported FROM idempotency.keys WHERE key IN ('k-fine', 'k-inf', 'k-far');
-- at the limit: imported
SELECT * FROM idempotency.idem_import_keys(
    (SELECT doc || jsonb_build_object('key', 'k-far', 'expires_at', now() + interval '7 days') FROM xf_export WHERE n = 1));
-- a request_digest in the JSON is dropped: digests are keyed with the
-- source database's secret (and the export leaves them out)
SELECT * FROM idempotency.idem_import_keys(
    (SELECT doc || '{"key": "k-digest", "request_digest": "\\x0102030405060708090a"}' FROM xf_export WHERE n = 1));
SELECT key, request_digest IS NULL AS digest_dropped FROM idempotency.keys
WHERE tenant = 'xf-a' AND key IN ('k-far', 'k-digest') ORDER BY key;
DELETE FROM idempotency.keys WHERE tenant = 'xf-a' AND key IN ('k-far', 'k-digest');

-- the import reads with a statement snapshot: READ COMMITTED only
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT regress.try($$SELECT idempotency.idem_import_keys('[]')$$);
ROLLBACK;

-- admins only
SELECT has_function_privilege('idempotency_admin', 'idempotency.idem_export_keys(text)', 'EXECUTE') AS admin_export,
       has_function_privilege('idempotency_admin', 'idempotency.idem_import_keys(jsonb, text)', 'EXECUTE') AS admin_import,
       has_function_privilege('idempotency_client', 'idempotency.idem_export_keys(text)', 'EXECUTE') AS client_export,
       has_function_privilege('idempotency_client', 'idempotency.idem_import_keys(jsonb, text)', 'EXECUTE') AS client_import,
       has_function_privilege('public', 'idempotency.idem_import_keys(jsonb, text)', 'EXECUTE') AS public_import;

-- a session bound to a tenant exports and imports that tenant only (last:
-- the binding lasts as long as the session)
SET idempotency.tenant = 'xf-b';
SELECT count(*) AS own_keys FROM idempotency.idem_export_keys('xf-b');
SELECT regress.try($$SELECT idempotency.idem_export_keys('xf-a')$$);
SELECT regress.try($$SELECT idempotency.idem_import_keys((SELECT doc FROM xf_export WHERE n = 1))$$);
