-- test/bench/locks.sql: relation locks one claim of a new key holds, as
-- pg_locks shows them for the backend inside the transaction: relations of
-- schema idempotency (tables, partitions, indexes), and how many of those
-- are fast-path.  Atomic mode (claim and finish in one transaction) and
-- lease mode (the claim's own transaction), each after a claim that reads
-- the endpoint's policy into the session (rolled back).  Prints one line:
-- atomic locks|atomic fast-path|lease locks|lease fast-path.
\set ON_ERROR_STOP on
SET client_min_messages = warning;
CREATE TEMP VIEW bench_locks AS
SELECT count(*) AS locks, count(*) FILTER (WHERE l.fastpath) AS fast_path
FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
  AND c.relnamespace = 'idempotency'::regnamespace;
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'locks-warm', sha256('a')) \gset
ROLLBACK;
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'locks-atomic', sha256('a')) \gset
SELECT idempotency.idem_finish('acme', 'POST /payments', 'locks-atomic', 201, '{}') IS NOT NULL AS finished \gset
SELECT locks AS a_locks, fast_path AS a_fast FROM bench_locks \gset
COMMIT;
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'locks-lease', sha256('a'), lease => '1 min') \gset
SELECT locks AS l_locks, fast_path AS l_fast FROM bench_locks \gset
COMMIT;
\pset tuples_only on
\pset format unaligned
SELECT :a_locks, :a_fast, :l_locks, :l_fast;
