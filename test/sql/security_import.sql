--
-- Security round 3, item 5: idem_import_keys stores nothing a claim and a
-- finish would not.  Each bad row is tried as a role that holds only
-- idempotency_admin (the lowest role that may import), and is refused with
-- an error naming its element and column; nothing of an import with a bad
-- row is written.  Sensitive headers are dropped, as a finish drops them.
--
\getenv abs_srcdir PG_ABS_SRCDIR
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;

\i :abs_srcdir/include/helpers.sql

DO $$ BEGIN CREATE ROLE si_admin NOLOGIN IN ROLE idempotency_admin;
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

-- a good row to start from: a completed key, exported, then deleted (the
-- "other database")
BEGIN;
SELECT action FROM idempotency.idem_claim('si-a', 'pay', 'si-base', regress.fp('1'));
SELECT idempotency.idem_finish('si-a', 'pay', 'si-base', 201, '{"id": 1}', '{"Content-Type": "application/json"}');
COMMIT;
CREATE TABLE si_base AS SELECT e AS doc FROM idempotency.idem_export_keys('si-a') e;
DELETE FROM idempotency.keys WHERE tenant = 'si-a';
GRANT SELECT ON si_base TO si_admin;

-- what an import answers for one changed copy of the good row (a key of
-- its own for each change, so that each case stands alone)
CREATE FUNCTION si_try(change jsonb, verbosity text DEFAULT 'detail') RETURNS text
LANGUAGE sql AS $$
    SELECT regress.try(pg_catalog.format(
        'SELECT idempotency.idem_import_keys(%L::jsonb)',
        (SELECT doc || jsonb_build_object('key', 'si-bad-' || left(md5(change::text), 12)) || change
         FROM si_base)), verbosity)
$$;
GRANT EXECUTE ON FUNCTION si_try(jsonb, text) TO si_admin;

SET ROLE si_admin;

-- a header value with CR/LF (response splitting), or another control character
SELECT si_try('{"response_headers": {"X-A": "a\r\nSet-Cookie: sid=evil"}}');
SELECT si_try('{"response_headers": {"X-A": ["ok", "b\nc"]}}');
SELECT si_try('{"response_headers": {"X-A": "a\u0001b"}}');
-- a header name that is no HTTP token, a value that is no string
SELECT si_try('{"response_headers": {"Set-Cookie ": "sid=1"}}');
SELECT si_try('{"response_headers": {"X-A": 1}}');
SELECT si_try('{"response_headers": ["X-A", "b"]}');
-- a status that is no HTTP status; a completed key without one
SELECT si_try('{"response_status": 99999}');
SELECT si_try('{"response_status": 99}');
SELECT si_try('{"response_status": null}');
-- a body over idempotency.max_response_bytes (256 kB by default)
SELECT si_try(jsonb_build_object('body_kind', 'bytes',
    'response_body', '\x' || repeat('78', 300 * 1024)));
SELECT si_try(jsonb_build_object('response_body',
    '\x' || encode(convert_to('"' || repeat('x', 300 * 1024) || '"', 'UTF8'), 'hex')));
-- fingerprints of 0, 1 and 66 bytes, and none
SELECT si_try('{"fingerprint": "\\x"}');
SELECT si_try('{"fingerprint": "\\x01"}');
SELECT si_try(jsonb_build_object('fingerprint', '\x' || repeat('ab', 66)));
SELECT si_try('{"fingerprint": null}');
-- the claim's scope checks: 300-character endpoint and tenant, an empty
-- endpoint, a key outside its alphabet or too long
SELECT si_try(jsonb_build_object('endpoint', repeat('e', 300)));
SELECT si_try(jsonb_build_object('tenant', repeat('t', 300)));
SELECT si_try('{"endpoint": ""}');
SELECT si_try('{"key": "bad key!"}');
SELECT si_try(jsonb_build_object('key', repeat('k', 256)));
-- created_at after expires_at: far off (the detail shows both), and
-- within idempotency.max_ttl from now (without the detail, which shows
-- the times)
SELECT si_try('{"created_at": "2030-01-02 00:00:00+00", "expires_at": "2030-01-01 00:00:00+00"}');
SELECT si_try(jsonb_build_object('created_at', now() + interval '2 days',
                                 'expires_at', now() + interval '1 day'), 'terse');
-- a json body that is not JSON (every replay would fail with 22P02)
SELECT si_try(jsonb_build_object('response_body',
    '\x' || encode(convert_to('{"id": 1', 'UTF8'), 'hex')));
-- a body that does not agree with its body_kind; an unknown state
SELECT si_try('{"body_kind": "ref", "body_ref": ""}');
SELECT si_try('{"body_kind": null}');
SELECT si_try('{"body_kind": "json", "response_body": null}');
SELECT si_try('{"state": "done"}');
-- an "encrypted" body this database has no key for: no replay could read it
SELECT si_try('{"body_encrypted": true}');

-- nothing half-written: a good element before a bad one is not kept, and
-- the error names the bad one (element 2)
SELECT regress.try($$SELECT idempotency.idem_import_keys((SELECT jsonb_build_array(
    doc || '{"key": "si-good1"}', doc || '{"key": "si-good2", "response_status": 99999}') FROM si_base))$$);
RESET ROLE;
SELECT count(*) AS nothing_written FROM idempotency.keys WHERE tenant = 'si-a';
SET ROLE si_admin;

-- Set-Cookie and Authorization are dropped, as idem_finish drops them: not
-- stored, not replayed; the other headers stay
SELECT * FROM idempotency.idem_import_keys((SELECT doc || jsonb_build_object('key', 'si-cookie',
    'response_headers', '{"Set-Cookie": "sid=1", "authorization": "Bearer t", "Proxy-Authorization": "x", "X-Kept": "yes"}'::jsonb)
    FROM si_base));
SELECT response_status, response_headers, convert_from(response_body, 'UTF8') AS body
FROM idempotency.idem_claim('si-a', 'pay', 'si-cookie', regress.fp('1'));

-- a good import still works, and replays as the finish stored it
SELECT * FROM idempotency.idem_import_keys((SELECT jsonb_agg(doc) FROM si_base));
SELECT action, response_status, response_headers, convert_from(response_body, 'UTF8') AS body
FROM idempotency.idem_claim('si-a', 'pay', 'si-base', regress.fp('1'));
-- and run again, it changes nothing
SELECT * FROM idempotency.idem_import_keys((SELECT jsonb_agg(doc) FROM si_base));

-- the check itself is the import's alone: no role but the owner runs it
SELECT regress.try($$SELECT idempotency.idem_import_check(1, NULL::idempotency.keys)$$);
RESET ROLE;
SELECT r AS role, has_function_privilege(r, 'idempotency.idem_import_check(bigint, idempotency.keys)', 'EXECUTE') AS may_execute
FROM unnest(ARRAY['public', 'idempotency_client', 'idempotency_admin']) r;

DELETE FROM idempotency.keys WHERE tenant = 'si-a';
DROP FUNCTION si_try(jsonb, text);
DROP TABLE si_base;
DROP ROLE si_admin;
