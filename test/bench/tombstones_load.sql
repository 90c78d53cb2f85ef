-- test/bench/tombstones_load.sql: :n tombstones of expired keys of the
-- endpoint :endpoint (POST /payments, the one ext_execute claims on, or the
-- round-trip workload's POST /v1/payments), written by SQL
-- (one INSERT ... SELECT, as superuser, through the trigger
-- tombstones_filter as maintenance writes them), spread evenly over the
-- dated partitions of idempotency.tombstones whose range has not ended (the
-- ones maintenance made), so that none lands in the default partition and
-- every such partition holds rows.  Then VACUUM ANALYZE.
SELECT set_config('bench.ntomb', :'n', false);
CREATE TEMP TABLE bench_tomb_parts AS
SELECT row_number() OVER (ORDER BY b[1]::timestamptz) - 1 AS j,
       greatest(b[1]::timestamptz, now() + interval '1 hour') AS lo,
       b[2]::timestamptz AS hi
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid,
LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                     $$FROM \('([^']*)'\) TO \('([^']*)'\)$$) b
WHERE i.inhparent = 'idempotency.tombstones'::regclass
  AND b IS NOT NULL AND b[2]::timestamptz > now() + interval '1 hour';
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
SELECT idempotency.idem_tombstone_hash('acme', :'endpoint', 'old' || i),
       sha256(int8send(i)), now() - interval '1 day',
       p.lo + (p.hi - p.lo) * ((i / k.k) % 1000 + 0.5) / 1000
FROM (SELECT count(*) AS k FROM bench_tomb_parts) k
CROSS JOIN generate_series(1, current_setting('bench.ntomb')::bigint) i
JOIN bench_tomb_parts p ON p.j = i % k.k;
DROP TABLE bench_tomb_parts;
VACUUM ANALYZE idempotency.tombstones;
