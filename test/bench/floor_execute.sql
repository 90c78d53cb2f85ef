-- Execute path, floor: the business insert plus one plain insert of a key
-- row (constant fingerprint, response) into an unpartitioned table with a
-- unique index; no check at all.  New key every time (see bench.sh).
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
INSERT INTO floor_keys (tenant, endpoint, key, fingerprint, response_status, response_body, expires_at) VALUES ('acme', 'POST /payments', 'k' || :h, :fp::bytea, 201, :resp::jsonb, now() + interval '24 hours');
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h);
COMMIT;
