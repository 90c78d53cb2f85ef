--
-- Without shared_preload_libraries the counters do not exist: idem_stats()
-- and idempotency.stats say so, idempotency.health works without ratios.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

SELECT * FROM idempotency.stats;
SELECT * FROM idempotency.idem_stats();
SELECT count(*) AS rows_when_missing_ok FROM idempotency.idem_stats(true);

INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
                              created_at, expires_at)
VALUES ('t1', 'POST /np', 'k1', sha256('1'), 'unknown', now(), now() + interval '1 hour');
SELECT endpoint, live_keys, unknown, claims, replay_ratio, conflict_ratio,
       mismatch_ratio, counters_since
FROM idempotency.health;
DELETE FROM idempotency.keys;

-- the key helpers need no shared memory
SELECT length(idempotency.idem_ulid()) AS ulid_length;
