-- idempotency install script: maintenance (stale leases, partitions).
--
-- Dated partitions of idempotency.keys are made by maintenance, never here:
-- CREATE EXTENSION makes only the default partition, and partitions made
-- later are ordinary tables that pg_dump saves with their rows.

-- One maintenance pass as if the clock read as_of; one row per action:
--   lease_unknown / lease_completed / lease_failed / resolver_error
--       (object: endpoint; rows: keys),
--   purge (keys_default; expired rows deleted from the default partition;
--       tombstones_default: expired tombstones deleted from it),
--   tombstone (keys_default or a partition of keys being dropped;
--       tombstones written of its expired rows, see 74_tombstones.sql),
--   create (partition; rows moved into it from the default partition),
--   drop (partition; rows as estimated by pg_class.reltuples, NULL if never
--       counted),
--   skipped (object whose lock was not granted within the lock_timeout),
--   busy (another pass of this database is running; nothing was done).
-- With preview, or when preview is NULL and as_of lies in the future, it
-- only reports what the pass would do (lease_resolve: stale leases the
-- resolver would be asked about) and changes nothing.  as_of must lie in
-- [1970-01-01, 9000-01-01) UTC.
-- Admin only: EXECUTE is revoked from PUBLIC.
CREATE FUNCTION idempotency.idem_maintenance(as_of timestamptz DEFAULT pg_catalog.now(),
                                             preview boolean DEFAULT NULL)
RETURNS TABLE (kind text, object text, rows bigint)
AS 'MODULE_PATHNAME', 'idem_maintenance'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE EXECUTE ON FUNCTION idempotency.idem_maintenance(timestamptz, boolean) FROM PUBLIC;
