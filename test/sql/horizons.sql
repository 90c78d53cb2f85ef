--
-- Key horizons (src/horizon.c): a claim opens only the partitions of
-- idempotency.keys that can hold its endpoint's rows, and still finds every
-- row, whether a claim, SQL (the trigger keys_horizon) or maintenance
-- (learning, the TAP test 063_horizons) made it known.  Horizons live in
-- shared memory: without the library preloaded every partition is probed.
--
SELECT current_setting('shared_preload_libraries') !~ 'idempotency' AS not_preloaded \gset
\if :not_preloaded
\echo 'skipped: key horizons need the library in shared_preload_libraries'
\quit
\endif
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
-- start from an empty store, whatever earlier tests left
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
RESET client_min_messages;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql
SET TimeZone = 'UTC';
SET idempotency.partition_interval = '1d';
SET idempotency.max_ttl = '30d';
-- premake 30 days of partitions, and learn the horizons of this database
SELECT count(*) >= 0 AS pass FROM idempotency.idem_maintenance();
SELECT count(*) >= 30 AS partitions_ahead
FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass;

-- the dated partitions of keys this transaction has opened
CREATE FUNCTION regress.key_partitions_opened() RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
    WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
      AND c.relkind = 'r' AND c.relname ~ '^keys_p'
$$;

-- a new key of an endpoint whose keys live a day: the partition of now and
-- the next one, whatever max_ttl
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-a', regress.fp('a'), ttl => '1 day');
SELECT idempotency.idem_finish('t', 'POST /h1', 'h1-a', 201, '{}');
SELECT regress.key_partitions_opened() BETWEEN 1 AND 2 AS bounded;
COMMIT;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-b', regress.fp('a'), ttl => '1 day');
SELECT regress.key_partitions_opened() BETWEEN 1 AND 2 AS bounded;
ROLLBACK;
SELECT action, replayed FROM idempotency.idem_claim('t', 'POST /h1', 'h1-a', regress.fp('a'));
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-a', regress.fp('b'));

-- one key of 20 days: the endpoint's claims open 20 days of partitions
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h2', 'h2-a', regress.fp('a'), ttl => '20 days');
SELECT idempotency.idem_finish('t', 'POST /h2', 'h2-a', 201, '{}');
COMMIT;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h2', 'h2-b', regress.fp('a'), ttl => '1 day');
SELECT regress.key_partitions_opened() >= 20 AS follows_the_longest;
ROLLBACK;
SELECT action, replayed FROM idempotency.idem_claim('t', 'POST /h2', 'h2-a', regress.fp('a'));
-- other endpoints keep their own
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-c', regress.fp('a'), ttl => '1 day');
SELECT regress.key_partitions_opened() BETWEEN 1 AND 2 AS bounded;
ROLLBACK;

-- a row written by SQL, of an endpoint no claim has used: the trigger
-- raises its horizon, and the claim finds it
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, response_status,
                              response_headers, body_kind, response_body, created_at,
                              completed_at, expires_at)
VALUES ('t', 'POST /h3', 'h3-a', regress.fp('a'), 'completed', 201, '{}', 'json',
        convert_to('{"n": 3}', 'UTF8'), now(), now(), now() + interval '25 days');
SELECT action, replayed, response_json FROM idempotency.idem_claim('t', 'POST /h3', 'h3-a', regress.fp('a'));
SELECT action FROM idempotency.idem_claim('t', 'POST /h3', 'h3-a', regress.fp('b'));
-- and when SQL moves it further
UPDATE idempotency.keys SET expires_at = now() + interval '29 days' WHERE key = 'h3-a';
SELECT action, replayed FROM idempotency.idem_claim('t', 'POST /h3', 'h3-a', regress.fp('a'));
-- idem_import_keys writes by SQL too
SELECT outcome, rows FROM idempotency.idem_import_keys(
    (SELECT jsonb_agg(e || '{"endpoint": "POST /h4", "key": "h4-a"}')
     FROM idempotency.idem_export_keys('t') e WHERE e->>'key' = 'h2-a'))
WHERE rows > 0;
SELECT action, replayed FROM idempotency.idem_claim('t', 'POST /h4', 'h4-a', regress.fp('a'));

-- The default partition of keys holds the rows no dated partition covers.
-- A claim opens it only when a row of its endpoint may be there (the bound
-- dflt of horizon.c): a claim of a new key of an endpoint keeping
-- tombstones, which looks for the expired rows of its scope too, does not
-- open it, and a row written there by a claim, or by SQL live or expired,
-- is still found.
CREATE FUNCTION regress.default_partition_opened() RETURNS boolean
LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation'
                   AND relation = 'idempotency.keys_default'::regclass)
$$;
SELECT current_setting('idempotency.tombstone_ttl')::interval > interval '0' AS keeps_tombstones,
       NOT EXISTS (SELECT FROM idempotency.endpoints WHERE endpoint = 'POST /h1') AS by_default;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-d', regress.fp('a'));
SELECT regress.default_partition_opened() AS default_opened;
ROLLBACK;
-- a key outliving the dated partitions, written by a claim
SET idempotency.max_ttl = '60d';
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /hd1', 'hd1-a', regress.fp('a'), ttl => '45 days');
SELECT idempotency.idem_finish('t', 'POST /hd1', 'hd1-a', 201, '{}');
COMMIT;
SELECT tableoid::regclass AS partition FROM idempotency.keys WHERE key = 'hd1-a';
BEGIN;
SELECT action, replayed FROM idempotency.idem_claim('t', 'POST /hd1', 'hd1-a', regress.fp('a'));
SELECT regress.default_partition_opened() AS default_opened;
ROLLBACK;
SELECT action FROM idempotency.idem_claim('t', 'POST /hd1', 'hd1-a', regress.fp('b'));
-- and by SQL (the trigger keys_horizon), live and expired
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, response_status,
                              response_headers, body_kind, response_body, created_at,
                              completed_at, expires_at)
VALUES ('t', 'POST /hd2', 'hd2-a', regress.fp('a'), 'completed', 201, '{}', 'json',
        convert_to('{"n": 2}', 'UTF8'), now(), now(), now() + interval '45 days'),
       ('t', 'POST /hd3', 'hd3-a', regress.fp('a'), 'completed', 201, '{}', 'json',
        convert_to('{"n": 3}', 'UTF8'), now() - interval '10 days', now() - interval '10 days',
        now() - interval '3 days');
SELECT key, tableoid::regclass AS partition FROM idempotency.keys
WHERE key IN ('hd2-a', 'hd3-a') ORDER BY key;
SELECT action, replayed FROM idempotency.idem_claim('t', 'POST /hd2', 'hd2-a', regress.fp('a'));
SELECT action FROM idempotency.idem_claim('t', 'POST /hd3', 'hd3-a', regress.fp('b'));
SET idempotency.max_ttl = '30d';

-- Tombstone filters (src/tombstone_probe.c, src/tombstone_filter.c): a pass as of 30
-- days ahead drops every partition of keys and keeps a tombstone of each
-- key; a claim of a new key reads none of the tombstone partitions, and a
-- claim of an expired key with another payload still finds its tombstone.
-- A partition read is one whose index was scanned (the transaction's own
-- counts, taken before and after: a claim gives its locks back).
CREATE FUNCTION regress.tombstone_scans(OUT idx oid, OUT n bigint) RETURNS SETOF record
LANGUAGE sql AS $$
    SELECT i.indexrelid, pg_stat_get_xact_numscans(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
    WHERE c.relkind = 'r' AND c.relnamespace = 'idempotency'::regnamespace
      AND c.relname ~ '^tombstones_'
$$;
CREATE TEMP TABLE tombstone_scans0 (idx oid, n bigint);
CREATE FUNCTION regress.tombstone_scans_mark() RETURNS void
LANGUAGE sql AS $$
    DELETE FROM tombstone_scans0;
    INSERT INTO tombstone_scans0 SELECT * FROM regress.tombstone_scans();
$$;
CREATE FUNCTION regress.tombstone_partitions_opened() RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*) FROM regress.tombstone_scans() s
    LEFT JOIN tombstone_scans0 s0 USING (idx)
    WHERE s.n > coalesce(s0.n, 0)
$$;
SET idempotency.tombstone_partition_interval = '1d';
SELECT count(*) FILTER (WHERE kind = 'tombstone') > 0 AS tombstoned
FROM idempotency.idem_maintenance(now() + interval '30 days', preview => false);
SELECT count(*) >= 4 AS tombstones_kept FROM idempotency.tombstones WHERE expires_at > now();
SELECT count(DISTINCT tableoid) >= 2 AS in_partitions FROM idempotency.tombstones;
BEGIN;
SELECT regress.tombstone_scans_mark();
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-new', regress.fp('a'));
SELECT regress.tombstone_partitions_opened() AS tombstone_partitions_opened;
ROLLBACK;
BEGIN;
SELECT regress.tombstone_scans_mark();
SELECT action, http_status FROM idempotency.idem_claim('t', 'POST /h1', 'h1-a', regress.fp('b'));
SELECT regress.tombstone_partitions_opened() >= 1 AS its_partition_opened;
ROLLBACK;
SELECT action FROM idempotency.idem_claim('t', 'POST /h2', 'h2-a', regress.fp('b'));
SELECT action FROM idempotency.idem_claim('t', 'POST /h3', 'h3-a', regress.fp('b'));
-- a tombstone written by SQL (a restore, a replication apply) is found too
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
VALUES (idempotency.idem_tombstone_hash('t', 'POST /h5', 'h5-a'), regress.fp('a'),
        now() - interval '1 day', now() + interval '9 days');
SELECT action FROM idempotency.idem_claim('t', 'POST /h5', 'h5-a', regress.fp('b'));

-- The bound: at max_ttl 30 days, with an endpoint keeping its tombstones
-- 10 years and tombstones stored, a claim of a new key holds at most 8
-- relation locks of the extension's relations, all fast-path (atomic mode:
-- claim and finish in one transaction; lease mode: the claim's own), once
-- the session has read the endpoint's policy.
INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl) VALUES ('POST /decade', '10 years');
SELECT count(*) >= 0 AS pass FROM idempotency.idem_maintenance();
CREATE FUNCTION regress.extension_locks(OUT locks bigint, OUT fast_path bigint)
LANGUAGE sql AS $$
    SELECT count(*), count(*) FILTER (WHERE l.fastpath)
    FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
    WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
      AND c.relnamespace = 'idempotency'::regnamespace
$$;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-warm', regress.fp('a'));
ROLLBACK;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-bound', regress.fp('a'));
SELECT idempotency.idem_finish('t', 'POST /h1', 'h1-bound', 201, '{}');
SELECT locks <= 8 AS bounded, locks = fast_path AS all_fast_path FROM regress.extension_locks();
COMMIT;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-lease', regress.fp('a'), lease => '1 min');
SELECT locks <= 8 AS bounded, locks = fast_path AS all_fast_path FROM regress.extension_locks();
COMMIT;
SELECT action, replayed FROM idempotency.idem_claim('t', 'POST /h1', 'h1-bound', regress.fp('a'));
-- The bound does not depend on what the filters answer: a scope with a
-- tombstone in many partitions (each partition's filter knows it, so each
-- is read) is claimed, and the claim still holds at most 8 locks, since a
-- tombstone partition is locked only while it is read.
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
SELECT idempotency.idem_tombstone_hash('t', 'POST /h1', 'h1-many'), regress.fp('a'),
       now() - interval '1 day', b.lower + interval '1 minute'
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
     LATERAL (SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                   'FROM \(''([^'']+)''\)'))[1]::timestamptz AS lower) b
WHERE i.inhparent = 'idempotency.tombstones'::regclass AND b.lower > now();
SELECT count(DISTINCT tableoid) >= 8 AS in_many_partitions FROM idempotency.tombstones
WHERE scope_hash = idempotency.idem_tombstone_hash('t', 'POST /h1', 'h1-many');
BEGIN;
SELECT regress.tombstone_scans_mark();
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-many', regress.fp('b'));
SELECT regress.tombstone_partitions_opened() >= 8 AS many_partitions_read;
SELECT locks <= 8 AS bounded, locks = fast_path AS all_fast_path FROM regress.extension_locks();
ROLLBACK;

-- A tombstone in the default partition of tombstones, moved into a dated
-- partition that a later pass makes (written back through the parent once
-- the partition is attached): the partition's filter has it, and the claim
-- finds it.
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
VALUES (idempotency.idem_tombstone_hash('t', 'POST /h6', 'h6-a'), regress.fp('a'),
        now() - interval '1 day', now() + interval '5 years 1 day');
SELECT tableoid::regclass = 'idempotency.tombstones_default'::regclass AS in_default
FROM idempotency.tombstones
WHERE scope_hash = idempotency.idem_tombstone_hash('t', 'POST /h6', 'h6-a');
-- an endpoint keeping tombstones 5 years: the next pass makes their window
INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl) VALUES ('POST /lustrum', '5 years');
SELECT count(*) >= 0 AS pass FROM idempotency.idem_maintenance();
SELECT tableoid::regclass <> 'idempotency.tombstones_default'::regclass AS moved FROM idempotency.tombstones
WHERE scope_hash = idempotency.idem_tombstone_hash('t', 'POST /h6', 'h6-a');
SELECT action FROM idempotency.idem_claim('t', 'POST /h6', 'h6-a', regress.fp('b'));

-- A backend's copy of the layout of the filters (src/tombstone_filter.c) is read
-- again when the layout changed after the copy was made: a claim reads the
-- filters without the lock while a shared counter has not moved.  First a
-- claim makes the copy; then a tombstone is written into a dated partition
-- of the 10-year window that held none (the partition's filter is made),
-- and a claim of its key is still refused.
CREATE TEMP TABLE h7 AS SELECT now() + interval '10 years 3 days' AS expires_at;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-copy', regress.fp('a'));
ROLLBACK;
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
SELECT idempotency.idem_tombstone_hash('t', 'POST /h7', 'h7-a'), regress.fp('a'),
       now() - interval '1 day', expires_at
FROM h7;
ALTER TABLE h7 ADD part regclass;
UPDATE h7 SET part = (SELECT tableoid FROM idempotency.tombstones
                      WHERE scope_hash = idempotency.idem_tombstone_hash('t', 'POST /h7', 'h7-a'));
-- its partition, a dated one, holds this tombstone only
SELECT part <> 'idempotency.tombstones_default'::regclass AS dated,
       (SELECT count(*) FROM idempotency.tombstones t WHERE t.tableoid = part) AS rows
FROM h7;
SELECT action FROM idempotency.idem_claim('t', 'POST /h7', 'h7-a', regress.fp('b'));
-- Then 2,100 tombstones more in that partition: its filter's first
-- generation (2,048 hashes) fills, and a second one is added; a claim of a
-- key of the second generation is refused.
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
SELECT idempotency.idem_tombstone_hash('t', 'POST /h8', 'h8-' || i), regress.fp('a'),
       now() - interval '1 day', expires_at
FROM h7, generate_series(1, 2100) i;
SELECT count(*) AS rows FROM idempotency.tombstones t, h7 WHERE t.tableoid = part;
SELECT action FROM idempotency.idem_claim('t', 'POST /h8', 'h8-2100', regress.fp('b'));
SELECT action FROM idempotency.idem_claim('t', 'POST /h8', 'h8-2080', regress.fp('b'));
SELECT action FROM idempotency.idem_claim('t', 'POST /h8', 'h8-2060', regress.fp('b'));

-- A backend's cache of the partitions of idempotency.tombstones
-- (src/tombstone_probe.c): a claim whose scope no filter can hold learns
-- it from the cache and the filters, without opening the table, and the
-- cache is forgotten when a partition is made or attached.  A claim of a
-- new key fills the cache; then a partition is made (as pg_dump would
-- bring one back) holding a tombstone, and a claim of its key with
-- another payload, in the same session, is refused.
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-cached', regress.fp('a'));
ROLLBACK;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h1', 'h1-cached-2', regress.fp('a'));
ROLLBACK;
CREATE TABLE idempotency.tombstones_p230001010000 PARTITION OF idempotency.tombstones
    FOR VALUES FROM ('2300-01-01 00:00+00') TO ('2300-01-02 00:00+00');
CREATE INDEX ON idempotency.tombstones_p230001010000 (scope_hash);
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
VALUES (idempotency.idem_tombstone_hash('t', 'POST /h9', 'h9-a'), regress.fp('a'),
        now() - interval '1 day', '2300-01-01 12:00+00');
SELECT tableoid::regclass AS part FROM idempotency.tombstones
WHERE scope_hash = idempotency.idem_tombstone_hash('t', 'POST /h9', 'h9-a');
SELECT action FROM idempotency.idem_claim('t', 'POST /h9', 'h9-a', regress.fp('b'));
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h9', 'h9-new', regress.fp('b'));
ROLLBACK;
-- and once it is dropped, its tombstone with it, the key is new
SET idempotency.ddl_guard = off;
DROP TABLE idempotency.tombstones_p230001010000;
RESET idempotency.ddl_guard;
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /h9', 'h9-a', regress.fp('b'));
ROLLBACK;
