-- Mismatch diagnostics, execute path in atomic mode (claim, business insert,
-- finish), on an endpoint with diagnostics off: idem_request_digest is called and returns NULL.
-- Compared with diag_none.sql in the same pgbench run (scripts/bench.sh).
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /quiet', 'k' || :h, @FP@,
    digest => idempotency.idem_request_digest('acme', 'POST /quiet', 'k' || :h, :body::jsonb, 'POST', '/payments'));
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h);
SELECT idempotency.idem_finish('acme', 'POST /quiet', 'k' || :h, 201, :resp::jsonb);
COMMIT;
