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
