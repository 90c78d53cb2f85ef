-- test/bench/scale_load.sql: :nkeys live completed keys, written in bulk
-- (one INSERT ... SELECT from generate_series, as superuser) rather than
-- through :nkeys function calls.  The rows look like those of a steady state
-- under a 24-hour TTL: created during the last 24 hours, so they expire
-- during the next 24 hours.  Same tenant, endpoint and key format as the
-- benchmark's new keys ('k' and a random-looking signed 64-bit number), so
-- that new keys land at random places among them in the unique index, as
-- random (UUID) keys do in production.
SELECT set_config('bench.nkeys', :'nkeys', false);
INSERT INTO idempotency.keys
       (tenant, endpoint, key, fingerprint, state, response_status,
        body_kind, response_body, created_at, completed_at, expires_at)
SELECT 'acme', 'POST /payments',
       'k' || ('x' || substr(md5(i::text), 1, 16))::bit(64)::bigint,
       sha256(int8send(i)), 'completed', 201,
       'json', convert_to(current_setting('bench.resp'), 'UTF8'),
       now() - a, now() - a, now() - a + interval '24 hours'
  FROM generate_series(1, current_setting('bench.nkeys')::bigint) i,
       LATERAL (SELECT (i % 84000) * interval '1 second' + interval '5 minutes') AS t(a);
VACUUM ANALYZE idempotency.keys;
