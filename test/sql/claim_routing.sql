--
-- Claims and finishes write straight into the partition that covers the
-- key's expiry time, also when that partition's columns are laid out
-- differently from the parent's, and read the scope from every partition.
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

-- partitions made by hand, which the DDL guard refuses (test defend)
SET idempotency.ddl_guard = off;
-- a partition whose column order differs from the parent's, with a dropped
-- column, and whose unique index lists the scope's columns in another order
CREATE TABLE idempotency.keys_routing_test (
    dropped_later int,
    expires_at timestamptz NOT NULL,
    key text COLLATE "C" NOT NULL,
    endpoint text COLLATE "C" NOT NULL,
    tenant text COLLATE "C" NOT NULL,
    fingerprint bytea NOT NULL,
    state text NOT NULL,
    lease_token bigint,
    locked_until timestamptz,
    response_status integer,
    response_headers jsonb,
    body_kind text,
    body_encrypted boolean NOT NULL DEFAULT false,
    response_body bytea,
    body_ref text,
    fail_reason text,
    created_at timestamptz NOT NULL,
    request_digest bytea,
    completed_at timestamptz,
    UNIQUE (tenant, endpoint, key),
    CONSTRAINT keys_state_check
        CHECK (state IN ('in_progress', 'completed', 'failed', 'unknown')),
    CONSTRAINT keys_body_kind_check
        CHECK (body_kind IN ('json', 'bytes', 'ref', 'omitted'))
);
ALTER TABLE idempotency.keys_routing_test DROP COLUMN dropped_later;
ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_routing_test
    FOR VALUES FROM (now() + interval '5 days 1 hour') TO (now() + interval '5 days 3 hours');

-- a key that expires in five days and two hours goes there, one that expires in a day does not
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /r', 'r-1', sha256('\x01'), ttl => '5 days 2 hours');
SELECT idempotency.idem_finish('acme', 'POST /r', 'r-1', 201, '{"in": "dated partition"}');
SELECT action FROM idempotency.idem_claim('acme', 'POST /r', 'r-2', sha256('\x01'), ttl => '1 day');
SELECT idempotency.idem_finish('acme', 'POST /r', 'r-2', 201, '{"in": "default partition"}');
COMMIT;
SELECT key, tableoid::regclass AS partition, state, response_status
FROM idempotency.keys WHERE endpoint = 'POST /r' ORDER BY key;

-- both replay, each found in its own partition
SELECT action, response_json
FROM idempotency.idem_claim('acme', 'POST /r', 'r-1', sha256('\x01')) ;
SELECT action, response_json
FROM idempotency.idem_claim('acme', 'POST /r', 'r-2', sha256('\x01'));
-- a leased claim is routed too, and its lease works across the layouts
SELECT lease_token AS token FROM idempotency.idem_claim('acme', 'POST /r', 'r-3', sha256('\x01'), ttl => '5 days 2 hours', lease => '1 min') \gset
SELECT state, lease_held FROM idempotency.idem_lookup('acme', 'POST /r', 'r-3');
SELECT idempotency.idem_finish('acme', 'POST /r', 'r-3', 200, lease_token => :token);
SELECT key, tableoid::regclass AS partition, state FROM idempotency.keys WHERE key = 'r-3';

-- the unique index of the partition is the safety net: a second live row
-- of the scope cannot be written, even behind the claim's back
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('acme', 'POST /r', 'r-1', sha256('\x01'), 'completed', now(), now() + interval '5 days 2 hours');

-- a partition whose range has ended holds only expired rows: a claim of a
-- scope with a row there starts afresh (without tombstones: with them the
-- expired row would refuse another fingerprint, see the test tombstones;
-- so up to the drop of these partitions below)
SET idempotency.tombstone_ttl = 0;
CREATE TABLE idempotency.keys_routing_past (LIKE idempotency.keys INCLUDING ALL);
ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_routing_past
    FOR VALUES FROM (now() - interval '3 days') TO (now() - interval '2 days');
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at, response_status)
VALUES ('acme', 'POST /r', 'r-old', sha256('\x01'), 'completed', now() - interval '4 days', now() - interval '2 days 12 hours', 299);
SELECT count(*) AS visible FROM idempotency.idem_lookup('acme', 'POST /r', 'r-old');
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /r', 'r-old', sha256('\x02'));
SELECT idempotency.idem_finish('acme', 'POST /r', 'r-old', 201);
COMMIT;
SELECT tableoid::regclass AS partition, state, response_status
FROM idempotency.keys WHERE key = 'r-old' ORDER BY expires_at;

-- The direct insert keeps every index of the partition, but gives the lease
-- index (PARTITION_lease_idx, leased claims in progress) only the rows that
-- belong in it: what an index scan finds is what a sequential scan finds.
-- (The partitions made here by hand have no lease index; the default
-- partition has one.)
SELECT lease_token AS token FROM idempotency.idem_claim('acme', 'POST /r', 'r-4', sha256('\x01'), ttl => '5 days 2 hours', lease => '1 min') \gset
SELECT action FROM idempotency.idem_claim('acme', 'POST /r', 'r-5', sha256('\x01'), lease => '1 min');
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /r', 'r-6', sha256('\x01'), ttl => '5 days 2 hours');
SELECT idempotency.idem_finish('acme', 'POST /r', 'r-6', 201);
SELECT action FROM idempotency.idem_claim('acme', 'POST /r', 'r-7', sha256('\x01'));
SELECT idempotency.idem_finish('acme', 'POST /r', 'r-7', 201);
COMMIT;
SELECT key, tableoid::regclass AS partition, state,
       to_regclass(tableoid::regclass::text || '_lease_idx') IS NOT NULL AS has_lease_index
FROM idempotency.keys WHERE key IN ('r-4', 'r-5', 'r-6', 'r-7') ORDER BY key;
SET enable_seqscan = off;
SELECT array_agg(key ORDER BY key) AS leased_through_index FROM idempotency.keys
WHERE endpoint = 'POST /r' AND state = 'in_progress' AND locked_until > now() - interval '1 hour';
RESET enable_seqscan;
SET enable_indexscan = off;
SET enable_bitmapscan = off;
SELECT array_agg(key ORDER BY key) AS leased_through_seqscan FROM idempotency.keys
WHERE endpoint = 'POST /r' AND state = 'in_progress' AND locked_until > now() - interval '1 hour';
RESET enable_indexscan;
RESET enable_bitmapscan;
SELECT idempotency.idem_release('acme', 'POST /r', 'r-4', :token);

-- a partition that is not an ordinary table (here a partitioned one) cannot
-- be read or written directly: claims refuse it, even while it is empty
CREATE TABLE idempotency.keys_routing_sub
    (LIKE idempotency.keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (expires_at);
ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_routing_sub
    FOR VALUES FROM (now() + interval '6 days') TO (now() + interval '6 days 1 hour');
SELECT action FROM idempotency.idem_claim('acme', 'POST /r', 'r-8', sha256('\x01'));
ALTER TABLE idempotency.keys DETACH PARTITION idempotency.keys_routing_sub;
DROP TABLE idempotency.keys_routing_sub;

DROP TABLE idempotency.keys_routing_test, idempotency.keys_routing_past;
RESET idempotency.ddl_guard;
RESET idempotency.tombstone_ttl;
DELETE FROM idempotency.keys WHERE endpoint = 'POST /r';
