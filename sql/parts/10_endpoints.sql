-- idempotency install script: endpoint policies are cached per backend;
-- a change tells every backend to reload them.

CREATE FUNCTION idempotency.idem_endpoints_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_changed'
LANGUAGE C;

CREATE TRIGGER endpoints_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.idem_endpoints_changed();

-- Who a resolver runs as: resolver_role defaults to the role that sets the
-- resolver, who must have EXECUTE on it and the privileges of any other
-- role named; the role must have EXECUTE too (see src/resolver.c).
CREATE FUNCTION idempotency.idem_endpoints_resolver()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_resolver'
LANGUAGE C;

CREATE TRIGGER endpoints_resolver
    BEFORE INSERT OR UPDATE ON idempotency.endpoints
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_resolver();

-- The ranges of ttl and lease (positive, at most 100 years) and the
-- pointers of diagnostics_redact, refused with 22023 naming the column
-- (src/endpoint.c).  Named to fire before endpoints_resolver.
CREATE FUNCTION idempotency.idem_endpoints_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_check'
LANGUAGE C;

CREATE TRIGGER endpoints_check
    BEFORE INSERT OR UPDATE ON idempotency.endpoints
    FOR EACH ROW EXECUTE FUNCTION idempotency.idem_endpoints_check();

-- All three fire whatever session_replication_role says (a session set to
-- replica, the apply worker of a logical subscription): the checks of the
-- ranges and of the resolver cannot be skipped, and backends reload changed policies.
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_check;
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_resolver;
ALTER TABLE idempotency.endpoints ENABLE ALWAYS TRIGGER endpoints_changed;

CREATE FUNCTION idempotency.idem_key_valid(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_key_valid'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
