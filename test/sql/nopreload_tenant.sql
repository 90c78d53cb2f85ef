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

\c - :su
DELETE FROM idempotency.keys;
DROP ROLE regress_tbn_acme;
