-- test/bench/locks.sql: relation locks a claim of a new key holds, as
-- pg_locks shows them for the backend inside the transaction: relations of
-- schema idempotency (tables, partitions, indexes), and how many of those
-- are fast-path.  :n claims of new keys in atomic mode (claim and finish in
-- one transaction) and :n in lease mode (the claim's own transaction), each
-- in a transaction of its own, after a claim that reads the endpoint's
-- policy into the session (rolled back): a claim opens a tombstone
-- partition when its filter answers "maybe", so one claim is not every
-- claim.  Prints one line per mode:
-- mode|claims|most locks|mean locks|fewest locks|claims with a lock not fast-path|claims over 8 locks.
\set ON_ERROR_STOP on
\if :{?n}
\else
\set n 200
\endif
-- (a lease of an earlier run expiring meanwhile warns)
SET client_min_messages = error;
SELECT set_config('bench.nclaims', :'n', false) AS nclaims \gset
CREATE TEMP TABLE bench_lock_counts (mode text, locks int, fast_path int);
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'locks-warm', sha256('a')) \gset
ROLLBACK;
DO $$
DECLARE
    n int := current_setting('bench.nclaims')::int;
    l int;
    f int;
    k text;
BEGIN
    FOR i IN 1 .. 2 * n LOOP
        k := 'locks-' || md5(clock_timestamp()::text || i);
        IF i <= n THEN
            PERFORM idempotency.idem_claim('acme', 'POST /payments', k, sha256('a'));
            PERFORM idempotency.idem_finish('acme', 'POST /payments', k, 201, '{}');
        ELSE
            PERFORM idempotency.idem_claim('acme', 'POST /payments', k, sha256('a'), lease => '1 min');
        END IF;
        SELECT count(*), count(*) FILTER (WHERE lk.fastpath) INTO l, f
        FROM pg_locks lk JOIN pg_class c ON c.oid = lk.relation
        WHERE lk.pid = pg_backend_pid() AND lk.locktype = 'relation'
          AND c.relnamespace = 'idempotency'::regnamespace;
        INSERT INTO bench_lock_counts VALUES (CASE WHEN i <= n THEN 'atomic' ELSE 'lease' END, l, f);
        COMMIT;
    END LOOP;
END $$;
\pset tuples_only on
\pset format unaligned
SELECT mode, count(*), max(locks), round(avg(locks), 2), min(locks),
       count(*) FILTER (WHERE fast_path < locks), count(*) FILTER (WHERE locks > 8)
FROM bench_lock_counts GROUP BY mode ORDER BY mode;
