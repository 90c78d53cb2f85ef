--
-- Mismatch diagnostics: a claim of a reused key with another request says
-- which members differ (claim_result.mismatch), from the request digests
-- (idem_request_digest) kept with the key, which hold keyed hashes of the
-- members and never their values.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
-- Keys are compared here many times over, to show the comparison: the
-- bound on diagnosed mismatches per key (diagnostics_bound.sql) is raised.
SET idempotency.diagnostics_max_mismatches = 1000;
CREATE SCHEMA diag_test;
SET search_path = diag_test, public;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

CREATE FUNCTION body_fp(body jsonb, path text DEFAULT '/pay') RETURNS bytea
LANGUAGE sql AS $$ SELECT idempotency.idem_fingerprint('POST', path, body) $$;

CREATE FUNCTION dg(k text, body jsonb, ep text DEFAULT 'POST /pay', path text DEFAULT '/pay')
RETURNS bytea
LANGUAGE sql AS $$ SELECT idempotency.idem_request_digest('t', ep, k, body, 'POST', path) $$;

-- the first request: claimed with its digest and finished
CREATE FUNCTION first(k text, body jsonb, ep text DEFAULT 'POST /pay') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r idempotency.claim_result;
BEGIN
    r := idempotency.idem_claim('t', ep, k, body_fp(body), digest => dg(k, body, ep));
    IF r.action = 'execute' THEN
        PERFORM idempotency.idem_finish('t', ep, k, 201, '{"id": 1}');
    END IF;
    RETURN r.action;
END $$;

-- a retry: its action and what the claim says differs
CREATE FUNCTION again(k text, body jsonb, ep text DEFAULT 'POST /pay', path text DEFAULT '/pay')
RETURNS TABLE (action text, http_status int, mismatch jsonb)
LANGUAGE sql AS $$
    SELECT action, http_status, mismatch
    FROM idempotency.idem_claim('t', ep, k, body_fp(body, path), digest => dg(k, body, ep, path))
$$;

CREATE FUNCTION stored(k text, ep text DEFAULT 'POST /pay') RETURNS bytea
LANGUAGE sql AS $$
    SELECT request_digest FROM idempotency.keys
    WHERE tenant = 't' AND endpoint = ep AND key = k AND expires_at > now()
$$;

SELECT coalesce((SELECT diagnosed FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked), 0)
    AS diagnosed_before \gset

-- changed, added and removed members; the same request replays
SELECT first('k1', '{"amount": 1000, "currency": "EUR", "metadata": {"trace_id": "a1", "order": 7}}');
SELECT * FROM again('k1', '{"amount": 2000, "currency": "EUR", "metadata": {"order": 7}, "note": "x"}');
SELECT * FROM again('k1', '{"currency": "EUR", "amount": 1e3, "metadata": {"order": 7.0, "trace_id": "a1"}}');
-- a value's type is a change of the member
SELECT * FROM again('k1', '{"amount": "1000", "currency": "EUR", "metadata": {"trace_id": "a1", "order": 7}}');
SELECT * FROM again('k1', '{"amount": 1000, "currency": "EUR", "metadata": [1]}');
-- the digest is kept with the key; a retry never changes it
SELECT stored('k1') = dg('k1', '{"amount": 1000, "currency": "EUR", "metadata": {"trace_id": "a1", "order": 7}}') AS kept;

-- nested arrays: an element's member, an element added, one removed
SELECT first('k2', '{"items": [{"sku": "a"}, {"sku": "b"}, {"sku": "c", "qty": 1}]}');
SELECT * FROM again('k2', '{"items": [{"sku": "a"}, {"sku": "b"}, {"sku": "X", "qty": 1}]}');
SELECT * FROM again('k2', '{"items": [{"sku": "a"}, {"sku": "b"}, {"sku": "c", "qty": 1}, {"sku": "d"}]}');
SELECT * FROM again('k2', '{"items": [{"sku": "a"}, {"sku": "b"}]}');
-- a reordered array: each element in another place differs
SELECT * FROM again('k2', '{"items": [{"sku": "b"}, {"sku": "a"}, {"sku": "c", "qty": 1}]}');

-- names as JSON Pointer tokens: ~ and / escaped, quotes and non-ASCII as they are
SELECT first('k3', '{"a/b": 1, "m~n": 1, "q\"": 1, "ü": 1, "t\nx": 1}');
SELECT * FROM again('k3', '{"a/b": 2, "m~n": 2, "q\"": 2, "ü": 2, "t\nx": 2}');

-- method and path: compared when both digests have them
SELECT * FROM again('k1', '{"amount": 1000, "currency": "EUR", "metadata": {"trace_id": "a1", "order": 7}}',
                    path => '/pay/other');
-- no body against a body: the whole document ("")
SELECT first('k4', NULL);
SELECT * FROM again('k4', '{"amount": 1}');
SELECT * FROM again('k4', NULL, path => '/x');

-- exclusions: what the fingerprint leaves out, the digest leaves out too
SELECT idempotency.idem_request_digest('t', 'POST /pay', 'k5', '{"a": 1, "ts": 1}', exclude => '{/ts}')
     = idempotency.idem_request_digest('t', 'POST /pay', 'k5', '{"a": 1, "ts": 2}', exclude => '{/ts}') AS excluded_member_ignored;

-- No value can be recovered from a digest.  It holds names and keyed
-- hashes: the same body under two keys shares no hash, and the hash of the
-- member /amount depends on the database's secret, so whoever reads stored
-- digests cannot test guesses of the amount without the secret.  In
-- '{"amount": 1000}' with method and path, /amount's hash is at bytes 46-53.
CREATE FUNCTION amount_hash(k text, amount int) RETURNS bytea
LANGUAGE sql AS $$ SELECT substring(dg(k, jsonb_build_object('amount', amount)) FROM 46 FOR 8) $$;
SELECT length(dg('k6', '{"amount": 1000}')) AS digest_bytes,
       position('\x31303030'::bytea IN dg('k6', '{"amount": 1000}')) AS value_bytes_at,
       amount_hash('k6', 1000) = amount_hash('k6', 1000) AS same_key_same_hash,
       amount_hash('k6', 1000) <> amount_hash('k7', 1000) AS other_key_other_hash,
       amount_hash('k6', 1000) <> amount_hash('k6', 1001) AS other_amount_other_hash,
       substring(dg('k6', '{"amount": 1000}') FROM 2 FOR 8)
           <> substring(dg('k7', '{"amount": 1000}') FROM 2 FOR 8) AS other_scope_tag;
-- the whole digest of one body under two keys has no 8-byte hash in common
WITH d AS (SELECT dg('k6', '{"a": 1, "b": [1, 2], "c": {"d": true}}') AS x,
                  dg('k7', '{"a": 1, "b": [1, 2], "c": {"d": true}}') AS y)
SELECT count(*) AS shared_hashes
FROM d, generate_series(11, length(x) - 7) i, generate_series(11, length(y) - 7) j
WHERE substring(x FROM i FOR 8) = substring(y FROM j FOR 8);
-- the hash moves with the secret (here changed, then put back)
CREATE TEMP TABLE saved AS SELECT secret, amount_hash('k6', 1000) AS h FROM idempotency.diagnostics_secret;
UPDATE idempotency.diagnostics_secret SET secret = sha256('another secret');
SELECT amount_hash('k6', 1000) <> (SELECT h FROM saved) AS hash_follows_secret;
-- a stored digest made under another secret compares with nothing
SELECT * FROM again('k1', '{"amount": 2000}');
UPDATE idempotency.diagnostics_secret SET secret = (SELECT secret FROM saved);
SELECT amount_hash('k6', 1000) = (SELECT h FROM saved) AS hash_back;
SELECT (mismatch IS NOT NULL) AS diagnosed_again FROM again('k1', '{"amount": 2000}');

-- Limits.  Depth: members are listed down to depth 8; a difference deeper
-- is reported at depth 8, truncated.
SELECT first('k8', '{"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": 1, "b": {"c": 1}}}}}}}}}');
SELECT * FROM again('k8', '{"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": 2, "b": {"c": 1}}}}}}}}}');
SELECT * FROM again('k8', '{"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": 1, "b": {"c": 2}}}}}}}}}');
-- count: 256 members are listed, 257 are summarised by their container
SET idempotency.diagnostics_max_bytes = 65536;
SELECT first('k9', (SELECT jsonb_object_agg('m' || i, i) FROM generate_series(1, 256) i));
SELECT * FROM again('k9', (SELECT jsonb_object_agg('m' || i, CASE i WHEN 200 THEN 0 ELSE i END) FROM generate_series(1, 256) i));
SELECT first('k10', (SELECT jsonb_object_agg('m' || i, i) FROM generate_series(1, 257) i));
SELECT * FROM again('k10', (SELECT jsonb_object_agg('m' || i, CASE i WHEN 200 THEN 0 ELSE i END) FROM generate_series(1, 257) i));
-- bytes: a digest of exactly idempotency.diagnostics_max_bytes is whole;
-- one byte less and the deepest level goes
CREATE TEMP TABLE big AS
SELECT jsonb_build_object('list', (SELECT jsonb_agg(jsonb_build_object('sku', 's' || i, 'qty', i))
                                  FROM generate_series(1, 20) i), 'amount', 5) AS body;
SELECT length(dg('k11', body)) AS full_bytes FROM big \gset
SELECT set_config('idempotency.diagnostics_max_bytes', :'full_bytes', false) IS NOT NULL AS set;
SELECT length(dg('k11', body)) = :full_bytes AS whole_at_limit FROM big;
SELECT first('k11', body) FROM big;
SELECT a.* FROM big, again('k11', jsonb_set(body, '{list,3,qty}', '0')) a;
SELECT set_config('idempotency.diagnostics_max_bytes', (:full_bytes - 1)::text, false) IS NOT NULL AS set;
SELECT length(dg('k12', body)) < :full_bytes AS coarser_past_limit FROM big;
SELECT first('k12', body) FROM big;
SELECT a.* FROM big, again('k12', jsonb_set(body, '{list,3,qty}', '0')) a;
-- at the smallest setting only the root and the top level fit, or the root alone
SET idempotency.diagnostics_max_bytes = 64;
SELECT length(dg('k13', body)) <= 64 AS fits FROM big;
SELECT first('k13', body) FROM big;
SELECT a.* FROM big, again('k13', jsonb_set(body, '{list,3,qty}', '0')) a;
SELECT split_part(regress.try($$SET idempotency.diagnostics_max_bytes = 63$$), ':', 1) AS sqlstate;  -- the message differs by version
SELECT split_part(regress.try($$SET idempotency.diagnostics_max_bytes = 65537$$), ':', 1) AS sqlstate;  -- the message differs by version
-- a digest larger than the setting at claim time is not kept
SET idempotency.diagnostics_max_bytes = 65536;
CREATE TEMP TABLE bigdigest AS SELECT dg('k14', body) AS d FROM big;
SET idempotency.diagnostics_max_bytes = 64;
BEGIN;
SELECT action FROM big, bigdigest, idempotency.idem_claim('t', 'POST /pay', 'k14', body_fp(body), digest => d);
SELECT idempotency.idem_finish('t', 'POST /pay', 'k14', 201);
COMMIT;
SELECT stored('k14') IS NULL AS not_kept;
RESET idempotency.diagnostics_max_bytes;

-- An endpoint with diagnostics off: no digest is made, kept or compared.
INSERT INTO idempotency.endpoints (endpoint, diagnostics) VALUES ('POST /quiet', false);
SELECT dg('q1', '{"a": 1}', 'POST /quiet') IS NULL AS no_digest;
SELECT first('q1', '{"a": 1}', 'POST /quiet');
SELECT stored('q1', 'POST /quiet') IS NULL AS none_kept;
SELECT * FROM again('q1', '{"a": 2}', 'POST /quiet');
-- a digest given anyway is ignored, not even checked
SELECT action, mismatch FROM idempotency.idem_claim('t', 'POST /quiet', 'q1', body_fp('{"a": 3}'), digest => '\x00');
-- turned off after a key kept its digest: not compared any more
SELECT first('q2', '{"a": 1}', 'POST /later');
INSERT INTO idempotency.endpoints (endpoint, diagnostics) VALUES ('POST /later', false);
SELECT stored('q2', 'POST /later') IS NOT NULL AS kept_before;
SELECT action, mismatch FROM idempotency.idem_claim('t', 'POST /later', 'q2', body_fp('{"a": 2}'),
                                                    digest => dg('q2', '{"a": 2}'));

-- NULL digests: nothing kept, nothing compared
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'n1', body_fp('{"a": 1}'), digest => NULL);
SELECT idempotency.idem_finish('t', 'POST /pay', 'n1', 201);
COMMIT;
SELECT stored('n1') IS NULL AS none_kept;
SELECT * FROM again('n1', '{"a": 2}');
SELECT action, mismatch FROM idempotency.idem_claim('t', 'POST /pay', 'k1', body_fp('{"a": 2}'));

-- Malformed digests are refused (IK400) before anything is locked or read.
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'POST /pay', 'm1', diag_test.body_fp('{}'), digest => '\x')$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'POST /pay', 'm1', diag_test.body_fp('{}'), digest => '\x02000000000000000000')$$);
SELECT regress.try(format('SELECT idempotency.idem_claim(%L, %L, %L, diag_test.body_fp(%L), digest => %L)', 't', 'POST /pay', 'm1', '{}',
               substring(dg('m1', '{"a": [1, 2]}') FROM 1 FOR 40)));
SELECT regress.try(format('SELECT idempotency.idem_claim(%L, %L, %L, diag_test.body_fp(%L), digest => %L)', 't', 'POST /pay', 'm1', '{}',
               dg('m1', '{"a": [1, 2]}') || '\x00'::bytea));
-- longer than any digest made here (64kB)
SELECT regress.try(format('SELECT idempotency.idem_claim(%L, %L, %L, diag_test.body_fp(%L), digest => %L)', 't', 'POST /pay', 'm1', '{}',
               dg('m1', '{}') || decode(repeat('00', 65536), 'hex')));
-- an entry flagged as a member of an array under an object
SELECT regress.try(format('SELECT idempotency.idem_claim(%L, %L, %L, diag_test.body_fp(%L), digest => %L)', 't', 'POST /pay', 'm1', '{}',
               overlay(dg('m1', '{"a": 1}') PLACING '\x0102'::bytea FROM 37 FOR 2)));
-- member names that are not UTF-8, or hold NUL, in place of a name of the
-- same length (the first member's name starts at byte 40): refused too,
-- before any member is read
SELECT n AS forged_name,
       regress.try(format('SELECT idempotency.idem_claim(%L, %L, %L, diag_test.body_fp(%L), digest => %L)', 't', 'POST /pay', 'm1', '{}',
                  overlay(dg('m1', jsonb_build_object(repeat('x', length(n)), 1)) PLACING n FROM 40 FOR length(n))))
FROM (VALUES ('\xfffe'::bytea), ('\x610062'), ('\xc3'), ('\xeda080'), ('\x5c7530303030'), ('\x5c7564383030')) AS v(n);
-- such a digest stored with a key (written there by hand: no claim keeps
-- one) is not compared: a reuse of the key gets its 422, mismatch NULL
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at, request_digest)
VALUES ('t', 'POST /pay', 'm-forged', body_fp('{"a": 1}'), 'completed', now(), now() + interval '1 hour',
        overlay(dg('m-forged', '{"xy": 1}') PLACING '\xfffe'::bytea FROM 40 FOR 2));
SELECT * FROM again('m-forged', '{"xy": 2}');
DELETE FROM idempotency.keys WHERE key = 'm-forged';
-- a digest made for another key, endpoint or tenant
SELECT regress.try(format('SELECT idempotency.idem_claim(%L, %L, %L, diag_test.body_fp(%L), digest => %L)', 't', 'POST /pay', 'm1', '{}',
               dg('m2', '{}')));
SELECT regress.try(format('SELECT idempotency.idem_claim(%L, %L, %L, diag_test.body_fp(%L), digest => %L)', 't', 'POST /pay', 'm1', '{}',
               idempotency.idem_request_digest('u', 'POST /pay', 'm1', '{}')));
SELECT count(*) AS nothing_claimed FROM idempotency.idem_lookup('t', 'POST /pay', 'm1');
-- the digest function checks its scope as every function does
SELECT regress.try($$SELECT idempotency.idem_request_digest('t', 'POST /pay', 'bad key', '{}')$$);
SELECT regress.try($$SELECT idempotency.idem_request_digest('t', 'POST /pay', 'ok', '{}', exclude => '{nope}')$$);

-- Savepoints and exception blocks: the digest kept is the claim's that committed.
BEGIN;
SAVEPOINT a;
SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 's1', body_fp('{"v": 1}'), digest => dg('s1', '{"v": 1}'));
ROLLBACK TO a;
SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 's1', body_fp('{"v": 2}'), digest => dg('s1', '{"v": 2}'));
SAVEPOINT b;
SELECT idempotency.idem_finish('t', 'POST /pay', 's1', 201);
ROLLBACK TO b;
SELECT idempotency.idem_finish('t', 'POST /pay', 's1', 201);
COMMIT;
SELECT stored('s1') = dg('s1', '{"v": 2}') AS second_claims_digest;
SELECT * FROM again('s1', '{"v": 1}');
DO $$
BEGIN
    PERFORM idempotency.idem_claim('t', 'POST /pay', 's2', diag_test.body_fp('{"v": 1}'),
                                   digest => diag_test.dg('s2', '{"v": 1}'));
    PERFORM idempotency.idem_finish('t', 'POST /pay', 's2', 201);
    RAISE EXCEPTION 'handler failed';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'caught: %', SQLERRM;
END $$;
SELECT stored('s2') IS NULL AS nothing_kept;
SELECT first('s2', '{"v": 3}');
SELECT * FROM again('s2', '{"v": 1}');

-- Lease mode: the digest is kept by the claim's row, and compared while in progress.
SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'l1', body_fp('{"v": 1}'), lease => '1 minute',
                                          digest => dg('l1', '{"v": 1}'));
SELECT stored('l1') = dg('l1', '{"v": 1}') AS kept_at_claim;
SELECT * FROM again('l1', '{"v": 1, "w": 2}');

-- The secret is the extension owner's: no client or operator reads it.
CREATE ROLE regress_diag_app LOGIN IN ROLE idempotency_client;
CREATE ROLE regress_diag_ops LOGIN IN ROLE idempotency_admin;
GRANT USAGE ON SCHEMA diag_test TO regress_diag_app, regress_diag_ops;
SET ROLE regress_diag_app;
SELECT regress.try($$SELECT secret FROM idempotency.diagnostics_secret$$);
SELECT regress.try($$SELECT request_digest FROM idempotency.keys$$);
SELECT * FROM diag_test.again('k1', '{"amount": 3000}');
RESET ROLE;
SET ROLE regress_diag_ops;
SELECT regress.try($$SELECT secret FROM idempotency.diagnostics_secret$$);
SELECT regress.try($$UPDATE idempotency.diagnostics_secret SET secret = sha256('x')$$);
-- an export leaves the digest out
SELECT bool_or(doc ? 'request_digest') AS exported_digest, count(*) > 0 AS exported
FROM idempotency.idem_export_keys('t') doc;
RESET ROLE;
REVOKE USAGE ON SCHEMA diag_test FROM regress_diag_app, regress_diag_ops;
DROP ROLE regress_diag_app;
DROP ROLE regress_diag_ops;

-- counted: every mismatch above that named what differs
SELECT diagnosed - :diagnosed_before AS diagnosed
FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked;

DELETE FROM idempotency.endpoints WHERE endpoint IN ('POST /quiet', 'POST /later');
DELETE FROM idempotency.keys WHERE tenant IN ('t', 'u');
DROP SCHEMA diag_test CASCADE;

-- a session bound to a tenant gets no digest for another (IK401); last,
-- since the binding lasts as long as the session
SET idempotency.tenant = 'acme';
DO $$
BEGIN
    PERFORM idempotency.idem_request_digest('t', 'POST /pay', 'k1', '{}');
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE '%: %', SQLSTATE, SQLERRM;
END $$;
SELECT length(idempotency.idem_request_digest('acme', 'POST /pay', 'k1', '{}')) > 0 AS own_tenant;
