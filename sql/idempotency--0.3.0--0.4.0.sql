-- idempotency 0.3.0 to 0.4.0
--
-- Kept as it is once released; the install script of 0.4.0 is assembled
-- from sql/parts.  Every change of the schema between the two versions is
-- made here too, so that an updated database equals a fresh install (the
-- regression test "upgrade" compares them).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- The tables defend themselves (README "Operations"): the triggers of
-- idempotency.endpoints fire under session_replication_role = replica too.
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_resolver;
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_changed;
