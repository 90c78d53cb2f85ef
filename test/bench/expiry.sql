-- Expiry benchmark: one million expired keys leave by dropping their
-- partitions (idempotency.idem_maintenance()) against a batched
-- DELETE ... WHERE expires_at < now() of the same rows from a plain table
-- (10,000 rows per transaction).  Prints the time of each, the rows, the
-- dead tuples each leaves behind (pg_stat_user_tables.n_dead_tup before any
-- vacuum), the time of the VACUUM the DELETE then needs, and the ratios
-- (target: dropping at least 50 times faster than the DELETE, no dead
-- tuples, no expired row left).
--
--   psql -X -d DB -f test/bench/expiry.sql     (a superuser; DB may be scratch)
--
-- It needs about 2 x 250 MB of disk and runs in about a minute on 2 cores.
-- Set the row count with -v rows=N (default 1000000).  The server must run
-- with idempotency.enable_worker = off (or without the library preloaded).
\set ON_ERROR_STOP on
\pset pager off
\pset footer off
\if :{?rows}
\else
\set rows 1000000
\endif
SET client_min_messages = warning;
-- the worker would drop the partitions itself in the middle of the run
SELECT current_setting('shared_preload_libraries') ~ 'idempotency'
       AND current_setting('idempotency.enable_worker', true) = 'on' AS worker_on \gset
\if :worker_on
\echo 'error: set idempotency.enable_worker = off (and reload) for this benchmark'
\quit
\endif
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
SET idempotency.partition_interval = '1d';
SET idempotency.max_ttl = '7d';

\echo == preparing :rows expired keys over seven daily partitions, and a plain copy
-- partitions from now on (so that the timed pass only drops), then the past
-- eight days
SELECT count(*) AS premade FROM idempotency.idem_maintenance(now());
SELECT count(*) AS premade FROM idempotency.idem_maintenance(now() - interval '8 days');

DROP TABLE IF EXISTS public.expiry_bench_plain;
CREATE TABLE public.expiry_bench_plain
    (LIKE idempotency.keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
     UNIQUE (tenant, endpoint, key))
    WITH (autovacuum_enabled = off);
CREATE INDEX ON public.expiry_bench_plain (expires_at);

INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, response_status,
                              body_kind, response_body, created_at, completed_at, expires_at)
SELECT 'tenant-' || (i % 100), 'POST /payments', 'expiry-bench-' || i,
       '\xabababababababababababababababababababababababababababababababab'::bytea,
       'completed', 201, 'json', '\x7b226964223a20317d'::bytea,
       now() - interval '8 days', now() - interval '8 days',
       -- the seven days before today's (UTC) partition: their partitions have ended
       (date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
           - interval '1 second' - (i % 604800) * interval '1 second'
FROM generate_series(1, :rows) i;
INSERT INTO public.expiry_bench_plain
SELECT * FROM idempotency.keys WHERE key LIKE 'expiry-bench-%';
SELECT count(*) AS expired_keys FROM idempotency.keys WHERE expires_at < now() \gset
SELECT count(*) AS expired_plain FROM public.expiry_bench_plain WHERE expires_at < now() \gset
CHECKPOINT;
VACUUM ANALYZE public.expiry_bench_plain;
ANALYZE idempotency.keys;

\echo == batched DELETE of :expired_plain rows, 10,000 per transaction
SELECT clock_timestamp() AS t0 \gset
DO $$
DECLARE
    n bigint;
BEGIN
    LOOP
        DELETE FROM public.expiry_bench_plain
        WHERE ctid = ANY (ARRAY(SELECT ctid FROM public.expiry_bench_plain
                                WHERE expires_at < now() LIMIT 10000));
        GET DIAGNOSTICS n = ROW_COUNT;
        COMMIT;
        EXIT WHEN n = 0;
    END LOOP;
END $$;
SELECT extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) AS delete_seconds \gset
SELECT pg_stat_force_next_flush();
SELECT n_dead_tup AS delete_dead FROM pg_stat_user_tables
WHERE relid = 'public.expiry_bench_plain'::regclass \gset
-- what it takes before the space of those rows can be reused
SELECT clock_timestamp() AS t0 \gset
VACUUM public.expiry_bench_plain;
SELECT extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) AS vacuum_seconds \gset

\echo == idem_maintenance(): dropping the partitions of :expired_keys rows
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS dropped_partitions FROM idempotency.idem_maintenance() WHERE kind = 'drop' \gset
SELECT extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) AS drop_seconds \gset
SELECT pg_stat_force_next_flush();
SELECT coalesce(sum(n_dead_tup), 0) AS drop_dead FROM pg_stat_user_tables
WHERE schemaname = 'idempotency' \gset
SELECT count(*) AS left_over FROM idempotency.keys WHERE key LIKE 'expiry-bench-%' \gset

\echo == result
SELECT method, round(seconds::numeric, 3) AS seconds, rows, dead_tuples_left
FROM (VALUES
    ('batched DELETE (10,000 rows per transaction)', :delete_seconds, :expired_plain, :delete_dead),
    ('VACUUM after the DELETE', :vacuum_seconds, :expired_plain, 0),
    ('drop partitions (' || :dropped_partitions || ', idem_maintenance())', :drop_seconds, :expired_keys, :drop_dead)
) r(method, seconds, rows, dead_tuples_left);
SELECT round(:delete_seconds / greatest(:drop_seconds, 0.000001), 1) AS drop_vs_delete,
       round((:delete_seconds + :vacuum_seconds) / greatest(:drop_seconds, 0.000001), 1)
           AS drop_vs_delete_and_vacuum,
       :delete_seconds / greatest(:drop_seconds, 0.000001) >= 50 AND :drop_dead = 0
           AND :left_over = 0 AS target_met;

DROP TABLE public.expiry_bench_plain;
