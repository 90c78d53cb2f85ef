-- idempotency install script: privileges, granted last so that every
-- function of every part is covered.

-- PUBLIC gets nothing: every function of the schema is revoked, then the
-- client's functions are granted by name, and the admin gets every function.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency FROM PUBLIC;
GRANT USAGE ON SCHEMA idempotency TO idempotency_client, idempotency_admin;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'idempotency'::regnamespace
          AND (p.proname IN ('idem_claim', 'idem_finish', 'idem_finish_bytes', 'idem_finish_ref',
                             'idem_release', 'idem_fail', 'idem_heartbeat',
                             'idem_fingerprint', 'idem_key_valid',
                             'idem_uuidv7', 'idem_ulid', 'idem_token',
                             'idem_downstream_key', 'idem_request_digest')
               OR p.proname LIKE 'idem\_canonical\_json%')
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO idempotency_client', f);
    END LOOP;
END
$$;

GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO idempotency_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.endpoints TO idempotency_admin;
GRANT SELECT ON idempotency.events, idempotency.stats, idempotency.health
    TO idempotency_admin;

-- called by idem_import_keys (SECURITY DEFINER) alone
REVOKE EXECUTE ON FUNCTION idempotency.idem_import_check(bigint, idempotency.keys)
    FROM idempotency_admin;
