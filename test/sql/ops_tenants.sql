--
-- Tenant isolation, as a login role granted only idempotency_client: two
-- tenants use the same key; nothing of one is returned, changed or revealed
-- to the other, and another tenant's key looks exactly like a key that does
-- not exist.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

CREATE ROLE regress_idem_tenant_app LOGIN;
GRANT idempotency_client TO regress_idem_tenant_app;
SET ROLE regress_idem_tenant_app;

-- the same key for two tenants: two independent operations
SELECT action AS acme_action, lease_token AS acme_token
FROM idempotency.idem_claim('acme', 'POST /pay', 'same-key', regress.fp('acme body'),
                            lease => interval '1 hour') \gset
SELECT :'acme_action' AS acme_action, :acme_token > 0 AS acme_has_token;
-- (a duplicate of acme's claim gets no token: in progress)
SELECT action, lease_token IS NULL AS no_token
FROM idempotency.idem_claim('acme', 'POST /pay', 'same-key', regress.fp('acme body'));
-- globex, same key, other request: executes, is not a 422
SELECT action, http_status, lease_token <> :acme_token AS own_token
FROM idempotency.idem_claim('globex', 'POST /pay', 'same-key', regress.fp('globex body'),
                            lease => interval '1 hour');
-- it is not a 409 either while acme's is in progress (atomic claim)
BEGIN;
SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'same-key-2', regress.fp('x'));
SELECT idempotency.idem_finish('globex', 'POST /pay', 'same-key-2', 201, '{"tenant": "globex"}');
COMMIT;
SELECT action, http_status
FROM idempotency.idem_claim('acme', 'POST /pay', 'same-key-2', regress.fp('x'),
                            lease => interval '1 hour');

-- only the tenant's own replay comes back
SELECT action, response_json
FROM idempotency.idem_claim('globex', 'POST /pay', 'same-key-2', regress.fp('x'));

-- acme's leased claim cannot be finished, failed, released or extended by
-- globex, with or without a token, nor from another endpoint: each answer
-- is exactly that of a key that was never claimed
SELECT regress.try($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'never-claimed', 200, lease_token => 42)$$, 'verbose') AS never_claimed;
SELECT regress.try($$SELECT idempotency.idem_finish('nobody', 'POST /pay', 'same-key', 200, lease_token => 42)$$, 'verbose')
     = regress.try($$SELECT idempotency.idem_finish('nobody', 'POST /pay', 'never-claimed', 200, lease_token => 42)$$, 'verbose')
       AS finish_same_as_missing;
SELECT regress.try($$SELECT idempotency.idem_finish('acme', 'POST /refund', 'same-key', 200, lease_token => 42)$$, 'verbose')
     = regress.try($$SELECT idempotency.idem_finish('acme', 'POST /refund', 'never-claimed', 200, lease_token => 42)$$, 'verbose')
       AS other_endpoint_same_as_missing;
SELECT regress.try($$SELECT idempotency.idem_finish_bytes('nobody', 'POST /pay', 'same-key', 200, '\x00', lease_token => 42)$$, 'verbose')
     = regress.try($$SELECT idempotency.idem_finish_bytes('nobody', 'POST /pay', 'never-claimed', 200, '\x00', lease_token => 42)$$, 'verbose')
       AS finish_bytes_same_as_missing;
SELECT regress.try($$SELECT idempotency.idem_fail('nobody', 'POST /pay', 'same-key', 'failed', lease_token => 42)$$, 'verbose')
     = regress.try($$SELECT idempotency.idem_fail('nobody', 'POST /pay', 'never-claimed', 'failed', lease_token => 42)$$, 'verbose')
       AS fail_same_as_missing;
SELECT regress.try($$SELECT idempotency.idem_release('nobody', 'POST /pay', 'same-key', 42)$$, 'verbose')
     = regress.try($$SELECT idempotency.idem_release('nobody', 'POST /pay', 'never-claimed', 42)$$, 'verbose')
       AS release_same_as_missing;
SELECT regress.try($$SELECT idempotency.idem_heartbeat('nobody', 'POST /pay', 'same-key', 42, interval '1 hour')$$, 'verbose')
     = regress.try($$SELECT idempotency.idem_heartbeat('nobody', 'POST /pay', 'never-claimed', 42, interval '1 hour')$$, 'verbose')
       AS heartbeat_same_as_missing;
-- globex's own row with acme's token is refused, and stays in progress
SELECT regress.try(format($$SELECT idempotency.idem_finish('globex', 'POST /pay', 'same-key', 200, lease_token => %s)$$,
                              :acme_token), 'verbose') AS finish_with_other_tenants_token;
SELECT regress.try(format($$SELECT idempotency.idem_release('globex', 'POST /pay', 'same-key', %s)$$,
                              :acme_token), 'verbose') AS release_with_other_tenants_token;

-- the client reads nothing directly and has no operator functions
SELECT regress.try($$SELECT * FROM idempotency.keys$$, 'verbose') AS select_keys;
SELECT regress.try($$UPDATE idempotency.keys SET state = 'completed' WHERE tenant = 'acme'$$, 'verbose') AS update_keys;
SELECT regress.try($$DELETE FROM idempotency.keys WHERE tenant = 'acme'$$, 'verbose') AS delete_keys;
SELECT regress.try($$SELECT * FROM idempotency.events$$, 'verbose') AS select_events;
SELECT regress.try($$SELECT * FROM idempotency.idem_lookup('acme', 'POST /pay', 'same-key')$$, 'verbose') AS lookup;
SELECT regress.try($$SELECT idempotency.idem_resolve('acme', 'POST /pay', 'same-key', 200, '{}')$$, 'verbose') AS resolve;
SELECT regress.try($$UPDATE idempotency.endpoints SET store_response = false$$, 'verbose') AS change_policy;

-- acme finishes its own claim with its token
SELECT idempotency.idem_finish('acme', 'POST /pay', 'same-key', 201, '{"tenant": "acme"}',
                               lease_token => :acme_token);
SELECT action, response_json
FROM idempotency.idem_claim('acme', 'POST /pay', 'same-key', regress.fp('acme body'));
RESET ROLE;

-- The functions are not SECURITY DEFINER: the SQL they run (lease mode,
-- endpoint policies) runs as the extension's owner with a pinned
-- search_path, so an operator of the caller's that would match every row
-- is never used (it would say so).
CREATE SCHEMA regress_idem_evil;
CREATE FUNCTION regress_idem_evil.texteq(text, text) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'the caller''s = operator was used'; RETURN true; END $$;
CREATE OPERATOR regress_idem_evil.= (LEFTARG = text, RIGHTARG = text,
                                     FUNCTION = regress_idem_evil.texteq);
GRANT USAGE ON SCHEMA regress_idem_evil TO regress_idem_tenant_app;
SET ROLE regress_idem_tenant_app;
SET search_path = regress_idem_evil, pg_catalog, public;
SELECT 'a' = 'b' AS callers_operator_in_effect;
SELECT lease_token AS evil_a FROM idempotency.idem_claim('acme', 'POST /evil', 'evil-a',
    regress.fp('a'), lease => interval '1 hour') \gset
SELECT lease_token AS evil_b FROM idempotency.idem_claim('acme', 'POST /evil', 'evil-b',
    regress.fp('b'), lease => interval '1 hour') \gset
SELECT idempotency.idem_heartbeat('acme', 'POST /evil', 'evil-b', :evil_b, interval '2 hours') > now() AS extended;
SELECT idempotency.idem_finish('acme', 'POST /evil', 'evil-a', 201, '{"a": 1}', lease_token => :evil_a);
-- (a token of another key releases nothing)
SELECT idempotency.idem_release('acme', 'POST /evil', 'evil-b', :evil_a);
RESET search_path;
RESET ROLE;
SELECT key, state, response_status FROM idempotency.keys WHERE endpoint = 'POST /evil' ORDER BY key;
DELETE FROM idempotency.keys WHERE endpoint = 'POST /evil';
DROP SCHEMA regress_idem_evil CASCADE;

-- what the table holds: one row per tenant and key, each its own
SELECT tenant, key, state, response_status,
       convert_from(response_body, 'UTF8') AS body
FROM idempotency.keys WHERE endpoint = 'POST /pay' ORDER BY tenant, key;

DELETE FROM idempotency.keys WHERE endpoint = 'POST /pay';
DROP ROLE regress_idem_tenant_app;
