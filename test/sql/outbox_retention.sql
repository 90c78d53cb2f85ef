--
-- Maintenance removes the outbox's operations that succeeded or failed
-- longer than idempotency.outbox_retention ago, with their attempts, in
-- statements of at most 1,000 rows; never one that needs attention, is
-- pending or in flight.  (Skipped where the worker may run a pass
-- meanwhile.)
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

SHOW idempotency.outbox_retention;
SELECT context FROM pg_settings WHERE name = 'idempotency.outbox_retention';

-- one operation of each state and age
SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', key => k)
FROM unnest(ARRAY['old-succeeded', 'old-failed', 'old-attention', 'recent-succeeded',
                  'old-pending', 'old-in-flight']) k;
UPDATE idempotency.outbox o
SET state = v.state, finished_at = now() - v.finished_ago, created_at = now() - interval '30 days',
    attempts = 1,
    lease_token = CASE WHEN v.state = 'in_flight' THEN 1 END,
    locked_until = CASE WHEN v.state = 'in_flight' THEN now() - interval '29 days' END
FROM (VALUES ('old-succeeded', 'succeeded', interval '8 days'),
             ('old-failed', 'failed', interval '8 days'),
             ('old-attention', 'attention', interval '30 days'),
             ('recent-succeeded', 'succeeded', interval '1 day'),
             ('old-pending', 'pending', NULL),
             ('old-in-flight', 'in_flight', NULL)) v(key, state, finished_ago)
WHERE o.key = v.key;
INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, outcome)
SELECT id, 1, CASE WHEN state IN ('succeeded', 'failed', 'attention') THEN state ELSE 'retry' END
FROM idempotency.outbox;

-- a preview counts them and removes nothing
SELECT kind, object, rows FROM idempotency.idem_maintenance(now() + interval '1 day', preview => true)
WHERE object = 'outbox';
SELECT count(*) AS operations FROM idempotency.outbox;

-- a pass removes the two finished longer than 7 days ago, with their attempts
SELECT kind, object, rows FROM idempotency.idem_maintenance(now()) WHERE object = 'outbox';
SELECT key, state FROM idempotency.outbox ORDER BY id;
SELECT o.key, a.outcome FROM idempotency.outbox_attempts a
LEFT JOIN idempotency.outbox o ON o.id = a.outbox_id ORDER BY a.outbox_id;

-- a shorter retention takes the recent one too; attention stays
SET idempotency.outbox_retention = '12h';
SELECT kind, object, rows FROM idempotency.idem_maintenance(now()) WHERE object = 'outbox';
SELECT key, state FROM idempotency.outbox ORDER BY id;
-- nothing more to remove: the pass reports nothing
SELECT count(*) AS reported FROM idempotency.idem_maintenance(now()) WHERE object = 'outbox';

-- more than one statement's worth, with their attempts
INSERT INTO idempotency.outbox (key, method, url, body, state, next_attempt_at, finished_at, attempts)
SELECT 'bulk-' || i, 'POST', 'https://a.example/', '{}', 'succeeded', now(), now() - interval '1 day', 1
FROM generate_series(1, 2500) i;
INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, outcome)
SELECT id, 1, 'succeeded' FROM idempotency.outbox WHERE key LIKE 'bulk-%';
SELECT kind, object, rows FROM idempotency.idem_maintenance(now()) WHERE object = 'outbox';
SELECT count(*) AS operations, (SELECT count(*) FROM idempotency.outbox_attempts) AS attempts
FROM idempotency.outbox;

-- only who may set it (SUSET): not a client
CREATE ROLE regress_obr_client;
GRANT idempotency_client TO regress_obr_client;
SET ROLE regress_obr_client;
SELECT regress.try($$SET idempotency.outbox_retention = '1s'$$);
RESET ROLE;
DROP ROLE regress_obr_client;

RESET idempotency.outbox_retention;
DELETE FROM idempotency.outbox;
