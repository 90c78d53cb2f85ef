-- idempotency 0.2.0 to 0.3.0
--
-- Kept as it is once released; the install script of 0.3.0 is assembled
-- from sql/parts.  Every change of the schema between the two versions is
-- made here too, so that an updated database equals a fresh install (the
-- regression test "upgrade" compares them).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- idem_maintenance gains preview: a future as_of only reports what a pass
-- would do unless preview => false; as_of is range-checked, so the
-- function is no longer STRICT.
DROP FUNCTION idempotency.idem_maintenance(timestamptz);
CREATE FUNCTION idempotency.idem_maintenance(as_of timestamptz DEFAULT pg_catalog.now(),
                                             preview boolean DEFAULT NULL)
RETURNS TABLE (kind text, object text, rows bigint)
AS 'MODULE_PATHNAME', 'idem_maintenance'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION idempotency.idem_maintenance(timestamptz, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_maintenance(timestamptz, boolean) TO idempotency_admin;

-- A resolver runs as the endpoint's resolver_role, the role that set it
-- (checked by the trigger endpoints_resolver: EXECUTE, signature, the right
-- to name the role), no longer as the function's owner.  Rows written
-- before keep what they ran as: the function's owner.
ALTER TABLE idempotency.endpoints ADD COLUMN resolver_role regrole;
UPDATE idempotency.endpoints e
SET resolver_role = p.proowner::regrole
FROM pg_catalog.pg_proc p
WHERE p.oid = e.resolver;

CREATE FUNCTION idempotency.idem_endpoints_resolver()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_resolver'
LANGUAGE C;
REVOKE EXECUTE ON FUNCTION idempotency.idem_endpoints_resolver() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_endpoints_resolver() TO idempotency_admin;

CREATE TRIGGER endpoints_resolver
    BEFORE INSERT OR UPDATE ON idempotency.endpoints
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_resolver();
