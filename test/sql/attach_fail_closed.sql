--
-- Rows that passed no trigger (src/ddl_guard.c, IdemAlterForget): a
-- partition attached already holding rows, or rows written while the
-- triggers of a table of keys or tombstones are disabled (pg_dump
-- --disable-triggers), are not in the key horizons (src/horizon.c) nor in
-- the tombstone filters (src/tombstone_filter.c) that shared memory keeps.
-- The DDL guard makes them unknown when it lets such a command through, so
-- that claims probe the partitions, and maintenance learns them again only
-- once every trigger of the tree fires always again.  (Skipped without the library
-- preloaded, where neither is kept, and where the worker may run a pass.)
--
SELECT coalesce(CASE
    WHEN current_setting('shared_preload_libraries') !~ 'idempotency'
        THEN 'skipped: key horizons and tombstone filters need the library in shared_preload_libraries'
    WHEN coalesce(current_setting('idempotency.enable_worker', true) = 'on'
                  AND current_setting('idempotency.maintenance_interval', true)::interval < '1 hour',
                  false)
        THEN 'skipped: this server''s maintenance worker runs passes more often than once an hour, and one would change what this test sees'
    END, '') AS skip_reason \gset
SELECT :'skip_reason' <> '' AS skip \gset
\if :skip
\echo :skip_reason
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

CREATE FUNCTION pg_temp.claim(endpoint text, key text, body text)
RETURNS TABLE (action text, http_status integer, replayed boolean)
LANGUAGE sql AS $$
    SELECT action, http_status, replayed
    FROM idempotency.idem_claim('acme', endpoint, key, sha256(convert_to(body, 'UTF8')))
$$;
-- a completed key row, written by SQL
CREATE FUNCTION pg_temp.key_row(endpoint text, key text, body text, expires timestamptz)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at,
                                  completed_at, expires_at, response_status)
    VALUES ('acme', endpoint, key, sha256(convert_to(body, 'UTF8')), 'completed', now(),
            now(), expires, 201)
$$;
-- the tombstone of an expired key
CREATE FUNCTION pg_temp.tombstone(endpoint text, key text, body text, expires timestamptz)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
    VALUES (idempotency.idem_tombstone_hash('acme', endpoint, key),
            sha256(convert_to(body, 'UTF8')), now() - interval '1 hour', expires)
$$;

-- whether this transaction has opened the partition of keys name (a
-- claim keeps them locked), or probed the index of the partition of
-- tombstones name (a claim releases those: its counts of this transaction,
-- flushed before it by pg_temp.flush())
CREATE FUNCTION pg_temp.opened(name text) RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_locks l
                   JOIN pg_catalog.pg_class c ON c.oid = l.relation
                   WHERE l.pid = pg_catalog.pg_backend_pid() AND l.locktype = 'relation'
                     AND c.relname = name)
        OR EXISTS (SELECT FROM pg_catalog.pg_stat_xact_user_tables
                   WHERE relname = name AND idx_scan > 0)
$$;
CREATE FUNCTION pg_temp.flush() RETURNS boolean LANGUAGE sql AS $$
    SELECT pg_catalog.pg_stat_force_next_flush() IS NOT NULL
$$;
-- which of the two attached partitions a claim of a new key probes (in a
-- transaction the caller rolls back)
CREATE FUNCTION pg_temp.new_key_probes(OUT action text, OUT keys_probed boolean,
                                       OUT tombstones_probed boolean)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT c.action INTO action FROM pg_temp.claim('POST /n', 'n1', 'a') c;
    keys_probed := pg_temp.opened('keys_p9attach');
    tombstones_probed := pg_temp.opened('tombstones_p20310601t0000');
END $$;
-- what claims answer for the rows of (d): another payload for its
-- tombstone, the same payload for its key
CREATE FUNCTION pg_temp.d_answers()
RETURNS TABLE (key text, action text, http_status integer, replayed boolean)
LANGUAGE sql AS $$
    SELECT 'd1', * FROM pg_temp.claim('POST /d', 'd1', 'b')
    UNION ALL
    SELECT 'd2', * FROM pg_temp.claim('POST /d', 'd2', 'a')
$$;
-- A pass of maintenance that premakes partitions of keys for a day or two
-- only (max_ttl ahead): claims look 30 days ahead.
CREATE FUNCTION pg_temp.pass() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.set_config('idempotency.max_ttl', '1d', true);
    PERFORM count(*) FROM idempotency.idem_maintenance();
    RETURN true;
END $$;
SET idempotency.max_ttl = '30d';

-- A first pass learns this database's horizons and filters: from then on
-- an endpoint without rows opens no partition of keys, and a partition
-- without a filter entry is not probed.
SELECT pg_temp.pass();
SELECT date_trunc('day', now()) + interval '20 days' AS lo,
       date_trunc('day', now()) + interval '21 days' AS hi \gset

-- (a) a tombstone partition attached already holding a tombstone
CREATE TABLE idempotency.tombstones_p20310601t0000
    (LIKE idempotency.tombstones INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
CREATE INDEX tombstones_p20310601t0000_scope_idx
    ON idempotency.tombstones_p20310601t0000 (scope_hash);
INSERT INTO idempotency.tombstones_p20310601t0000 (scope_hash, fingerprint, expired_at, expires_at)
VALUES (idempotency.idem_tombstone_hash('acme', 'POST /a', 'a1'),
        sha256(convert_to('a', 'UTF8')), now() - interval '1 hour', '2031-06-01 12:00+00');
ALTER TABLE idempotency.tombstones ATTACH PARTITION idempotency.tombstones_p20310601t0000
    FOR VALUES FROM ('2031-06-01 00:00+00') TO ('2031-06-02 00:00+00');
BEGIN;
SELECT * FROM pg_temp.claim('POST /a', 'a1', 'b');  -- another payload: 422
ROLLBACK;

-- (b) a partition of keys attached already holding a completed key, in a
-- range within max_ttl that maintenance has not made
CREATE TABLE idempotency.keys_p9attach (LIKE idempotency.keys
    INCLUDING DEFAULTS INCLUDING CONSTRAINTS, UNIQUE (key, endpoint, tenant));
INSERT INTO idempotency.keys_p9attach (tenant, endpoint, key, fingerprint, state, created_at,
                                        completed_at, expires_at, response_status)
VALUES ('acme', 'POST /b', 'b1', sha256(convert_to('a', 'UTF8')), 'completed', now(),
        now(), :'lo'::timestamptz + interval '1 hour', 201);
SELECT set_config('regress.lo', :'lo', false) IS NOT NULL AS set,
       set_config('regress.hi', :'hi', false) IS NOT NULL AS set;
DO $$
BEGIN
    EXECUTE format('ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_p9attach'
                   ' FOR VALUES FROM (%L) TO (%L)',
                   current_setting('regress.lo'), current_setting('regress.hi'));
END $$;
BEGIN;
SELECT * FROM pg_temp.claim('POST /b', 'b1', 'a');  -- the same payload: replays
ROLLBACK;
-- until maintenance learns again, a new key probes both partitions
SELECT pg_temp.flush();
BEGIN;
SELECT * FROM pg_temp.new_key_probes();
ROLLBACK;

-- Maintenance learns them again: the same answers, from what it read, and
-- a new key probes neither partition.
SELECT pg_temp.pass();
BEGIN;
SELECT * FROM pg_temp.claim('POST /a', 'a1', 'b');
SELECT * FROM pg_temp.claim('POST /b', 'b1', 'a');
ROLLBACK;
SELECT pg_temp.flush();
BEGIN;
SELECT * FROM pg_temp.new_key_probes();
ROLLBACK;

-- (c) rows written while the triggers are disabled, as pg_restore
-- --disable-triggers writes a table's data
ALTER TABLE idempotency.tombstones_default DISABLE TRIGGER ALL;
SELECT pg_temp.tombstone('POST /c', 'c1', 'a', '2032-01-01 00:00+00');
ALTER TABLE idempotency.tombstones_default ENABLE TRIGGER ALL;
ALTER TABLE idempotency.keys_p9attach DISABLE TRIGGER ALL;
SELECT pg_temp.key_row('POST /c', 'c2', 'a', :'lo'::timestamptz + interval '2 hours');
ALTER TABLE idempotency.keys_p9attach ENABLE TRIGGER ALL;
BEGIN;
SELECT * FROM pg_temp.claim('POST /c', 'c1', 'b');  -- 422
SELECT * FROM pg_temp.claim('POST /c', 'c2', 'a');  -- replays
ROLLBACK;

-- (d) while a trigger stays disabled, maintenance does not learn: rows
-- written after its pass are still found
SELECT pg_temp.pass();
ALTER TABLE idempotency.keys_default DISABLE TRIGGER ALL;
ALTER TABLE idempotency.tombstones_default DISABLE TRIGGER ALL;
SELECT pg_temp.pass();
SELECT pg_temp.tombstone('POST /d', 'd1', 'a', '2032-01-01 00:00+00');
INSERT INTO idempotency.keys_default (tenant, endpoint, key, fingerprint, state, created_at,
                                      completed_at, expires_at, response_status)
VALUES ('acme', 'POST /d', 'd2', sha256(convert_to('a', 'UTF8')), 'completed', now(),
        now(), :'hi'::timestamptz + interval '1 day', 201);
SELECT * FROM pg_temp.d_answers();  -- 422, then replays
-- ENABLE TRIGGER ALL enables the extension's triggers for ordinary
-- sessions only (it warns): a replication apply would not fire them, so
-- maintenance still learns nothing, and a new key still probes both
ALTER TABLE idempotency.keys_default ENABLE TRIGGER ALL;
ALTER TABLE idempotency.tombstones_default ENABLE TRIGGER ALL;
SELECT pg_temp.pass();
SELECT * FROM pg_temp.d_answers();
SELECT pg_temp.flush();
BEGIN;
SELECT * FROM pg_temp.new_key_probes();
ROLLBACK;
-- once they fire ALWAYS again (which the guard allows), the next pass
-- learns: the same answers, and a new key probes neither partition
ALTER TABLE idempotency.keys ENABLE ALWAYS TRIGGER keys_horizon;
ALTER TABLE idempotency.tombstones ENABLE ALWAYS TRIGGER tombstones_filter;
SELECT count(*) AS not_always FROM pg_catalog.pg_trigger
WHERE tgname IN ('keys_horizon', 'tombstones_filter') AND tgenabled <> 'A';
SELECT pg_temp.pass();
SELECT * FROM pg_temp.d_answers();
SELECT pg_temp.flush();
BEGIN;
SELECT * FROM pg_temp.new_key_probes();
ROLLBACK;

-- the guard still refuses what it refused
ALTER TABLE idempotency.keys ADD COLUMN note text;

SET client_min_messages = warning;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
