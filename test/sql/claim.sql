--
-- The claim/finish protocol: every action and every error.
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
SET client_min_messages = warning;

\i :abs_srcdir/include/helpers.sql

-- the short form of a claim's answer
CREATE FUNCTION claim(tenant text, endpoint text, key text, body text,
                      ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
                      wait interval DEFAULT NULL)
RETURNS TABLE (action text, http_status int, error_code text, replayed boolean,
               body text, has_token boolean)
LANGUAGE sql AS $$
    SELECT c.action, c.http_status, c.error_code, c.replayed,
           convert_from(c.response_body, 'UTF8'), c.lease_token IS NOT NULL
    FROM idempotency.idem_claim(tenant, endpoint, key, regress.fp(body), ttl, lease, wait) c
$$;

--
-- Keys, tenants, endpoints and fingerprints are checked first.
--
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', NULL, regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', '', regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', repeat('a', 256), regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'has space', regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k.1', regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'kéy', regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim(NULL, 'e', 'k', regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', '', 'k', regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim(repeat('t', 256), 'e', 'k', regress.fp('x'))$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', NULL)$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', '\x0102')$$);
-- the key is checked before the rest
SELECT regress.try($$SELECT idempotency.idem_claim(NULL, NULL, 'bad key', NULL)$$);
-- nothing was stored by any of them
SELECT count(*) AS rows_after_bad_input FROM idempotency.keys;

-- well-formed keys: UUID, ULID, base64url, 255 characters
BEGIN;
SELECT action FROM claim('t', 'e', '0190a0b4-7c1e-7d2a-9f00-1c2d3e4f5a6b', 'x');
SELECT action FROM claim('t', 'e', '01J0Z8Q4ZK7X9T2V3W4Y5A6B7C', 'x');
SELECT action FROM claim('t', 'e', 'q80tWbS_cX-3aZ9kLm2nOw', 'x');
SELECT action FROM claim('t', 'e', repeat('k', 255), 'x');
ROLLBACK;
SELECT idempotency.idem_key_valid(k) AS valid, length(k)
FROM unnest(ARRAY['abc', '', NULL, repeat('z', 255), repeat('z', 256), 'a/b', 'A-Z_09']) AS k;

--
-- Atomic mode: claim, business write and finish in one transaction.
--
CREATE TABLE payments (id text PRIMARY KEY, tenant text, amount numeric, key text);

BEGIN;
SELECT * FROM claim('acme', 'POST /payments', 'k-1', 'amount=4200');
INSERT INTO payments VALUES ('pay_1', 'acme', 4200, 'k-1');
SELECT idempotency.idem_finish('acme', 'POST /payments', 'k-1', 201,
    '{"id": "pay_1", "amount": 4200}', '{"Content-Type": "application/json"}');
COMMIT;

-- the retry replays status, headers and body
SELECT action, http_status, response_status, response_headers,
       convert_from(response_body, 'UTF8') AS body, response_json, replayed,
       lease_token, expires_at > now() AS live
FROM idempotency.idem_claim('acme', 'POST /payments', 'k-1', regress.fp('amount=4200'));

-- the finish can ride in the business insert's RETURNING clause (the README
-- shows it): one statement less, the same completed key
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-1r', 'amount=4300');
INSERT INTO payments VALUES ('pay_1r', 'acme', 4300, 'k-1r')
RETURNING id, idempotency.idem_finish('acme', 'POST /payments', key, 201, '{"id": "pay_1r"}');
COMMIT;
SELECT action, response_status, response_json
FROM idempotency.idem_claim('acme', 'POST /payments', 'k-1r', regress.fp('amount=4300'));

-- same key, other request: 422, and the row is untouched
SELECT * FROM claim('acme', 'POST /payments', 'k-1', 'amount=42000');
SELECT state, response_status FROM idempotency.idem_lookup('acme', 'POST /payments', 'k-1');

-- the same key under another tenant or endpoint is another operation
BEGIN;
SELECT action FROM claim('globex', 'POST /payments', 'k-1', 'amount=42000');
SELECT action FROM claim('acme', 'POST /refunds', 'k-1', 'amount=42000');
ROLLBACK;

-- committing a claim neither finished nor released is an error at commit
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-2', 'a');
INSERT INTO payments VALUES ('pay_2', 'acme', 1, 'k-2');
COMMIT;
SELECT count(*) AS business_rows_of_k2 FROM payments WHERE key = 'k-2';
SELECT count(*) AS key_rows_of_k2 FROM idempotency.idem_lookup('acme', 'POST /payments', 'k-2');

-- a rollback gives the key back
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-3', 'a');
ROLLBACK;
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-3', 'a');
-- a duplicate inside the same transaction is in progress
SELECT action, http_status, error_code FROM claim('acme', 'POST /payments', 'k-3', 'a');
SELECT state, lease_held FROM idempotency.idem_lookup('acme', 'POST /payments', 'k-3');
SELECT idempotency.idem_finish('acme', 'POST /payments', 'k-3', 200);
-- finishing twice is refused
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /payments', 'k-3', 200)$$);
ROLLBACK;

-- a claim in a rolled-back savepoint is gone with it
BEGIN;
SAVEPOINT s1;
SELECT action FROM claim('acme', 'POST /payments', 'k-4', 'a');
ROLLBACK TO SAVEPOINT s1;
COMMIT;
-- a claim in a released savepoint still needs its finish
BEGIN;
SAVEPOINT s1;
SELECT action FROM claim('acme', 'POST /payments', 'k-4', 'a');
RELEASE SAVEPOINT s1;
SELECT regress.try($$SELECT idempotency.idem_finish_bytes('acme', 'POST /payments', 'k-4', 202, '\x00ff'::bytea)$$);
COMMIT;
SELECT action, http_status, response_body, response_json, response_headers
FROM idempotency.idem_claim('acme', 'POST /payments', 'k-4', regress.fp('a'));

-- a body kept elsewhere: the replay returns the reference
BEGIN;
SELECT action FROM claim('acme', 'POST /exports', 'x-1', 'a');
SELECT idempotency.idem_finish_ref('acme', 'POST /exports', 'x-1', 200,
    's3://exports/x-1.csv', '{"Content-Type": "text/csv"}');
COMMIT;
SELECT action, http_status, response_body, response_body_ref
FROM idempotency.idem_claim('acme', 'POST /exports', 'x-1', regress.fp('a'));
SELECT regress.try($$SELECT idempotency.idem_finish_ref('acme', 'POST /exports', 'x-2', 200, '')$$);

-- release: the next claim executes
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-5', 'a');
SELECT idempotency.idem_release('acme', 'POST /payments', 'k-5');
COMMIT;
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-5', 'a');
ROLLBACK;

-- fail: duplicates get outcome_pending, never a second execution
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-6', 'a');
SELECT idempotency.idem_fail('acme', 'POST /payments', 'k-6', 'unknown', 'card network timed out');
COMMIT;
SELECT * FROM claim('acme', 'POST /payments', 'k-6', 'a');
-- a different request with the key is still a mismatch, whatever the state
SELECT action, http_status FROM claim('acme', 'POST /payments', 'k-6', 'b');
SELECT regress.try($$SELECT idempotency.idem_fail('acme', 'POST /payments', 'k-6', 'maybe')$$);
-- an operator reconciles it
SELECT idempotency.idem_resolve('acme', 'POST /payments', 'k-6', 201, '{"id": "pay_6"}');
SELECT action, http_status, response_json
FROM idempotency.idem_claim('acme', 'POST /payments', 'k-6', regress.fp('a'));
SELECT regress.try($$SELECT idempotency.idem_resolve('acme', 'POST /payments', 'k-6', 201, '{}')$$);
SELECT regress.try($$SELECT idempotency.idem_resolve('acme', 'POST /payments', 'nope', 201, '{}')$$);

--
-- Lease mode: the claim commits an in_progress row and a token.
--
SELECT lease_token AS token, action
FROM idempotency.idem_claim('acme', 'POST /charges', 'c-1', regress.fp('c'), lease => '30 s') \gset
SELECT :'action' AS action, :token > 0 AS has_token;
SELECT state, lease_held, locked_until > now() AS leased
FROM idempotency.idem_lookup('acme', 'POST /charges', 'c-1');
-- a duplicate gets 409 with the time left on the lease
SELECT action, http_status, error_code, retry_after BETWEEN 1 AND 30 AS retry_after_ok
FROM idempotency.idem_claim('acme', 'POST /charges', 'c-1', regress.fp('c'));
-- waiting briefly does not change that while the lease holder runs
SELECT action FROM claim('acme', 'POST /charges', 'c-1', 'c', wait => '50 ms');
-- finishing needs the token
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /charges', 'c-1', 201)$$);
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /charges', 'c-1', 201, lease_token => 12345)$$);
SELECT regress.try($$SELECT idempotency.idem_heartbeat('acme', 'POST /charges', 'c-1', 12345, '1 min')$$);
SELECT idempotency.idem_heartbeat('acme', 'POST /charges', 'c-1', :token, '1 min') > now() + '50 s' AS extended;
SELECT regress.try(format($$SELECT idempotency.idem_heartbeat('acme', 'POST /charges', 'c-1', %s, '2 days')$$, :token));
SELECT idempotency.idem_finish('acme', 'POST /charges', 'c-1', 201, '{"charge": "ch_1"}', lease_token => :token);
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /charges', 'c-1', regress.fp('c'));
SELECT regress.try(format($$SELECT idempotency.idem_finish('acme', 'POST /charges', 'c-1', 201, lease_token => %s)$$, :token));

-- unknown, then a late finish with the right token completes it
SELECT lease_token AS token FROM idempotency.idem_claim('acme', 'POST /charges', 'c-2', regress.fp('c'), lease => '30 s') \gset
SELECT idempotency.idem_fail('acme', 'POST /charges', 'c-2', lease_token => :token);
SELECT action, error_code FROM claim('acme', 'POST /charges', 'c-2', 'c');
SELECT idempotency.idem_finish('acme', 'POST /charges', 'c-2', 200, '"late"', lease_token => :token);
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /charges', 'c-2', regress.fp('c'));

-- release with the token gives the key back
SELECT lease_token AS token FROM idempotency.idem_claim('acme', 'POST /charges', 'c-3', regress.fp('c'), lease => '30 s') \gset
SELECT regress.try($$SELECT idempotency.idem_release('acme', 'POST /charges', 'c-3')$$);
SELECT idempotency.idem_release('acme', 'POST /charges', 'c-3', :token);
SELECT action, has_token FROM claim('acme', 'POST /charges', 'c-3', 'c', lease => '30 s');
-- the old token is stale now
SELECT regress.try(format($$SELECT idempotency.idem_finish('acme', 'POST /charges', 'c-3', 200, lease_token => %s)$$, :token));

-- endpoint policy supplies ttl and lease
INSERT INTO idempotency.endpoints (endpoint, ttl, lease) VALUES ('POST /transfers', '2 hours', '1 minute');
SELECT action, lease_token IS NOT NULL AS leased,
       expires_at BETWEEN now() + '119 minutes' AND now() + '121 minutes' AS ttl_from_policy
FROM idempotency.idem_claim('acme', 'POST /transfers', 't-1', regress.fp('t'));
SELECT locked_until BETWEEN now() + '50 s' AND now() + '70 s' AS lease_from_policy
FROM idempotency.idem_lookup('acme', 'POST /transfers', 't-1');
UPDATE idempotency.endpoints SET lease = NULL WHERE endpoint = 'POST /transfers';
BEGIN;
SELECT action, lease_token IS NOT NULL AS leased FROM idempotency.idem_claim('acme', 'POST /transfers', 't-2', regress.fp('t'));
SELECT idempotency.idem_finish('acme', 'POST /transfers', 't-2', 204);
COMMIT;

--
-- Lifetimes.
--
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', regress.fp('x'), ttl => '8 days')$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', regress.fp('x'), ttl => '-1 s')$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', regress.fp('x'), ttl => '10 s', lease => '1 min')$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', regress.fp('x'), lease => '0 s')$$);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', regress.fp('x'), wait => '-1 s')$$);
SET idempotency.max_ttl = '10d';
SELECT action FROM claim('acme', 'POST /payments', 'long', 'x', ttl => '8 days', lease => '1 s');
RESET idempotency.max_ttl;

-- an expired key is invisible at once and a claim starts afresh (without
-- tombstones; with them, see the test tombstones)
SET idempotency.tombstone_ttl = 0;
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'short', 'x', ttl => '1 s');
SELECT idempotency.idem_finish('acme', 'POST /payments', 'short', 201, '"first"');
COMMIT;
SELECT action FROM claim('acme', 'POST /payments', 'short', 'x');
SELECT pg_sleep(1.2);
SELECT count(*) AS visible FROM idempotency.idem_lookup('acme', 'POST /payments', 'short');
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'short', 'other request');
SELECT idempotency.idem_finish('acme', 'POST /payments', 'short', 201, '"second"');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /payments', 'short', regress.fp('other request'));
SELECT count(*) AS rows_of_short FROM idempotency.keys WHERE key = 'short';
RESET idempotency.tombstone_ttl;

--
-- Finishing what was never claimed, or someone else's key.
--
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /payments', 'never', 200)$$);
SELECT regress.try($$SELECT idempotency.idem_finish('globex', 'POST /charges', 'c-1', 200, lease_token => 1)$$);
SELECT regress.try($$SELECT idempotency.idem_fail('acme', 'POST /payments', 'never')$$);
SELECT regress.try($$SELECT idempotency.idem_release('acme', 'POST /payments', 'never')$$);
SELECT count(*) AS other_tenant_sees FROM idempotency.idem_lookup('globex', 'POST /charges', 'c-1');
BEGIN;
SELECT action FROM claim('acme', 'POST /payments', 'k-7', 'a');
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /payments', 'k-7', 99)$$);
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /payments', 'k-7', NULL)$$);
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /payments', 'k-7', 200, NULL, '[1, 2]')$$);
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /payments', 'k-7', 200, lease_token => 5)$$);
SELECT idempotency.idem_release('acme', 'POST /payments', 'k-7');
COMMIT;

-- the functions do not leak: nothing but the extension writes the table
SELECT state, count(*) FROM idempotency.keys GROUP BY state ORDER BY state;
