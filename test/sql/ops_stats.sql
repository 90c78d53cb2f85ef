--
-- Counters: every action of a known sequence is counted exactly once, per
-- endpoint and in total.  (The concurrent case is the TAP test
-- 051_counters.)
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

SELECT idempotency.idem_stats_reset() <= now() + interval '1 minute' AS reset;

-- execute and finish in one transaction
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k1', regress.fp('a'));
SELECT idempotency.idem_finish('t', 'POST /stats', 'k1', 201, '{}');
COMMIT;
-- replay, mismatch
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k1', regress.fp('a'));
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k1', regress.fp('b'));
-- lease: execute, in progress, fail, pending, resolve
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k2', regress.fp('a'),
                                          lease => interval '1 hour');
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k2', regress.fp('a'));
SELECT idempotency.idem_fail('t', 'POST /stats', 'k2', 'unknown',
       lease_token => (SELECT lease_token FROM idempotency.keys WHERE key = 'k2'));
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k2', regress.fp('a'));
SELECT idempotency.idem_resolve('t', 'POST /stats', 'k2', 200, '{}');
-- lease: execute, release
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k3', regress.fp('a'),
                                          lease => interval '1 hour');
SELECT idempotency.idem_release('t', 'POST /stats', 'k3',
       (SELECT lease_token FROM idempotency.keys WHERE key = 'k3'));
-- an invalid key is counted as such, not as a claim
\set VERBOSITY terse
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'bad key', regress.fp('a'));
\set VERBOSITY default
-- a claim whose transaction rolls back was still made
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /stats', 'k4', regress.fp('a'));
ROLLBACK;
-- another endpoint
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /stats-b', 'k1', regress.fp('a'));
SELECT idempotency.idem_release('t', 'POST /stats-b', 'k1');
COMMIT;

SELECT endpoint, untracked, claims, executes, replays, in_progress, mismatches,
       pending, finishes, releases, fails, invalid_keys, leases_expired, resolved
FROM idempotency.stats;

-- the totals are the sum of the endpoints
SELECT bool_and(t.claims = s.claims AND t.executes = s.executes
                AND t.replays = s.replays AND t.releases = s.releases
                AND t.invalid_keys = s.invalid_keys) AS totals_are_sums
FROM (SELECT * FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked) t,
     (SELECT sum(claims) AS claims, sum(executes) AS executes, sum(replays) AS replays,
             sum(releases) AS releases, sum(invalid_keys) AS invalid_keys
      FROM idempotency.stats WHERE endpoint IS NOT NULL) s;

-- the health view takes its ratios from the counters
SELECT endpoint, claims, replay_ratio, conflict_ratio, mismatch_ratio
FROM idempotency.health WHERE endpoint LIKE 'POST /stats%';

-- a reset zeroes everything and forgets the endpoints
SELECT idempotency.idem_stats_reset() IS NOT NULL AS reset;
SELECT endpoint, claims, executes, replays, invalid_keys FROM idempotency.stats;

DELETE FROM idempotency.keys WHERE endpoint LIKE 'POST /stats%';
