--
-- The guide's story, as examples/payments.sql tells it to "make run" users:
-- a payment of 4200 is executed once, replayed on retries (also with keys
-- reordered and 4200.0), refused with 422 when the amount changes, and the
-- same key under another tenant or endpoint is another operation.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
\getenv abs_srcdir PG_ABS_SRCDIR
\set example :abs_srcdir '/../examples/payments.sql'
\i :example

-- and the same key under another endpoint is another operation too
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /refunds', '7f3a-demo',
    idempotency.idem_fingerprint('POST', '/refunds', '{"amount": 4200}'));
SELECT idempotency.idem_release('acme', 'POST /refunds', '7f3a-demo');
COMMIT;
-- the replayed body is byte for byte the first one
SELECT convert_from(response_body, 'UTF8') AS body, response_headers->>'Idempotent-Replayed' AS replayed
FROM idempotency.idem_claim('acme', 'POST /payments', '7f3a-demo',
    idempotency.idem_fingerprint('POST', '/payments',
        '{"amount": 4.2e3, "currency": "EUR", "card": "tok_visa"}'));
