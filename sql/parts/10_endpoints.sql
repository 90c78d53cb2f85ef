-- idempotency install script: endpoint policies are cached per backend;
-- a change tells every backend to reload them.

CREATE FUNCTION idempotency.idem_endpoints_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_endpoints_changed'
LANGUAGE C;

CREATE TRIGGER endpoints_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.idem_endpoints_changed();

CREATE FUNCTION idempotency.idem_key_valid(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_key_valid'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
