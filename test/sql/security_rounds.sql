--
-- The security suite: attacks of the earlier security rounds (issues 6, 13
-- and 22) that no other test replays as the lowest role that could try
-- them (doc/security.md maps every attack to its test).  Each is tried as
-- a role with no grant, as one with idempotency_client alone, or as one
-- with idempotency_admin alone, and the test fails if the attack succeeds.
--
\getenv abs_srcdir PG_ABS_SRCDIR
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;

\i :abs_srcdir/include/helpers.sql

DO $$ BEGIN CREATE ROLE sr_nobody NOLOGIN;
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE sr_client NOLOGIN IN ROLE idempotency_client;
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE sr_admin NOLOGIN IN ROLE idempotency_admin;
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

-- Each call, as the current role, of every function of the schema whose
-- name is not one of those the role must be able to call (the regular
-- expression allowed; NULL: none), and what did not fail with 42501: an
-- empty list when every call is refused.  The list is the documented one
-- (doc/security.md), not the catalog's, so that a function granted by
-- mistake is called, and shows.  NULL arguments: EXECUTE is checked before
-- the call; each is a subquery, which the planner does not fold away as it
-- folds a strict function of a NULL constant.
CREATE FUNCTION sr_calls_not_refused(allowed text) RETURNS TABLE (fn text, answer text)
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    res text;
BEGIN
    FOR f IN
        SELECT p.oid, p.oid::regprocedure::text AS sig, p.prokind,
               pg_catalog.format('%s.%s(%s)', 'idempotency', pg_catalog.quote_ident(p.proname),
                   coalesce((SELECT string_agg('(SELECT NULL::' || pg_catalog.format_type(t, NULL) || ')', ', ' ORDER BY i)
                             FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY a(t, i)), '')) AS call
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'idempotency'::regnamespace
          AND (allowed IS NULL OR p.proname !~ allowed)
        ORDER BY 2
    LOOP
        IF f.prokind = 'p' THEN
            res := regress.try('CALL ' || f.call);
        ELSE
            res := regress.try('SELECT ' || f.call);
        END IF;
        IF res NOT LIKE '42501:%' THEN
            fn := f.sig;
            answer := res;
            RETURN NEXT;
        END IF;
    END LOOP;
END $$;
GRANT EXECUTE ON FUNCTION sr_calls_not_refused(text) TO sr_nobody, sr_client, sr_admin;

-- Round 0 (issue 6): PUBLIC gets nothing.  A role with no grant calls every
-- function of the schema and reads every relation: each refused.
SET ROLE sr_nobody;
SELECT count(*) > 40 AS every_function_tried
FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace;
SELECT * FROM sr_calls_not_refused(NULL);
SELECT regress.try($$SELECT idempotency.idem_claim('t', 'e', 'k', sha256('x'))$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.keys$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.endpoints$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.tombstones$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.diagnostics_secret$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.events$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.stats$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.health$$);
RESET ROLE;

-- Round 0 and 1 (issues 6 and 13): a client calls each operator function
-- (export and import of keys, lookup, resolve, maintenance with a future
-- as_of, the counters and their reset, the hashes): each refused.
SET ROLE sr_client;
SELECT * FROM sr_calls_not_refused('^(idem_claim|idem_finish|idem_finish_bytes|idem_finish_ref|idem_release|idem_fail|idem_heartbeat|idem_fingerprint|idem_key_valid|idem_uuidv7|idem_ulid|idem_token|idem_downstream_key|idem_request_digest|idem_canonical_json.*|idem_outbox_add|idem_outbox_lease|idem_outbox_record|idem_outbox_release)$');
SELECT regress.try($$SELECT count(*) FROM idempotency.idem_maintenance(now() + interval '10 years')$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.idem_export_keys('t')$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.idem_import_keys('[]')$$);
SELECT regress.try($$SELECT idempotency.idem_stats_reset()$$);
-- nor reads or writes the storage, the secret, the policies or the trail
SELECT regress.try($$SELECT count(*) FROM idempotency.tombstones$$);
SELECT regress.try($$INSERT INTO idempotency.tombstones SELECT * FROM idempotency.tombstones LIMIT 0$$);
SELECT regress.try($$SELECT secret FROM idempotency.diagnostics_secret$$);
SELECT regress.try($$UPDATE idempotency.endpoints SET store_response = true$$);
SELECT regress.try($$DELETE FROM idempotency.events$$);
RESET ROLE;

-- Round 1 (issue 13): the settings that guard stored responses and keys
-- are the superuser's; neither the client nor the admin changes them, at
-- any level, and neither reads the encryption key.
SET ROLE sr_admin;
-- the admin calls every function of the schema but one: the import's own
-- check, which only the import (as the owner) calls
SELECT * FROM sr_calls_not_refused('^(?!idem_import_check$)');
SELECT s AS setting,
       regress.try(pg_catalog.format('SET %s = %L', s, v)) AS "SET",
       regress.try(pg_catalog.format('SELECT pg_catalog.set_config(%L, %L, true)', s, v)) AS set_config
FROM (VALUES ('idempotency.encryption_key', 'guess'),
             ('idempotency.max_response_bytes', '1000000000'),
             ('idempotency.extra_sensitive_headers', ''),
             ('idempotency.tenant', 'other'),
             ('idempotency.audit', 'off'),
             ('idempotency.max_ttl', '100000000'),
             ('idempotency.diagnostics_max_mismatches', '1000'),
             ('idempotency.max_claims_per_transaction', '100000000')) AS x(s, v)
ORDER BY 1;
SELECT regress.try($$ALTER ROLE sr_admin SET idempotency.max_response_bytes = 1000000000$$);
-- (the SQLSTATE only: the message differs between server versions)
SELECT left(regress.try($$SHOW idempotency.encryption_key$$), 5) AS show_key;
-- the admin reads neither the storage nor the secret, and may not make the
-- trail forget
SELECT regress.try($$SELECT count(*) FROM idempotency.keys$$);
SELECT regress.try($$SELECT count(*) FROM idempotency.tombstones$$);
SELECT regress.try($$SELECT secret FROM idempotency.diagnostics_secret$$);
SELECT regress.try($$TRUNCATE idempotency.events$$);
SELECT regress.try($$UPDATE idempotency.events SET key_hash = 'x'$$);
RESET ROLE;

-- Round 1 (issue 13): one transaction may not hold enough claims to fill
-- the shared lock table for everybody: the client's claim past
-- idempotency.max_claims_per_transaction is refused (IK429).
SET ROLE sr_client;
BEGIN;
SELECT count(*) FILTER (WHERE action = 'execute') AS claims_held
FROM generate_series(1, current_setting('idempotency.max_claims_per_transaction')::int) i,
     LATERAL idempotency.idem_claim('sr-t', 'e', 'k' || i, sha256(i::text::bytea)) c;
SELECT regress.try($$SELECT idempotency.idem_claim('sr-t', 'e', 'one-more', sha256('x'))$$);
ROLLBACK;
RESET ROLE;

DROP FUNCTION sr_calls_not_refused(text);
DROP ROLE sr_nobody;
DROP ROLE sr_client;
DROP ROLE sr_admin;
