-- The floor plus one empty statement (SELECT 1): the cost of the one extra
-- round trip that the claim/finish protocol has over the floor (claim and
-- finish are two statements, the floor's key insert is one).  Information
-- only: no target.
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
INSERT INTO floor_keys (tenant, endpoint, key, fingerprint, response_status, response_body, expires_at) VALUES ('acme', 'POST /payments', 'k' || :h, :fp::bytea, 201, :resp::jsonb, now() + interval '24 hours');
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h);
SELECT 1;
COMMIT;
