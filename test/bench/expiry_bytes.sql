-- test/bench/expiry_bytes.sql: what expiry writes per expired key.  :rows
-- completed keys expiring within tomorrow's (UTC) partition of
-- idempotency.keys, then one maintenance pass as of two days ahead
-- (idem_maintenance(now() + interval '2 days', preview => false)), which
-- drops that partition and, when the keys' endpoint keeps tombstones,
-- writes their tombstones first.  Measured around the pass, after a
-- CHECKPOINT: the growth of idempotency.tombstones (heap and index, every
-- partition, pg_total_relation_size) and the WAL written
-- (pg_current_wal_lsn() before and after).  Prints one line:
-- rows|tombstones written|heap+index bytes|WAL bytes|bytes of the keys dropped
-- (tombstones counted one per row, or one per entry of a run: a row whose
-- scope_hash is shorter than a hash, doc/tombstones.md).
--
-- bench.sh runs it in a fresh database whose first pass (with
-- idempotency.max_ttl 5 days) premade every partition the measured pass
-- (max_ttl 2 days) would make, so that the pass only writes tombstones and
-- drops; with idempotency.tombstone_ttl = 0 it keeps none.
\set ON_ERROR_STOP on
SET client_min_messages = warning;
SET TimeZone = 'UTC';
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, response_status,
                              body_kind, response_body, created_at, completed_at, expires_at)
SELECT 'tenant-' || (i % 100), 'POST /payments', 'k' || hashint8(i) || '-' || i,
       sha256(int8send(i)), 'completed', 201, 'json', '\x7b226964223a20317d'::bytea,
       now(), now(),
       date_trunc('day', now()) + interval '1 day' + (i % 86400) * interval '1 second'
FROM generate_series(1, :rows) i;
VACUUM ANALYZE idempotency.keys;
SELECT coalesce(sum(CASE WHEN octet_length(scope_hash) < 16 THEN octet_length(fingerprint) / 56 ELSE 1 END), 0) AS tomb_rows0 FROM idempotency.tombstones \gset
SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) AS keys0
FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass \gset
CHECKPOINT;
SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) AS tomb0
FROM pg_inherits WHERE inhparent = 'idempotency.tombstones'::regclass \gset
SELECT pg_current_wal_lsn() AS lsn0 \gset
SET idempotency.max_ttl = '2d';
SELECT count(*) FILTER (WHERE kind = 'drop') AS drops,
       count(*) FILTER (WHERE kind = 'create') AS creates
FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false) \gset
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), :'lsn0') AS wal \gset
SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) AS tomb1
FROM pg_inherits WHERE inhparent = 'idempotency.tombstones'::regclass \gset
SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) AS keys1
FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass \gset
SELECT coalesce(sum(CASE WHEN octet_length(scope_hash) < 16 THEN octet_length(fingerprint) / 56 ELSE 1 END), 0) - :tomb_rows0 AS tomb_rows FROM idempotency.tombstones \gset
SELECT count(*) AS left_over FROM idempotency.keys WHERE expires_at < now() + interval '2 days' \gset
\pset tuples_only on
\pset format unaligned
SELECT :rows, :tomb_rows, :tomb1 - :tomb0, :wal, :keys0 - :keys1, :drops, :creates, :left_over;
