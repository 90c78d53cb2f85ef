-- Execute path, extension, atomic mode, in as many statements as the floor:
-- claim, then the business insert and the finish in one statement (the
-- finish reads the inserted row), one transaction.  @FP@ as in
-- ext_execute.sql.
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k' || :h, @FP@);
WITH p AS (INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h) RETURNING idempotency_key)
SELECT idempotency.idem_finish('acme', 'POST /payments', p.idempotency_key, 201, :resp::jsonb) FROM p;
COMMIT;
