-- Mismatch diagnostics, execute path in atomic mode (claim, business insert,
-- finish), without diagnostics (no digest): the baseline.
-- Compared with diag_none.sql in the same pgbench run (scripts/bench.sh).
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k' || :h, @FP@);
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h);
SELECT idempotency.idem_finish('acme', 'POST /payments', 'k' || :h, 201, :resp::jsonb);
COMMIT;
