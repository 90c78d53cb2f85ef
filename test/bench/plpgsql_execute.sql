-- Execute path, PL/pgSQL reference (plpgsql_reference.sql): claim
-- (fingerprint sha256 of the body's text, INSERT ... ON CONFLICT DO NOTHING),
-- business insert, finish (UPDATE to completed), one transaction.
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
SELECT action FROM ref.idem_claim('acme', 'POST /payments', 'k' || :h, :body::jsonb);
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h);
SELECT ref.idem_finish('acme', 'POST /payments', 'k' || :h, 201, :resp::jsonb);
COMMIT;
