-- idempotency install script: privileges, granted last so that every
-- function of every part is covered.

-- PUBLIC gets nothing: every function of the schema is revoked, then the
-- client's functions are granted by name, and the admin gets every function
-- but the trigger functions.
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
                             'idem_downstream_key', 'idem_request_digest',
                             'idem_outbox_add', 'idem_outbox_lease', 'idem_outbox_record',
                             'idem_outbox_release')
               OR p.proname LIKE 'idem\_canonical\_json%')
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO idempotency_client', f);
    END LOOP;
END
$$;

GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO idempotency_admin;

-- Trigger and event trigger functions: no role but their owner may execute
-- them.  CREATE TRIGGER checks EXECUTE and firing a trigger does not: a role
-- that may execute one could attach it to a table of its own, whose columns
-- it would read as what they are not (each also refuses any table but the
-- extension's, src/util.c).  Revoked from every role that holds the right.
DO $$
DECLARE
    f regprocedure;
    r text;
BEGIN
    FOR f, r IN
        SELECT p.oid::pg_catalog.regprocedure,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END
        FROM pg_catalog.pg_proc p
        CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(p.proacl,
            pg_catalog.acldefault('f', p.proowner))) a
        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
          AND p.prorettype OPERATOR(pg_catalog.=) ANY
              (ARRAY['pg_catalog.trigger'::pg_catalog.regtype,
                     'pg_catalog.event_trigger'::pg_catalog.regtype]::pg_catalog.oid[])
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
        ORDER BY 1, 2
    LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s', f, r);
    END LOOP;
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.endpoints TO idempotency_admin;
GRANT SELECT ON idempotency.events, idempotency.stats, idempotency.health,
    idempotency.outbox_health, idempotency.outbox_operations,
    idempotency.outbox_operation_attempts
    TO idempotency_admin;

-- called by idem_import_keys (SECURITY DEFINER) alone
REVOKE EXECUTE ON FUNCTION idempotency.idem_import_check(bigint, idempotency.keys),
    idempotency.idem_import_plain_body(bytea, boolean)
    FROM idempotency_admin;

-- called by the outbox's functions (SECURITY DEFINER) alone; the admin
-- keeps idem_outbox_tenant(), which the views outbox_operations and
-- outbox_health call as their reader (the session's bound tenant: nothing
-- but the reader's own)
REVOKE EXECUTE ON FUNCTION idempotency.idem_outbox_max_bytes(),
    idempotency.idem_outbox_lock(bigint, bigint),
    idempotency.idem_outbox_cut(text, integer)
    FROM idempotency_admin;
