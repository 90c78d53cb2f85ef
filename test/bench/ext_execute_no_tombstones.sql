-- Execute path, extension, atomic mode, on an endpoint that keeps no
-- tombstones (tombstone_ttl 0, set by setup.sql): claim, business insert, finish, one
-- transaction.  @FP@ is replaced by bench.sh with the fingerprint expression
-- (idem_canonical_json_sha256 of the body when the build has it, else the
-- precomputed constant :fp).
\set n :n + 1
\set u :run * 10000000000 + :client_id * 100000000 + :n
\set h hash_murmur2(:u)
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments-nt', 'k' || :h, @FP@);
INSERT INTO payments (id, tenant, amount, currency, idempotency_key) VALUES (:u, 'acme', 10.00, 'EUR', 'k' || :h);
SELECT idempotency.idem_finish('acme', 'POST /payments-nt', 'k' || :h, 201, :resp::jsonb);
COMMIT;
