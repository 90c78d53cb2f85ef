-- idempotency 0.3.0 to 0.4.0
--
-- Kept as it is once released; the install script of 0.4.0 is assembled
-- from sql/parts.  Every change of the schema between the two versions is
-- made here too, so that an updated database equals a fresh install (the
-- regression test "upgrade" compares them).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- The tables defend themselves (doc/operations.md): the triggers of
-- idempotency.endpoints fire under session_replication_role = replica too.
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_resolver;
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_changed;

-- The tables defend themselves (doc/operations.md): the DDL guard of the
-- tables of keys and tombstones, as in sql/parts/76_ddl_guard.sql.
CREATE FUNCTION idempotency.idem_ddl_guard()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_ddl_guard'
LANGUAGE C;
REVOKE EXECUTE ON FUNCTION idempotency.idem_ddl_guard() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_ddl_guard() TO idempotency_admin;

CREATE EVENT TRIGGER idempotency_ddl_guard ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE', 'ALTER INDEX', 'ALTER TRIGGER', 'ALTER RULE',
                 'ALTER POLICY', 'CREATE TABLE', 'CREATE INDEX',
                 'CREATE TRIGGER', 'CREATE RULE', 'CREATE POLICY',
                 'DROP TABLE', 'DROP INDEX')
    EXECUTE FUNCTION idempotency.idem_ddl_guard();
