--
-- Savepoints and PL/pgSQL EXCEPTION blocks around every per-key call, at
-- every isolation level; the bound on claims per transaction; the bound on
-- the endpoint policy cache.
--
-- A finish, fail or release undone by a rolled-back subtransaction leaves
-- the claim pending again (and COMMIT then raises IK500, rolling back the
-- business write); a claim made in a rolled-back subtransaction is gone with
-- its lock; leased rows changed in a rolled-back subtransaction are as they
-- were.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
-- the dated partitions, made now, so that no key of this test lands in the
-- default partition: on a server with default settings the maintenance
-- worker's pass would move it out during a repeatable read transaction
-- here, which would then fail to serialize
SELECT count(*) >= 0 AS partitions_made FROM idempotency.idem_maintenance();
-- the helpers live in a schema of their own, dropped at the end
CREATE SCHEMA savepoints_test;
SET search_path = savepoints_test, public;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

-- the key's state as idem_lookup shows it (an unfinished atomic claim of
-- this transaction shows as in_progress), or 'none'
CREATE FUNCTION state(k text) RETURNS text
LANGUAGE sql AS $$
    SELECT coalesce((SELECT state FROM idempotency.idem_lookup('sp', 'e', k)), 'none')
$$;

-- scope locks this session holds
CREATE FUNCTION scope_locks() RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid()
$$;

-- run stmt in an EXCEPTION block, then raise, so that the block rolls back
CREATE FUNCTION undone(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        EXECUTE stmt;
        RAISE EXCEPTION 'handler failed after the call';
    EXCEPTION WHEN raise_exception THEN
        RETURN 'undone';
    END;
END $$;

CREATE TABLE biz (key text NOT NULL);

\set VERBOSITY sqlstate

--
-- Atomic mode: a finish undone by ROLLBACK TO.  Before the fix COMMIT
-- committed the business row without the key, and the next claim executed
-- again.  (iso_savepoint.spec runs this at each isolation level, with a
-- duplicate waiting in another session.)
--
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'rc1', regress.fp('x'));
INSERT INTO biz VALUES ('rc1');
SAVEPOINT s;
SELECT idempotency.idem_finish('sp', 'e', 'rc1', 201, '{}');
SELECT state('rc1') AS after_finish;
ROLLBACK TO s;
SELECT state('rc1') AS after_rollback_to;
COMMIT;
-- nothing committed: the key executes once more
SELECT count(*) AS biz_rows FROM biz;
BEGIN;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'rc1', regress.fp('x'));
ROLLBACK;

-- finished again after the rollback: COMMIT succeeds, retries replay
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'a2', regress.fp('x'));
INSERT INTO biz VALUES ('a2');
SAVEPOINT s;
SELECT idempotency.idem_finish('sp', 'e', 'a2', 201, '{"try": 1}');
ROLLBACK TO s;
SELECT idempotency.idem_finish('sp', 'e', 'a2', 201, '{"try": 2}');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('sp', 'e', 'a2', regress.fp('x'));

-- the same with idem_fail and idem_release, at each isolation level
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'a3', regress.fp('x'));
SAVEPOINT s;
SELECT idempotency.idem_fail('sp', 'e', 'a3', 'failed', 'card declined');
ROLLBACK TO s;
SELECT state('a3') AS after_rollback_to;
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'a4', regress.fp('x'));
INSERT INTO biz VALUES ('a4');
SAVEPOINT s;
SELECT idempotency.idem_release('sp', 'e', 'a4');
ROLLBACK TO s;
SELECT state('a4') AS after_rollback_to, scope_locks();
COMMIT;
SELECT state('a3') AS a3, state('a4') AS a4,
    count(*) FILTER (WHERE key = 'a4') AS biz_rows FROM biz;

-- a release undone, then done again: commits, and the key is free (the lock
-- stays until COMMIT: ROLLBACK TO starts the savepoint anew, and the release
-- runs in it)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'a5', regress.fp('x'));
SAVEPOINT s;
SELECT idempotency.idem_release('sp', 'e', 'a5');
ROLLBACK TO s;
SELECT idempotency.idem_release('sp', 'e', 'a5');
SELECT scope_locks();
COMMIT;
SELECT state('a5') AS a5;

--
-- PL/pgSQL EXCEPTION blocks: finish, fail and release undone by the block.
--
BEGIN;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'x1', regress.fp('x'));
INSERT INTO biz VALUES ('x1');
SELECT undone($$SELECT idempotency.idem_finish('sp', 'e', 'x1', 201, '{}')$$);
SELECT state('x1') AS after_finish_undone;
SELECT undone($$SELECT idempotency.idem_fail('sp', 'e', 'x1')$$);
SELECT state('x1') AS after_fail_undone;
SELECT undone($$SELECT idempotency.idem_release('sp', 'e', 'x1')$$);
SELECT state('x1') AS after_release_undone, scope_locks();
COMMIT;
SELECT state('x1') AS x1, count(*) FILTER (WHERE key = 'x1') AS biz_rows FROM biz;
-- a block that does not fail keeps the finish
BEGIN;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'x2', regress.fp('x'));
DO $$ BEGIN
    PERFORM idempotency.idem_finish('sp', 'e', 'x2', 201, '{}');
EXCEPTION WHEN OTHERS THEN
    RAISE;
END $$;
COMMIT;
SELECT state('x2') AS x2;

--
-- Claims made in a rolled-back subtransaction are gone, with their locks.
--
BEGIN;
SAVEPOINT s;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'c1', regress.fp('x'));
SELECT scope_locks() AS locks_in_savepoint;
ROLLBACK TO s;
SELECT state('c1') AS c1, scope_locks() AS locks_after;
SELECT undone($$SELECT idempotency.idem_claim('sp', 'e', 'c2', regress.fp('x'))$$);
SELECT state('c2') AS c2, scope_locks() AS locks_after_block;
-- and the same key can be claimed again in the transaction
SELECT action FROM idempotency.idem_claim('sp', 'e', 'c1', regress.fp('x'));
SELECT idempotency.idem_finish('sp', 'e', 'c1', 200);
COMMIT;
SELECT state('c1') AS c1;

--
-- Nested savepoints: a finish in an inner savepoint that was released into
-- an outer one is undone by rolling the outer one back.
--
BEGIN;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'n1', regress.fp('x'));
SAVEPOINT a;
SAVEPOINT b;
SELECT idempotency.idem_finish('sp', 'e', 'n1', 201);
RELEASE SAVEPOINT b;
SELECT state('n1') AS after_release_b;
ROLLBACK TO a;
SELECT state('n1') AS after_rollback_to_a;
SELECT idempotency.idem_finish('sp', 'e', 'n1', 201);
COMMIT;
-- a claim and its finish in savepoints that are both released commit
BEGIN;
SAVEPOINT a;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'n2', regress.fp('x'));
SAVEPOINT b;
SELECT idempotency.idem_finish('sp', 'e', 'n2', 201);
RELEASE SAVEPOINT b;
RELEASE SAVEPOINT a;
COMMIT;
-- a claim released into its parent is still pending there
BEGIN;
SAVEPOINT a;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'n3', regress.fp('x'));
RELEASE SAVEPOINT a;
SELECT state('n3') AS n3_pending, scope_locks();
COMMIT;
SELECT state('n1') AS n1, state('n2') AS n2, state('n3') AS n3;
-- released and claimed again in a savepoint that is kept, then the new
-- claim's finish rolled back
BEGIN;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'n4', regress.fp('x'));
SAVEPOINT s;
SELECT idempotency.idem_release('sp', 'e', 'n4');
SELECT action FROM idempotency.idem_claim('sp', 'e', 'n4', regress.fp('x'));
RELEASE SAVEPOINT s;
SAVEPOINT s2;
SELECT idempotency.idem_finish('sp', 'e', 'n4', 201);
ROLLBACK TO s2;
-- the second claim is pending again, the first stays released
SELECT state('n4') AS n4;
COMMIT;
-- released and claimed again in a savepoint that rolls back
BEGIN;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'n5', regress.fp('x'));
SAVEPOINT s;
SELECT idempotency.idem_release('sp', 'e', 'n5');
SELECT action FROM idempotency.idem_claim('sp', 'e', 'n5', regress.fp('y'));
ROLLBACK TO s;
-- the first claim is pending again (fingerprint of 'x'), the second gone
SELECT state, fingerprint = regress.fp('x') AS first_claim FROM idempotency.idem_lookup('sp', 'e', 'n5');
SELECT idempotency.idem_finish('sp', 'e', 'n5', 201);
COMMIT;
SELECT state('n5') AS n5;

--
-- Lease mode: finish, fail, release, heartbeat and resolve inside a
-- savepoint or an EXCEPTION block that rolls back leave the row as it was.
--
CREATE TABLE tokens (key text PRIMARY KEY, token bigint);
INSERT INTO tokens SELECT k, c.lease_token
FROM unnest(ARRAY['l1', 'l2']) k,
     LATERAL idempotency.idem_claim('sp', 'e', k, regress.fp('x'), lease => '1 min') c;
CREATE FUNCTION tok(k text) RETURNS bigint
LANGUAGE sql AS $$ SELECT token FROM tokens WHERE key = k $$;
CREATE FUNCTION lease_row(k text) RETURNS text
LANGUAGE sql AS $$
    SELECT state || ' ' || (locked_until IS NOT NULL)::text || ' ' || coalesce(response_status::text, '-')
    FROM idempotency.idem_lookup('sp', 'e', k)
$$;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SAVEPOINT s;
SELECT idempotency.idem_finish('sp', 'e', 'l1', 201, lease_token => tok('l1'));
ROLLBACK TO s;
SAVEPOINT s;
SELECT idempotency.idem_fail('sp', 'e', 'l1', lease_token => tok('l1'));
ROLLBACK TO s;
SAVEPOINT s;
SELECT idempotency.idem_release('sp', 'e', 'l1', lease_token => tok('l1'));
ROLLBACK TO s;
SAVEPOINT s;
SELECT idempotency.idem_heartbeat('sp', 'e', 'l1', tok('l1'), '50 s') > now();
ROLLBACK TO s;
SELECT lease_row('l1') AS l1;
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT undone($$SELECT idempotency.idem_finish('sp', 'e', 'l1', 201, lease_token => tok('l1'))$$);
SELECT undone($$SELECT idempotency.idem_fail('sp', 'e', 'l1', lease_token => tok('l1'))$$);
SELECT undone($$SELECT idempotency.idem_release('sp', 'e', 'l1', lease_token => tok('l1'))$$);
SELECT undone($$SELECT idempotency.idem_heartbeat('sp', 'e', 'l1', tok('l1'), '50 s')$$);
COMMIT;
SELECT lease_row('l1') AS l1;
-- a lease claim in a rolled-back savepoint leaves no row and no lock
BEGIN;
SAVEPOINT s;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'l3', regress.fp('x'), lease => '1 min');
ROLLBACK TO s;
SELECT state('l3') AS l3, scope_locks();
COMMIT;
-- resolve: l2 is marked unknown, then resolved in savepoints that roll back
SELECT idempotency.idem_fail('sp', 'e', 'l2', lease_token => tok('l2'));
BEGIN ISOLATION LEVEL READ COMMITTED;
SAVEPOINT s;
SELECT idempotency.idem_resolve('sp', 'e', 'l2', 200, '{}');
ROLLBACK TO s;
SELECT undone($$SELECT idempotency.idem_resolve('sp', 'e', 'l2', 200, '{}')$$);
SELECT lease_row('l2') AS l2;
-- and a resolve that stays
SELECT idempotency.idem_resolve('sp', 'e', 'l2', 200, '{}');
COMMIT;
SELECT lease_row('l2') AS l2;

--
-- idempotency.max_claims_per_transaction: a transaction's claims hold one
-- scope lock each until it ends; beyond the setting a claim is IK429.
--
\set VERBOSITY default
SHOW idempotency.max_claims_per_transaction;
SET idempotency.max_claims_per_transaction = 3;
BEGIN;
SELECT count(*) AS claimed FROM generate_series(1, 3) i,
    LATERAL idempotency.idem_claim('sp', 'e', 'm' || i, regress.fp('x')) c;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'm4', regress.fp('x'));
ROLLBACK;
BEGIN;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'm1', regress.fp('x'));
SELECT action FROM idempotency.idem_claim('sp', 'e', 'm2', regress.fp('x'), lease => '1 min');
-- a release gives its lock back at once, and so does a rolled-back savepoint
SELECT idempotency.idem_release('sp', 'e', 'm1');
SAVEPOINT s;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'm3', regress.fp('x'));
SELECT action FROM idempotency.idem_claim('sp', 'e', 'm4', regress.fp('x'));
SELECT regress.try($$SELECT idempotency.idem_claim('sp', 'e', 'm5', regress.fp('x'))$$);
ROLLBACK TO s;
SELECT action FROM idempotency.idem_claim('sp', 'e', 'm5', regress.fp('x'));
SELECT action FROM idempotency.idem_claim('sp', 'e', 'm6', regress.fp('x'));
-- replays hold no lock: they are never refused
SELECT action FROM idempotency.idem_claim('sp', 'e', 'a2', regress.fp('x'));
SELECT regress.try($$SELECT idempotency.idem_claim('sp', 'e', 'm7', regress.fp('x'))$$);
ROLLBACK;
RESET idempotency.max_claims_per_transaction;
-- only superusers may raise it
CREATE ROLE regress_idem_sp_client;
GRANT idempotency_client TO regress_idem_sp_client;
SET ROLE regress_idem_sp_client;
SET idempotency.max_claims_per_transaction = 100000;
RESET ROLE;
DROP ROLE regress_idem_sp_client;

--
-- The endpoint policy cache is bounded: 5,000 endpoint names without a
-- policy row leave it at most 1,000 entries (about 400 kB; before the bound,
-- every name stayed: about 2 MB here).  A finish looks the policy up before
-- it finds that there is no claim (IK404), and counts nothing in the stats.
--
DO $$
BEGIN
    FOR i IN 1 .. 5000 LOOP
        BEGIN
            PERFORM idempotency.idem_finish('sp', 'ep' || i, 'k', 200);
        EXCEPTION WHEN SQLSTATE 'IK404' THEN
            NULL;
        END;
    END LOOP;
END $$;
-- (the cache's context and its hash table's, which has the same name)
SELECT sum(total_bytes) < 1024 * 1024 AS cache_bounded
FROM pg_backend_memory_contexts
WHERE 'idempotency endpoint policies' IN (name, ident);  -- PostgreSQL 15, 18

--
-- Random sequences of claim, finish, fail, release and nested EXCEPTION
-- blocks that roll back or not, checked after every step against a model
-- kept in a table (which subtransactions roll back as they roll back the
-- claims): every key's state as idem_lookup shows it, and every claim's
-- answer.  Each transaction then releases what is pending and commits.
-- Seeded, so the same sequences run every time.  Before the fix a
-- rolled-back finish left the claim forgotten ("want in_progress, got none").
--
CREATE TABLE model (k text PRIMARY KEY, st text NOT NULL);
CREATE SEQUENCE checks;     -- not rolled back: counts every check made
CREATE FUNCTION check_model() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    want text;
    got text;
BEGIN
    PERFORM nextval('checks');
    FOR i IN 0 .. 4 LOOP
        SELECT m.st INTO want FROM model m WHERE m.k = 'r' || i;
        got := state('r' || i);
        IF coalesce(want, 'none') <> got THEN
            RAISE EXCEPTION 'model mismatch on r%: want %, got %', i, coalesce(want, 'none'), got;
        END IF;
    END LOOP;
END $$;
CREATE FUNCTION random_calls(depth int, n int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    op int;
    key text;
    cur text;
    act text;
    want text;
BEGIN
    FOR i IN 1 .. n LOOP
        op := floor(random() * 6);
        key := 'r' || floor(random() * 5);
        SELECT m.st INTO cur FROM model m WHERE m.k = key;
        IF op = 0 THEN
            act := (idempotency.idem_claim('sp', 'e', key, regress.fp('x'))).action;
            want := CASE coalesce(cur, 'none') WHEN 'none' THEN 'execute'
                    WHEN 'in_progress' THEN 'in_progress'
                    WHEN 'completed' THEN 'replay' ELSE 'pending' END;
            IF act <> want THEN
                RAISE EXCEPTION 'claim of % (%): want %, got %', key, cur, want, act;
            END IF;
            IF act = 'execute' THEN
                INSERT INTO model VALUES (key, 'in_progress');
            END IF;
        ELSIF op = 1 AND cur = 'in_progress' THEN
            PERFORM idempotency.idem_finish('sp', 'e', key, 201);
            UPDATE model SET st = 'completed' WHERE k = key;
        ELSIF op = 2 AND cur = 'in_progress' THEN
            PERFORM idempotency.idem_fail('sp', 'e', key, 'failed');
            UPDATE model SET st = 'failed' WHERE k = key;
        ELSIF op = 3 AND cur = 'in_progress' THEN
            PERFORM idempotency.idem_release('sp', 'e', key);
            DELETE FROM model WHERE k = key;
        ELSIF op >= 4 AND depth < 4 THEN
            BEGIN
                PERFORM random_calls(depth + 1, 6);
                IF random() < 0.5 THEN
                    RAISE EXCEPTION USING ERRCODE = 'P0099';
                END IF;
            EXCEPTION WHEN SQLSTATE 'P0099' THEN
                NULL;
            END;
        END IF;
        PERFORM check_model();
    END LOOP;
END $$;
CREATE PROCEDURE random_transactions(n int)
LANGUAGE plpgsql AS $$
BEGIN
    FOR t IN 1 .. n LOOP
        PERFORM random_calls(0, 25);
        PERFORM idempotency.idem_release('sp', 'e', k) FROM model WHERE st = 'in_progress';
        COMMIT;
        DELETE FROM model;
        DELETE FROM idempotency.keys WHERE tenant = 'sp' AND key LIKE 'r_';
        COMMIT;
    END LOOP;
END $$;
SELECT setseed(0.25);
SET default_transaction_isolation = 'read committed';
CALL random_transactions(40);
SET default_transaction_isolation = 'repeatable read';
CALL random_transactions(40);
SET default_transaction_isolation = 'serializable';
CALL random_transactions(40);
RESET default_transaction_isolation;
SELECT last_value > 3000 AS checked_after_over_3000_steps FROM checks;

DROP SCHEMA savepoints_test CASCADE;
RESET search_path;
TRUNCATE idempotency.keys;
