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
