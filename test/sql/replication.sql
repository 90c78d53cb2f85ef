--
-- A published database (CREATE PUBLICATION ... FOR ALL TABLES, as blue/green
-- upgrades and CDC tools start): every table the extension writes has a
-- replica identity, its partitions too (partitions do not inherit it), so
-- that lease updates and maintenance's deletes go through.  (Skipped where
-- the worker may run a pass meanwhile.)
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = error;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
-- (a WARNING when wal_level is not logical: the publication still counts)
CREATE PUBLICATION regress_idem_all FOR ALL TABLES;
RESET client_min_messages;
\set VERBOSITY terse
SET TimeZone = 'UTC';
SET idempotency.partition_interval = '1d';
SET idempotency.max_ttl = '3d';
INSERT INTO idempotency.endpoints (endpoint, lease, tombstone_ttl) VALUES ('pay', '1 hour', '7 days');

-- the replica identity of each table of the extension, partitions made by
-- maintenance included
CREATE FUNCTION pg_temp.identities() RETURNS TABLE (relation text, identity text)
LANGUAGE sql AS $$
    SELECT regexp_replace(c.relname, '_p[0-9t]+', '_pDATE'),
           CASE c.relreplident
               WHEN 'i' THEN 'index ' || regexp_replace(
                   (SELECT i.indexrelid::regclass::text FROM pg_index i
                    WHERE i.indrelid = c.oid AND i.indisreplident), '_p[0-9t]+', '_pDATE')
                   || ' ' || (SELECT pg_get_indexdef(i.indexrelid, 0, false) ~ 'UNIQUE.*\(key, endpoint, tenant\)$'
                              FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)::text
               WHEN 'f' THEN 'full'
               WHEN 'd' THEN CASE WHEN EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
                                  THEN 'primary key' ELSE 'none' END
               ELSE 'nothing' END
    FROM pg_class c
    WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
    GROUP BY 1, 2 ORDER BY 1, 2
$$;
SELECT * FROM pg_temp.identities();

-- lease mode on the default partition (no dated partition yet): claim,
-- heartbeat, finish; fail; release
SELECT lease_token AS t1 FROM idempotency.idem_claim('acme', 'pay', 'l1', sha256('a')) \gset
SELECT idempotency.idem_heartbeat('acme', 'pay', 'l1', :t1, interval '2 hours') > now() AS extended;
SELECT idempotency.idem_finish('acme', 'pay', 'l1', 201, '{"id": 1}', lease_token => :t1);
SELECT action, response_status, response_json FROM idempotency.idem_claim('acme', 'pay', 'l1', sha256('a'));
SELECT lease_token AS t2 FROM idempotency.idem_claim('acme', 'pay', 'l2', sha256('b')) \gset
SELECT idempotency.idem_fail('acme', 'pay', 'l2', 'failed', 'declined', lease_token => :t2);
SELECT action FROM idempotency.idem_claim('acme', 'pay', 'l2', sha256('b'));
SELECT lease_token AS t3 FROM idempotency.idem_claim('acme', 'pay', 'l3', sha256('c')) \gset
SELECT idempotency.idem_release('acme', 'pay', 'l3', lease_token => :t3);
-- released: claimed afresh, and left in progress for maintenance
SELECT action FROM idempotency.idem_claim('acme', 'pay', 'l3', sha256('c'));
-- atomic mode, in a savepoint that rolls back, then for good
BEGIN;
SAVEPOINT s;
SELECT action FROM idempotency.idem_claim('acme', 'POST /a', 'a1', sha256('x'));
ROLLBACK TO SAVEPOINT s;
SELECT action FROM idempotency.idem_claim('acme', 'POST /a', 'a1', sha256('x'));
SELECT idempotency.idem_finish('acme', 'POST /a', 'a1', 200, '{"ok": true}');
COMMIT;
SELECT action, response_json FROM idempotency.idem_claim('acme', 'POST /a', 'a1', sha256('x'));

-- maintenance: a stale lease becomes unknown (update); an expired row of
-- the default partition leaves it with a tombstone; the other rows of both
-- default partitions move into dated partitions (deletes)
UPDATE idempotency.keys SET locked_until = now() - interval '1 minute'
WHERE tenant = 'acme' AND endpoint = 'pay' AND key = 'l3';
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('acme', 'pay', 'old', sha256('o'), 'completed', now() - interval '2 days', now() - interval '1 hour');
INSERT INTO idempotency.tombstones VALUES ('\x00', sha256('f'), now() - interval '1 day', now() + interval '30 days');
SELECT tableoid::regclass, count(*) FROM idempotency.keys GROUP BY 1
UNION ALL
SELECT tableoid::regclass, count(*) FROM idempotency.tombstones GROUP BY 1;
SELECT kind, regexp_replace(object, '_p[0-9t]+', '_pDATE') AS object, sum(rows) AS rows
FROM idempotency.idem_maintenance(now())
GROUP BY 1, 2 ORDER BY 1, 2;
SELECT key, state, tableoid::regclass::text ~ '^idempotency.keys_p' AS in_dated_partition
FROM idempotency.keys WHERE tenant = 'acme' ORDER BY key;
SELECT scope_hash = idempotency.idem_tombstone_hash('acme', 'pay', 'old') AS of_old
FROM idempotency.tombstones ORDER BY 1;
SELECT * FROM pg_temp.identities();

-- lease mode on a dated partition
SELECT lease_token AS t4 FROM idempotency.idem_claim('acme', 'pay', 'l4', sha256('d')) \gset
SELECT idempotency.idem_heartbeat('acme', 'pay', 'l4', :t4, interval '2 hours') > now() AS extended;
SELECT idempotency.idem_finish('acme', 'pay', 'l4', 201, '{"id": 4}', lease_token => :t4);
SELECT lease_token AS t5 FROM idempotency.idem_claim('acme', 'pay', 'l5', sha256('e')) \gset
SELECT idempotency.idem_release('acme', 'pay', 'l5', lease_token => :t5);
SELECT key, state, tableoid::regclass::text ~ '^idempotency.keys_p' AS in_dated_partition
FROM idempotency.keys WHERE key IN ('l4', 'l5') ORDER BY key;

DROP PUBLICATION regress_idem_all;
DELETE FROM idempotency.keys;
DELETE FROM idempotency.tombstones;
DELETE FROM idempotency.endpoints;
