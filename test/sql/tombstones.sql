--
-- Tombstones for expired keys: maintenance keeps a keyed hash of the scope
-- and the fingerprint of each expired key (of an endpoint that keeps
-- tombstones) when it drops the key's partition or purges it from the
-- default partition; a later claim with another fingerprint gets 422, with
-- the same one executes again or, per endpoint, gets 409 key_expired.
-- (Skipped where the worker may run a pass meanwhile.)
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
-- start from an empty store, whatever earlier tests left
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
RESET client_min_messages;
\set VERBOSITY terse
SET TimeZone = 'UTC';
SET idempotency.partition_interval = '1d';
SET idempotency.max_ttl = '7d';
SELECT idempotency.idem_stats_reset() IS NOT NULL AS reset;

SHOW idempotency.tombstone_ttl;
SHOW idempotency.tombstone_partition_interval;

-- pay keeps tombstones by the setting (30 days); strict for 90 days and
-- asks the client before executing an expired key again; off keeps none
INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl, on_expired_reuse)
VALUES ('strict', '90 days', 'conflict'), ('off', '0', 'execute');

CREATE FUNCTION pg_temp.claim(endpoint text, key text, body text, ttl interval DEFAULT NULL)
RETURNS TABLE (action text, http_status integer, error_code text)
LANGUAGE sql AS $$
    SELECT action, http_status, error_code
    FROM idempotency.idem_claim('acme', endpoint, key, sha256(convert_to(body, 'UTF8')), ttl => ttl)
$$;
CREATE FUNCTION pg_temp.done(endpoint text, key text, body text, ttl interval DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE a text;
BEGIN
    SELECT c.action INTO a FROM pg_temp.claim(endpoint, key, body, ttl) c;
    IF a = 'execute' THEN
        PERFORM idempotency.idem_finish('acme', endpoint, key, 201, '{}');
    END IF;
    RETURN a;
END $$;

-- partitions that cover now
SELECT count(*) > 0 AS partitions_made
FROM idempotency.idem_maintenance(now(), preview => false) WHERE kind = 'create';

-- keys that live one second
SELECT pg_temp.done('pay', 'k1', 'a', '1 s'), pg_temp.done('strict', 'k2', 'a', '1 s'),
       pg_temp.done('off', 'k3', 'a', '1 s');
SELECT pg_sleep(1.2);

-- Expired, but the rows are still in their partition: they answer already.
BEGIN;
SELECT * FROM pg_temp.claim('pay', 'k1', 'b');      -- another payload: 422
SELECT * FROM pg_temp.claim('strict', 'k2', 'a');   -- the same, strict: 409
SELECT * FROM pg_temp.claim('off', 'k3', 'b');      -- no tombstones: executes
ROLLBACK;

-- What a pass two days ahead would do: the partition of the keys is
-- dropped, and two tombstones are written first (none for off).
SELECT kind, object LIKE 'keys_p%' AS of_keys, rows
FROM idempotency.idem_maintenance(now() + interval '2 days', preview => true)
WHERE kind = 'tombstone';
SELECT kind, object LIKE 'keys_p%' AS of_keys, rows
FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone';
SELECT count(*) AS rows_left FROM idempotency.keys WHERE key IN ('k1', 'k2', 'k3');

-- A tombstone: 16 bytes of a keyed hash of the scope, the fingerprint, the
-- key's expiry and its own (30 or 90 days later); never the key.
SELECT octet_length(t.scope_hash) AS hash_bytes,
       t.scope_hash = idempotency.idem_tombstone_hash('acme', e.endpoint, e.key) AS hash_matches,
       t.fingerprint = sha256('a') AS fingerprint_kept,
       t.expires_at - t.expired_at AS kept_for,
       t.expired_at < now() AS expired,
       position(convert_to(e.key, 'UTF8') IN t.scope_hash) = 0 AS no_key
FROM idempotency.tombstones t
JOIN (VALUES ('pay', 'k1'), ('strict', 'k2')) e (endpoint, key)
  ON t.scope_hash = idempotency.idem_tombstone_hash('acme', e.endpoint, e.key)
ORDER BY kept_for;
SELECT count(*) AS tombstones FROM idempotency.tombstones;
SELECT count(*) AS in_dated_partitions FROM ONLY idempotency.tombstones_default;
-- another key, tenant or endpoint has another hash
SELECT count(DISTINCT h) AS distinct_hashes FROM (VALUES
    (idempotency.idem_tombstone_hash('acme', 'pay', 'k1')),
    (idempotency.idem_tombstone_hash('acme', 'pay', 'k2')),
    (idempotency.idem_tombstone_hash('acme2', 'pay', 'k1')),
    (idempotency.idem_tombstone_hash('acme', 'pay2', 'k1')),
    (idempotency.idem_tombstone_hash('acmep', 'ay', 'k1'))) v (h);

-- The rows are gone; the tombstones answer.
BEGIN;
SELECT * FROM pg_temp.claim('pay', 'k1', 'b');      -- 422
SELECT * FROM pg_temp.claim('strict', 'k2', 'b');   -- 422
SELECT * FROM pg_temp.claim('strict', 'k2', 'a');   -- 409 key_expired
SELECT * FROM pg_temp.claim('off', 'k3', 'b');      -- executes
ROLLBACK;
-- Least privilege: neither the client nor the admin reads tombstones or
-- computes their hash, and only a superuser changes the settings.
CREATE ROLE regress_idem_tomb_app;
GRANT idempotency_client TO regress_idem_tomb_app;
CREATE ROLE regress_idem_tomb_ops;
GRANT idempotency_admin TO regress_idem_tomb_ops;
SET ROLE regress_idem_tomb_app;
SELECT count(*) FROM idempotency.tombstones;
SELECT idempotency.idem_tombstone_hash('acme', 'pay', 'k1');
SET idempotency.tombstone_ttl = 0;
-- the claim reads the tombstones for the client
SELECT action, http_status FROM idempotency.idem_claim('acme', 'pay', 'k1', sha256('b'));
RESET ROLE;
SET ROLE regress_idem_tomb_ops;
SELECT count(*) FROM idempotency.tombstones;
SELECT count(*) FROM ONLY idempotency.tombstones_default;
SELECT endpoint, tombstone_hits >= 0 AS counted FROM idempotency.health WHERE endpoint = 'pay';
RESET ROLE;
DROP ROLE regress_idem_tomb_app;
DROP ROLE regress_idem_tomb_ops;

-- a refusal took no lock it keeps: the same transaction may claim again
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT * FROM pg_temp.claim('pay', 'k1', 'b');
SELECT * FROM pg_temp.claim('pay', 'k1', 'b');
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.claim('strict', 'k2', 'b');
COMMIT;

-- Savepoints: a refusal rolled back to a savepoint leaves nothing behind;
-- the same payload executes again, and is then the live key.
BEGIN;
SAVEPOINT s;
SELECT * FROM pg_temp.claim('pay', 'k1', 'b');
ROLLBACK TO SAVEPOINT s;
SELECT * FROM pg_temp.claim('pay', 'k1', 'a');
SAVEPOINT s2;
SELECT * FROM pg_temp.claim('pay', 'k1', 'b');      -- this transaction's own claim: 409
ROLLBACK TO SAVEPOINT s2;
SELECT idempotency.idem_finish('acme', 'pay', 'k1', 201, '{"again": true}');
COMMIT;
SELECT * FROM pg_temp.claim('pay', 'k1', 'b');      -- the live key's mismatch
SELECT action, response_json FROM idempotency.idem_claim('acme', 'pay', 'k1', sha256('a'));
-- in an exception block
DO $$
DECLARE r record;
BEGIN
    BEGIN
        SELECT * INTO r FROM pg_temp.claim('strict', 'k2', 'b');
        RAISE NOTICE 'claim: % % %', r.action, r.http_status, r.error_code;
        RAISE EXCEPTION 'rolled back';
    EXCEPTION WHEN raise_exception THEN
        RAISE NOTICE 'caught';
    END;
    SELECT * INTO r FROM pg_temp.claim('strict', 'k2', 'b');
    RAISE NOTICE 'again: % % %', r.action, r.http_status, r.error_code;
END $$;

-- The counters: claims that met an expired key, per endpoint.
SELECT endpoint, claims, mismatches, tombstone_hits FROM idempotency.stats
WHERE endpoint IS NOT NULL ORDER BY endpoint;
SELECT endpoint, tombstone_hits FROM idempotency.health ORDER BY endpoint;

-- Keys of the default partition (no dated partition covers now any more)
-- leave tombstones when maintenance purges them: k4, and k1, which a pass
-- two days ahead sees expired.
SELECT pg_temp.done('pay', 'k4', 'a', '1 s');
SELECT tableoid::regclass AS partition FROM idempotency.keys WHERE key = 'k4';
SELECT pg_sleep(1.2);
-- a live row of the default partition (beyond every dated partition) is
-- neither purged nor counted as a tombstone, in a preview or a pass
INSERT INTO idempotency.keys_default (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('acme', 'pay', 'k-live', sha256('a'), 'completed', now(), now() + interval '1 year');
SELECT kind, object, rows
FROM idempotency.idem_maintenance(now() + interval '2 days', preview => true)
WHERE kind IN ('tombstone', 'purge') ORDER BY kind, object;
SELECT kind, object, rows
FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind IN ('tombstone', 'purge') ORDER BY kind, object;
SELECT count(*) AS live_row_kept FROM idempotency.keys WHERE key = 'k-live';
DELETE FROM idempotency.keys WHERE key = 'k-live';
SELECT * FROM pg_temp.claim('pay', 'k4', 'b');

-- Tombstones leave with their partitions: 60 days ahead, those of pay
-- (30 days) are dropped, strict's (90 days) stay.
SELECT kind, count(*) > 0 AS some
FROM idempotency.idem_maintenance(now() + interval '60 days', preview => false)
WHERE kind = 'drop' AND object LIKE 'tombstones_p%' GROUP BY kind;
SELECT count(*) AS tombstones_left,
       bool_and(scope_hash = idempotency.idem_tombstone_hash('acme', 'strict', 'k2')) AS all_strict
FROM idempotency.tombstones;
-- (the clock is not 60 days ahead: what remains is what claims see)
BEGIN;
SELECT * FROM pg_temp.claim('pay', 'k4', 'b');      -- executes: no tombstone left
SELECT * FROM pg_temp.claim('strict', 'k2', 'b');   -- 422
ROLLBACK;

-- A tombstone that has expired, not yet dropped, no longer answers.
UPDATE idempotency.tombstones SET expires_at = now() - interval '1 s';
SELECT count(*) AS in_default FROM ONLY idempotency.tombstones_default;
BEGIN;
SELECT * FROM pg_temp.claim('strict', 'k2', 'b');   -- executes
ROLLBACK;
-- one that expired before the partitions maintenance makes now leaves the
-- default partition of tombstones with the next pass
UPDATE idempotency.tombstones SET expires_at = now() - interval '30 days';
SELECT kind, object, rows FROM idempotency.idem_maintenance(now(), preview => false)
WHERE kind = 'purge';
SELECT count(*) AS tombstones FROM idempotency.tombstones;

-- An endpoint switched off neither honours nor writes tombstones.
SELECT pg_temp.done('off', 'k5', 'a', '1 s');
SELECT pg_sleep(1.2);
SELECT kind, rows FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone';
SELECT count(*) AS tombstones FROM idempotency.tombstones;
-- the setting at 0 switches off every endpoint that names no tombstone_ttl
SET idempotency.tombstone_ttl = 0;
SELECT pg_temp.done('pay', 'k6', 'a', '1 s');
SELECT pg_sleep(1.2);
BEGIN;
SELECT * FROM pg_temp.claim('pay', 'k6', 'b');      -- executes: not honoured
ROLLBACK;
SELECT kind, rows FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone';
RESET idempotency.tombstone_ttl;

-- Settings: at and past their limits (the wording of the range differs
-- between server versions: the SQLSTATE and the gist are shown).
CREATE FUNCTION pg_temp.try_set(setting text, value text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config(setting, value, false);
    RETURN 'accepted: ' || current_setting(setting);
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || (SQLERRM LIKE '%is outside the valid range for parameter%');
END $$;
SELECT pg_temp.try_set('idempotency.tombstone_ttl', '3650d');
SELECT pg_temp.try_set('idempotency.tombstone_ttl', '3651d');
SELECT pg_temp.try_set('idempotency.tombstone_ttl', '-1');
SELECT pg_temp.try_set('idempotency.tombstone_ttl', '0');
RESET idempotency.tombstone_ttl;
SELECT pg_temp.try_set('idempotency.tombstone_partition_interval', '60');
SELECT pg_temp.try_set('idempotency.tombstone_partition_interval', '59');
RESET idempotency.tombstone_partition_interval;
UPDATE idempotency.endpoints SET tombstone_ttl = '10 years' WHERE endpoint = 'off';
UPDATE idempotency.endpoints SET tombstone_ttl = '10 years 1 day' WHERE endpoint = 'off';
UPDATE idempotency.endpoints SET tombstone_ttl = '-1 s' WHERE endpoint = 'off';
UPDATE idempotency.endpoints SET on_expired_reuse = 'replay' WHERE endpoint = 'off';
UPDATE idempotency.endpoints SET on_expired_reuse = NULL WHERE endpoint = 'off';


-- Partitions of tombstones are made where tombstones land before the next
-- pass only (a ttl's window), not in every slot up to the longest ttl: with
-- 'off' at a ten-year tombstone_ttl and one-day tombstone partitions, a
-- pass plans tens of partitions, not thousands, some ten years ahead.
SET idempotency.tombstone_partition_interval = '1d';
SELECT count(*) BETWEEN 10 AND 40 AS tens,
       count(*) FILTER (WHERE object >= 'tombstones_p' || to_char(now() + interval '3640 days', 'YYYYMMDD')) > 0 AS ten_years_ahead
FROM idempotency.idem_maintenance(now(), preview => true)
WHERE kind = 'create' AND object LIKE 'tombstones_p%';
-- One transaction makes at most 64 partitions of a table (their locks are
-- held until it ends); the next pass makes the rest.  With one-minute
-- partitions, ten years ahead:
CREATE TEMP TABLE before_pass AS SELECT inhrelid FROM pg_inherits
WHERE inhparent = 'idempotency.tombstones'::regclass;
SET idempotency.tombstone_partition_interval = '60';
\set VERBOSITY terse
SELECT count(*) AS made FROM idempotency.idem_maintenance(now(), preview => false)
WHERE kind = 'create' AND object LIKE 'tombstones_p%';
\set VERBOSITY default
DO $$
DECLARE
    part regclass;
BEGIN
    -- the partitions made above, dropped by hand: the DDL guard is off for it
    PERFORM set_config('idempotency.ddl_guard', 'off', true);
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'idempotency.tombstones'::regclass
                  AND inhrelid NOT IN (SELECT inhrelid FROM before_pass)
    LOOP
        EXECUTE format('DROP TABLE %s', part);
    END LOOP;
END $$;
RESET idempotency.tombstone_partition_interval;
