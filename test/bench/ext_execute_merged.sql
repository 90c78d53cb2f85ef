-- Execute path, extension, atomic mode, on the floor's footing: as many
-- statements as the floor (the finish runs in the RETURNING clause of the
-- business insert) and, like the floor's constant, the fingerprint sent by
-- the application rather than computed in the statement.  The claim, the
-- checks and the key row are all there; one transaction.
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k' || :h, :fp::bytea);
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h)
RETURNING idempotency.idem_finish('acme', 'POST /payments', idempotency_key, 201, :resp::jsonb);
COMMIT;
