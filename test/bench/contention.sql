-- Contention: many clients on 16 hot keys, atomic mode, claims wait up to
-- 2 s for a concurrent duplicate.  The hot keys change every second, so
-- every second 16 new keys are raced for.  Each claim's action is recorded
-- in bench_actions; only an "execute" does the business insert and finish.
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set r random(1, 16)
BEGIN;
WITH k AS (SELECT 'h' || floor(extract(epoch FROM clock_timestamp()))::bigint || '_' || :r AS key) INSERT INTO bench_actions (action, key) SELECT c.action, k.key FROM k, idempotency.idem_claim('hot', 'POST /payments', k.key, :fp::bytea, wait => interval '2 s') c RETURNING (action = 'execute')::int AS exec, key AS hk \gset
\if :exec
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'hot', 10.00, 'EUR', :hk);
SELECT idempotency.idem_finish('hot', 'POST /payments', :hk, 201, :resp::jsonb);
\endif
COMMIT;
