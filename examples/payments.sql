-- examples/payments.sql: a payment API made safe to retry, step by step.
-- "make run" runs it in database demo; run it again with
--   psql -h <socket dir> -p <port> -U <user> demo -f examples/payments.sql
\pset footer off
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

DROP TABLE IF EXISTS payments;
CREATE TABLE payments (
    id              text PRIMARY KEY,
    tenant          text NOT NULL,
    amount          numeric NOT NULL,
    currency        text NOT NULL,
    idempotency_key text NOT NULL,
    UNIQUE (tenant, idempotency_key)
);
DELETE FROM idempotency.keys WHERE tenant IN ('acme', 'globex');

-- What the API does for POST /payments, as one stored procedure: claim the
-- key, do the business write only when told to execute, finish the key with
-- the response in the same transaction.
CREATE OR REPLACE FUNCTION create_payment(p_tenant text, p_key text, p_body jsonb,
                                          OUT status int, OUT headers jsonb, OUT body jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    c  idempotency.claim_result;
    id text;
BEGIN
    c := idempotency.idem_claim(p_tenant, 'POST /payments', p_key,
             idempotency.idem_fingerprint('POST', '/payments', p_body, '{/client_ts}'));
    IF c.action = 'execute' THEN
        id := 'pay_' || substr(md5(p_tenant || p_key), 1, 8);
        INSERT INTO payments VALUES (id, p_tenant, (p_body->>'amount')::numeric,
                                     p_body->>'currency', p_key);
        status := 201;
        headers := '{"Content-Type": "application/json"}';
        body := jsonb_build_object('id', id, 'amount', p_body->'amount', 'status', 'succeeded');
        PERFORM idempotency.idem_finish(p_tenant, 'POST /payments', p_key, status, body, headers);
    ELSIF c.action = 'replay' THEN
        status := c.http_status;
        headers := c.response_headers;
        body := c.response_json;
    ELSE
        status := c.http_status;
        headers := CASE WHEN c.retry_after IS NOT NULL
                        THEN jsonb_build_object('Retry-After', c.retry_after::text) END;
        body := jsonb_build_object('error', c.error_code);
    END IF;
EXCEPTION WHEN SQLSTATE 'IK400' THEN
    -- a missing or malformed key (or tenant, endpoint) is the client's error
    status := 400;
    headers := NULL;
    body := jsonb_build_object('error', 'invalid_idempotency_key', 'message', SQLERRM);
END $$;

\echo
\echo '1. A client pays 4200 with Idempotency-Key 7f3a-demo: the payment is created (201).'
SELECT * FROM create_payment('acme', '7f3a-demo',
    '{"amount": 4200, "currency": "EUR", "card": "tok_visa", "client_ts": "10:00:00"}');

\echo '2. The response is lost and the client retries: the same 201 and payment id are replayed.'
SELECT * FROM create_payment('acme', '7f3a-demo',
    '{"amount": 4200, "currency": "EUR", "card": "tok_visa", "client_ts": "10:00:05"}');

\echo '3. A retry from another SDK orders the fields differently and writes 4200.0: still the same request.'
SELECT * FROM create_payment('acme', '7f3a-demo',
    '{"client_ts": "10:00:09", "card": "tok_visa", "currency": "EUR", "amount": 4200.0}');

\echo '4. The same key with the amount changed to 42000 is refused (422), and nothing runs.'
SELECT * FROM create_payment('acme', '7f3a-demo',
    '{"amount": 42000, "currency": "EUR", "card": "tok_visa"}');

\echo '5. Another tenant using the same key is a different operation.'
SELECT * FROM create_payment('globex', '7f3a-demo',
    '{"amount": 990, "currency": "USD", "card": "tok_mc"}');

\echo '6. One payment per tenant was written, however many retries came in:'
SELECT tenant, id, amount, currency FROM payments ORDER BY tenant;

\echo '7. A malformed key is refused before anything is stored (SQLSTATE IK400, answered as 400):'
SELECT * FROM create_payment('acme', 'not a key!', '{"amount": 1, "currency": "EUR"}');
SELECT count(*) AS payments_written FROM payments;

\echo '8. What an operator sees of the key (never the body):'
SELECT state, created_at <= completed_at AS completed_after_created, expires_at > now() AS live, response_status
FROM idempotency.idem_lookup('acme', 'POST /payments', '7f3a-demo');
