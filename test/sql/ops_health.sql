--
-- idempotency.health: per endpoint, from the live rows of the table.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

SELECT idempotency.idem_stats_reset() IS NOT NULL AS reset;

-- rows written directly (as the superuser) in every state; expired rows
-- are dead and do not count
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
                              response_status, body_kind, response_body,
                              created_at, expires_at)
SELECT 't1', 'POST /health-a', 'k' || n, sha256(n::text::bytea), s.state,
       CASE WHEN s.state = 'completed' THEN 201 END,
       CASE WHEN s.state = 'completed' THEN 'bytes' END,
       CASE WHEN s.state = 'completed' THEN decode(repeat('ab', 100), 'hex') END,
       now() - s.age, now() + s.ttl
FROM generate_series(1, 12) AS n,
LATERAL (SELECT CASE WHEN n <= 5 THEN 'completed'
                     WHEN n <= 8 THEN 'in_progress'
                     WHEN n <= 10 THEN 'unknown'
                     ELSE 'failed' END AS state,
                interval '1 second' * n * 60 AS age,
                CASE WHEN n IN (1, 8) THEN interval '-1 second'
                     ELSE interval '1 hour' END AS ttl) AS s;

SELECT endpoint, live_keys, in_progress,
       oldest_in_progress_age BETWEEN interval '7 minutes' AND interval '8 minutes'
           AS oldest_is_row_7, unknown,
       failed, stored_bytes
FROM idempotency.health WHERE endpoint = 'POST /health-a';

-- the counters have not seen this endpoint: the ratios are NULL
SELECT claims, replay_ratio, conflict_ratio, mismatch_ratio
FROM idempotency.health WHERE endpoint = 'POST /health-a';

-- idempotency.stats: after a reset, one row of zero totals
SELECT endpoint, untracked, claims, executes, replays, in_progress, mismatches,
       pending, finishes, releases, fails, invalid_keys, leases_expired,
       resolved, reset_at <= now() AS reset_in_the_past
FROM idempotency.stats;

DELETE FROM idempotency.keys WHERE endpoint = 'POST /health-a';
SELECT count(*) AS rows_after_cleanup FROM idempotency.health
WHERE endpoint = 'POST /health-a';
