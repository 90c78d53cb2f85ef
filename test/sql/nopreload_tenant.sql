--
-- idempotency.tenant without shared_preload_libraries: until a function of
-- the extension loads the library, the setting is a placeholder that any
-- role may SET.  Loading the library throws away what a role without the
-- right to set it gave it, so the role-level binding holds.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

SELECT current_user AS su \gset
CREATE ROLE regress_tbn_acme LOGIN;
GRANT idempotency_client TO regress_tbn_acme;
ALTER ROLE regress_tbn_acme SET idempotency.tenant = 'acme';

INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at,
                              completed_at, expires_at, response_status)
VALUES ('globex', 'POST /pay', 'g-done', sha256('g'), 'completed', now(), now(),
        now() + interval '1 hour', 201);

-- SET on the placeholder, before the library is loaded
\c - regress_tbn_acme
SET idempotency.tenant = 'globex';
SHOW idempotency.tenant;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', sha256('g'))$$) AS claim_after_placeholder_set;
SHOW idempotency.tenant;

-- the same inside a transaction that is still open when the library loads
\c - regress_tbn_acme
BEGIN;
SET LOCAL idempotency.tenant = 'globex';
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', sha256('g'))$$) AS claim_after_placeholder_set_local;
COMMIT;
SHOW idempotency.tenant;

-- in the startup packet: PostgreSQL keeps only the packet's value, which
-- the library then refuses, so the role's value is lost too
\c "dbname=contrib_regression user=regress_tbn_acme options='-c idempotency.tenant=globex'"
SHOW idempotency.tenant;
SELECT regress.try($$SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', sha256('g'))$$) AS claim_after_startup_packet;
SHOW idempotency.tenant;

-- the outbox's functions take no tenant: they read the same binding, the
-- role's, even when the startup packet's value was refused and nothing
-- else ran before them
\c - :su
INSERT INTO idempotency.outbox (tenant, key, method, url, body, next_attempt_at)
VALUES ('globex', 'g-op', 'POST', 'https://a.example/', '{}', now());
\c "dbname=contrib_regression user=regress_tbn_acme options='-c idempotency.tenant=globex'"
SELECT key FROM idempotency.idem_outbox_lease() AS leased_first_thing;
SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', key => 'a-op');
\c "dbname=contrib_regression user=regress_tbn_acme options='-c idempotency.tenant=globex'"
SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', key => 'a-op-2');
SELECT key FROM idempotency.idem_outbox_lease();
-- a record as a session's first call (the library not loaded yet) keeps
-- the response bounded by idempotency.max_response_bytes all the same
\c - :su
SELECT id AS a_id, lease_token AS a_tok FROM idempotency.outbox WHERE key = 'a-op' \gset
\c - regress_tbn_acme
SELECT idempotency.idem_outbox_record(:a_id, :a_tok, 'succeeded', 200,
                                      response_body => repeat('x', 300000)) AS recorded_first_thing;
\c - :su
SELECT tenant, key, state, octet_length(response_body) AS body_bytes FROM idempotency.outbox ORDER BY key;
DELETE FROM idempotency.outbox;

\c - :su
DELETE FROM idempotency.keys;
DROP ROLE regress_tbn_acme;
