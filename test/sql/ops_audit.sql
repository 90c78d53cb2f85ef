--
-- idempotency.events is append-only for everybody but its owner.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
\set VERBOSITY terse

\d idempotency.events

-- a role that was granted UPDATE and DELETE by mistake is still refused
CREATE ROLE regress_idem_auditor;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_auditor;
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON idempotency.events TO regress_idem_auditor;
GRANT USAGE ON SEQUENCE idempotency.events_id_seq TO regress_idem_auditor;

SET ROLE regress_idem_auditor;
INSERT INTO idempotency.events (tenant, endpoint, key_hash) VALUES ('t1', 'e', 'aaaa');
UPDATE idempotency.events SET tenant = 't2' WHERE key_hash = 'aaaa';
DELETE FROM idempotency.events WHERE key_hash = 'aaaa';
TRUNCATE idempotency.events;
SELECT tenant, endpoint, key_hash FROM idempotency.events WHERE key_hash = 'aaaa';
RESET ROLE;

-- its owner decides retention
DELETE FROM idempotency.events WHERE key_hash = 'aaaa';
SELECT count(*) AS left_after_owner_delete FROM idempotency.events WHERE key_hash = 'aaaa';

REVOKE ALL ON idempotency.events FROM regress_idem_auditor;
REVOKE ALL ON SEQUENCE idempotency.events_id_seq FROM regress_idem_auditor;
REVOKE ALL ON SCHEMA idempotency FROM regress_idem_auditor;
DROP ROLE regress_idem_auditor;

--
-- With idempotency.audit on, every state change of a key is appended, in
-- the transaction that made it, under the hash of the key, by whoever
-- changed it, who needs no privilege on the table.
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql
CREATE ROLE regress_idem_audited LOGIN;
GRANT idempotency_client TO regress_idem_audited;

SET idempotency.audit = on;
SELECT coalesce(max(id), 0) AS before_id FROM idempotency.events \gset
SET ROLE regress_idem_audited;
BEGIN;
SELECT action FROM idempotency.idem_claim('t1', 'POST /audit', 'RAW-KEY-1', regress.fp('a'));
SELECT idempotency.idem_finish('t1', 'POST /audit', 'RAW-KEY-1', 201, '{}');
COMMIT;
SELECT action FROM idempotency.idem_claim('t1', 'POST /audit', 'RAW-KEY-1', regress.fp('a'));
-- a mismatch changes nothing: no event
SELECT action FROM idempotency.idem_claim('t1', 'POST /audit', 'RAW-KEY-1', regress.fp('b'));
SELECT lease_token AS tok
FROM idempotency.idem_claim('t1', 'POST /audit', 'RAW-KEY-2', regress.fp('a'),
                            lease => interval '1 hour') \gset
SELECT idempotency.idem_fail('t1', 'POST /audit', 'RAW-KEY-2', 'unknown', lease_token => :tok);
SELECT lease_token AS tok
FROM idempotency.idem_claim('t1', 'POST /audit', 'RAW-KEY-3', regress.fp('a'),
                            lease => interval '1 hour') \gset
SELECT idempotency.idem_release('t1', 'POST /audit', 'RAW-KEY-3', :tok);
-- a transaction that rolls back leaves no event
BEGIN;
SELECT action FROM idempotency.idem_claim('t1', 'POST /audit', 'RAW-KEY-4', regress.fp('a'));
ROLLBACK;
RESET ROLE;
SELECT idempotency.idem_resolve('t1', 'POST /audit', 'RAW-KEY-2', 200, '{}');
SET idempotency.audit = off;
-- off: nothing more
SELECT action FROM idempotency.idem_claim('t1', 'POST /audit', 'RAW-KEY-1', regress.fp('a'));

SELECT e.tenant, e.endpoint, k.key AS key_of_hash, e.from_state, e.to_state,
       e.replayed, e.response_status,
       e.fingerprint_prefix = left(encode(regress.fp('a'), 'hex'), 8) AS fp_prefix_ok,
       e.elapsed_ms >= 0 AS elapsed_ok,
       CASE WHEN e.actor = session_user THEN '(session user)' ELSE e.actor END AS actor
FROM idempotency.events e
LEFT JOIN (VALUES ('RAW-KEY-1'), ('RAW-KEY-2'), ('RAW-KEY-3'), ('RAW-KEY-4')) AS k(key)
       ON e.key_hash = idempotency.idem_key_hash(e.tenant, e.endpoint, k.key)
WHERE e.id > :before_id
ORDER BY e.id;
-- the raw key is nowhere in the trail
SELECT count(*) AS rows_with_raw_key
FROM idempotency.events e WHERE e::text LIKE '%RAW-KEY%';

DELETE FROM idempotency.keys WHERE endpoint = 'POST /audit';
DELETE FROM idempotency.events WHERE endpoint = 'POST /audit';
DROP ROLE regress_idem_audited;
