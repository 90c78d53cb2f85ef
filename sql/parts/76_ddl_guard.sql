-- idempotency install script: the DDL guard of the tables of keys and
-- tombstones (src/ddl_guard.c, doc/operations.md).
--
-- Claims write idempotency.keys and idempotency.tombstones directly, not
-- through the executor, so DDL that changes what a row must hold (columns,
-- constraints, triggers, rules, row security) or which partitions hold the
-- rows is refused on them unless the extension runs it (its scripts and
-- maintenance).  Event triggers are created by superusers only, as
-- CREATE EXTENSION idempotency is run.
CREATE FUNCTION idempotency.idem_ddl_guard()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_ddl_guard'
LANGUAGE C;

CREATE EVENT TRIGGER idempotency_ddl_guard ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE', 'ALTER INDEX', 'ALTER TRIGGER', 'ALTER RULE',
                 'ALTER POLICY', 'CREATE TABLE', 'CREATE INDEX',
                 'CREATE TRIGGER', 'CREATE RULE', 'CREATE POLICY',
                 'DROP TABLE', 'DROP INDEX')
    EXECUTE FUNCTION idempotency.idem_ddl_guard();
