--
-- Runs of tombstones (doc/tombstones.md, "How tombstones are stored"): a
-- pass that drops a partition of keys leaving at least 1,024 tombstones
-- writes them as runs, rows of many entries each; every expired key of the
-- drop still answers as a tombstone, each entry expires on its own, and a
-- key with a fingerprint that is not a SHA-256 keeps a row of its own.
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

-- pay keeps its tombstones for the setting's 30 days
SELECT count(*) > 0 AS partitions_made
FROM idempotency.idem_maintenance(now(), preview => false) WHERE kind = 'create';

-- 6,000 finished keys of pay expiring in a second, in the partition of
-- today, written as claims leave them; and one whose fingerprint is 20
-- bytes
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
SELECT 'acme', 'pay', 'p' || i, sha256(convert_to('a' || i, 'UTF8')), 'completed',
       now(), now() + interval '1 second'
FROM generate_series(1, 6000) i;
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('acme', 'pay', 'short', '\x0102030405060708090a0b0c0d0e0f1011121314', 'completed',
        now(), now() + interval '1 second');
SELECT count(DISTINCT tableoid) = 1 AS one_partition,
       bool_and(tableoid <> 'idempotency.keys_default'::regclass) AS dated
FROM idempotency.keys;
SELECT pg_sleep(1.2);

-- the pass two days ahead drops the partition: 6,001 tombstones
SELECT kind, rows FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone';
SELECT count(*) AS keys_left FROM idempotency.keys;

-- far fewer rows than tombstones: every run holds 8 to 35 entries of 56
-- bytes, and its scope_hash (its bucket) is shorter than a hash; the key
-- with the short fingerprint has a row of its own
SELECT count(*) FILTER (WHERE octet_length(scope_hash) < 16) > 0 AS has_runs,
       count(*) < 6001 / 8 AS far_fewer_rows,
       sum(CASE WHEN octet_length(scope_hash) < 16 THEN octet_length(fingerprint) / 56 ELSE 1 END) AS tombstones,
       bool_and(octet_length(scope_hash) = 16 OR octet_length(fingerprint) % 56 = 0) AS whole_entries,
       max(octet_length(fingerprint) / 56) FILTER (WHERE octet_length(scope_hash) < 16) <= 35 AS rows_bounded,
       count(*) FILTER (WHERE octet_length(scope_hash) = 16) AS single_rows,
       count(*) FILTER (WHERE octet_length(scope_hash) = 16
                        AND scope_hash = idempotency.idem_tombstone_hash('acme', 'pay', 'short')) AS short_alone
FROM idempotency.tombstones;
-- no run is stored out of line or compressed: a claim reads it in place
SELECT bool_and(pg_column_size(fingerprint) = octet_length(fingerprint) + 4) AS in_place
FROM idempotency.tombstones WHERE octet_length(scope_hash) < 16;

-- Every expired key with another payload answers 422, with its own payload
-- executes again (pay's on_expired_reuse); a key never seen executes.
BEGIN;
SET LOCAL idempotency.max_claims_per_transaction = 20000;
SELECT count(*) FILTER (WHERE c.action = 'mismatch') AS pay_other_payload,
       count(*) FILTER (WHERE c.action <> 'mismatch') AS not_refused
FROM generate_series(1, 6000) i,
     idempotency.idem_claim('acme', 'pay', 'p' || i, sha256(convert_to('b' || i, 'UTF8'))) c;
ROLLBACK;
BEGIN;
SET LOCAL idempotency.max_claims_per_transaction = 20000;
SELECT count(*) FILTER (WHERE c.action = 'execute') AS pay_same_payload
FROM generate_series(1, 6000, 7) i,
     idempotency.idem_claim('acme', 'pay', 'p' || i, sha256(convert_to('a' || i, 'UTF8'))) c;
SELECT action FROM idempotency.idem_claim('acme', 'pay', 'short', sha256('b'));
SELECT count(*) FILTER (WHERE c.action = 'execute') AS new_keys_execute
FROM generate_series(1, 500) i,
     idempotency.idem_claim('acme', 'pay', 'never' || i, sha256(convert_to('b' || i, 'UTF8'))) c;
-- another tenant's key of the same name is another operation
SELECT action FROM idempotency.idem_claim('other', 'pay', 'p1', sha256('b'));
ROLLBACK;

-- Each entry expires on its own: a run written by hand in the format of
-- maintenance's (one byte of 4 bucket bits and the bucket, then entries
-- sorted by hash: hash, fingerprint, seconds back from the row's
-- expired_at and expires_at), two keys of one bucket, one whose tombstone
-- lives and one whose tombstone expired yesterday though its row lives on.
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
SELECT '\x04'::bytea || set_byte('\x00'::bytea, 0,
                 get_byte(idempotency.idem_tombstone_hash('acme', 'pay', 'live'), 0) & 240),
       string_agg(h || sha256(convert_to(k, 'UTF8'))
                  || int4send(0) || int4send(CASE k WHEN 'live' THEN 0 ELSE 172800 END), ''
                  ORDER BY h),
       now() - interval '1 hour', now() + interval '1 day'
FROM (SELECT k, idempotency.idem_tombstone_hash('acme', 'pay', k) AS h
      FROM (VALUES ('live')) v (k)
      UNION ALL
      (SELECT k, idempotency.idem_tombstone_hash('acme', 'pay', k)
       FROM (SELECT 'gone' || i AS k FROM generate_series(1, 100) i) g
       WHERE get_byte(idempotency.idem_tombstone_hash('acme', 'pay', k), 0) & 240
           = get_byte(idempotency.idem_tombstone_hash('acme', 'pay', 'live'), 0) & 240
       LIMIT 1)) e;
SELECT count(*) AS handmade_entries
FROM idempotency.tombstones WHERE octet_length(scope_hash) = 2 AND octet_length(fingerprint) = 112;
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'pay', 'live', sha256('other'));
SELECT c.action
FROM (SELECT 'gone' || i AS k FROM generate_series(1, 100) i) g,
     idempotency.idem_claim('acme', 'pay', g.k, sha256('other')) c
WHERE get_byte(idempotency.idem_tombstone_hash('acme', 'pay', g.k), 0) & 240
    = get_byte(idempotency.idem_tombstone_hash('acme', 'pay', 'live'), 0) & 240
LIMIT 1;
ROLLBACK;

-- A drop that leaves fewer than 1,024 tombstones writes a row each.
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
SELECT 'acme', 'pay', 'q' || i, sha256(convert_to('a' || i, 'UTF8')), 'completed',
       now(), now() + interval '1 second'
FROM generate_series(1, 100) i;
SELECT pg_sleep(1.2);
SELECT count(*) AS single_rows_before FROM idempotency.tombstones WHERE octet_length(scope_hash) = 16;
SELECT kind, rows FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone';
SELECT count(*) AS single_rows_after FROM idempotency.tombstones WHERE octet_length(scope_hash) = 16;

DROP EXTENSION idempotency;

-- A drop whose tombstones are more than maintenance_work_mem holds (1 MB:
-- 16,384 entries of 64 bytes) writes those held as runs and reads on: every
-- key still leaves a tombstone, each run's entries are sorted by hash and
-- all in its bucket.
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
SELECT count(*) > 0 AS partitions_made
FROM idempotency.idem_maintenance(now(), preview => false) WHERE kind = 'create';
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
SELECT 'acme', 'pay', 'm' || i, sha256(convert_to('a' || i, 'UTF8')), 'completed',
       now(), now() + interval '1 second'
FROM generate_series(1, 40000) i;
SELECT count(DISTINCT tableoid) = 1 AS one_partition,
       bool_and(tableoid <> 'idempotency.keys_default'::regclass) AS dated
FROM idempotency.keys;
SELECT pg_sleep(1.2);
SET maintenance_work_mem = '1MB';
SELECT kind, rows FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone';
RESET maintenance_work_mem;
SELECT count(*) AS keys_left FROM idempotency.keys;
WITH runs AS (
    SELECT scope_hash AS b, get_byte(scope_hash, 0) AS bits, fingerprint AS f, i,
           substr(fingerprint, i * 56 + 1, 16) AS h
    FROM idempotency.tombstones,
         generate_series(0, octet_length(fingerprint) / 56 - 1) i
    WHERE octet_length(scope_hash) < 16)
SELECT count(*) AS entries,
       count(DISTINCT h) AS distinct_hashes,
       bool_and(i = 0 OR substr(f, (i - 1) * 56 + 1, 16) < h) AS sorted_in_row,
       -- the bucket: the first bits of the hash, the rest of its last byte zero
       bool_and(substr(b, 2) = substr(h, 1, bits / 8)
                || CASE WHEN bits % 8 = 0 THEN ''::bytea
                   ELSE set_byte('\x00'::bytea, 0, get_byte(h, bits / 8) & 240) END) AS in_bucket,
       bool_and(bits % 4 = 0 AND bits BETWEEN 4 AND 24) AS widths,
       -- two spills of 16,384 at 8 bits, the last 7,232 at 4
       array_agg(DISTINCT bits ORDER BY bits) AS widths_used
FROM runs;
SELECT count(*) FILTER (WHERE octet_length(scope_hash) = 16) AS single_rows
FROM idempotency.tombstones;
BEGIN;
SET LOCAL idempotency.max_claims_per_transaction = 50000;
SELECT count(*) FILTER (WHERE c.action = 'mismatch') AS other_payload_refused,
       count(*) FILTER (WHERE c.action <> 'mismatch') AS not_refused
FROM generate_series(1, 40000) i,
     idempotency.idem_claim('acme', 'pay', 'm' || i, sha256(convert_to('b' || i, 'UTF8'))) c;
ROLLBACK;

DROP EXTENSION idempotency;

-- The drop reads the partition straight from its table (src/tombstone_direct.c)
-- and must make of its rows what the SQL makes of them: keys of endpoints
-- keeping tombstones for the setting (no row, a row without tombstone_ttl),
-- for an interval of months, days and hours, for none (0), and for an hour
-- (gone before the pass's time); the tombstones written are those the SQL
-- computes, each expiring within the second after the SQL's expiry.
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
SELECT count(*) > 0 AS partitions_made
FROM idempotency.idem_maintenance(now(), preview => false) WHERE kind = 'create';
INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl)
VALUES ('setting', NULL), ('months', '1 mon 2 days 3 hours'), ('none', '0'), ('hour', '1 hour');
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
SELECT 't' || (i % 3), (ARRAY['pay', 'setting', 'months', 'none', 'hour'])[1 + i % 5], 'e' || i,
       sha256(convert_to('a' || i, 'UTF8')), 'completed',
       now(), now() + interval '1 second' + (i % 50) * interval '1 millisecond'
FROM generate_series(1, 6000) i;
SELECT count(DISTINCT tableoid) = 1 AS one_partition FROM idempotency.keys;
SET TimeZone = 'America/New_York';
CREATE TEMP TABLE expected AS
SELECT idempotency.idem_tombstone_hash(s.tenant, s.endpoint, s.key) AS h, s.fingerprint AS f,
       s.expires_at AS expired_at, s.expires_at + t.ttl AS expires_at
FROM idempotency.keys s
LEFT JOIN idempotency.endpoints e ON e.endpoint = s.endpoint COLLATE "C"
CROSS JOIN LATERAL (SELECT coalesce(e.tombstone_ttl,
                    make_interval(secs => extract(epoch FROM
                        current_setting('idempotency.tombstone_ttl')::interval))) AS ttl) t
WHERE t.ttl > '0' AND s.expires_at + t.ttl > now() + interval '2 days';
SELECT pg_sleep(1.2);
SELECT kind, rows FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone';
CREATE TEMP TABLE written AS
SELECT substr(fingerprint, i * 56 + 1, 16) AS h, substr(fingerprint, i * 56 + 17, 32) AS f,
       expired_at - ('x' || encode(substr(fingerprint, i * 56 + 49, 4), 'hex'))::bit(32)::bigint
                    * interval '1 second' AS expired_at,
       expires_at - ('x' || encode(substr(fingerprint, i * 56 + 53, 4), 'hex'))::bit(32)::bigint
                    * interval '1 second' AS expires_at
FROM idempotency.tombstones, generate_series(0, octet_length(fingerprint) / 56 - 1) i
WHERE octet_length(scope_hash) < 16
UNION ALL
SELECT scope_hash, fingerprint, expired_at, expires_at
FROM idempotency.tombstones WHERE octet_length(scope_hash) = 16;
RESET TimeZone;
SELECT (SELECT count(*) FROM expected) AS expected,
       (SELECT count(*) FROM written) AS written,
       (SELECT count(*) FROM expected x JOIN written w USING (h, f)
        WHERE w.expires_at >= x.expires_at AND w.expires_at < x.expires_at + interval '1 second'
          AND w.expired_at >= x.expired_at AND w.expired_at < x.expired_at + interval '1 second') AS same,
       (SELECT count(*) FROM written w WHERE NOT EXISTS
          (SELECT FROM expected x WHERE x.h = w.h AND x.f = w.f)) AS unexpected;
DROP EXTENSION idempotency;
