-- idempotency install script: tombstones of expired keys
-- (doc/tombstones.md).
--
-- When maintenance drops a partition of idempotency.keys whose range has
-- ended, or purges expired rows of its default partition, it first keeps
-- of each row whose endpoint keeps tombstones only what a later claim needs
-- to refuse the key with another payload: a keyed hash of the scope and the
-- fingerprint.  Tombstones are partitioned by their own expiry, as the keys
-- are, and leave by whole partitions too.  Only the extension writes or
-- reads them; nobody else is granted anything on the table.
CREATE TABLE idempotency.tombstones (
    scope_hash      bytea NOT NULL,     -- idem_tombstone_hash(tenant, endpoint, key)
    fingerprint     bytea NOT NULL,     -- the expired key's
    expired_at      timestamptz NOT NULL,   -- the expired key's expires_at
    expires_at      timestamptz NOT NULL,   -- expired_at + the endpoint's tombstone_ttl
    -- the Citus mode only (sql/parts/70_citus.sql): the expired key's
    -- tenant, by which the table is distributed colocated with the keys;
    -- NULL otherwise, where it costs no byte (the row header has room for
    -- the null bitmap)
    tenant          text COLLATE "C"
) PARTITION BY RANGE (expires_at);

-- Tombstones whose expiry no dated partition covers; maintenance moves them
-- into dated partitions, which it makes (tombstones_pYYYYMMDDtHHMM), each
-- with an index on scope_hash like this one.
CREATE TABLE idempotency.tombstones_default PARTITION OF idempotency.tombstones DEFAULT;
CREATE INDEX tombstones_default_scope_idx ON idempotency.tombstones_default (scope_hash);
SELECT pg_catalog.pg_extension_config_dump('idempotency.tombstones_default', '');
-- Replica identity (doc/operations.md): maintenance deletes expired rows of
-- the default partition.  No unique index: FULL, the four short columns
-- (each partition maintenance makes too, src/maint_partitions.c).
ALTER TABLE idempotency.tombstones REPLICA IDENTITY FULL;
ALTER TABLE idempotency.tombstones_default REPLICA IDENTITY FULL;

REVOKE ALL ON idempotency.tombstones, idempotency.tombstones_default FROM PUBLIC;

/*
 * Membership filters of the tombstone partitions (src/tombstone_filter.c): a
 * claim opens a partition only when its filter says the key may be there.
 * Every row written into the table adds its hash to its partition's filter
 * first, from this trigger, which each partition has as a clone; ALWAYS,
 * so that a logical replication apply adds them too.
 */
CREATE FUNCTION idempotency.idem_tombstones_filter_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_tombstones_filter_trigger'
LANGUAGE C;
COMMENT ON FUNCTION idempotency.idem_tombstones_filter_trigger() IS
    'Adds a tombstone written into idempotency.tombstones to its partition''s filter (trigger tombstones_filter)';
CREATE TRIGGER tombstones_filter BEFORE INSERT OR UPDATE ON idempotency.tombstones
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_tombstones_filter_trigger();
ALTER TABLE idempotency.tombstones ENABLE ALWAYS TRIGGER tombstones_filter;

-- The scope of a tombstone: the first 16 bytes of a SHA-256 over a label,
-- idempotency.encryption_key (when set) and the scope, never the key.
-- Admin only: EXECUTE is revoked from PUBLIC (sql/parts/99_privileges.sql).
CREATE FUNCTION idempotency.idem_tombstone_hash(tenant text, endpoint text, key text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_tombstone_hash'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_tombstone_hash(text, text, text) IS
    'The keyed hash under which a tombstone of an expired key is kept';
