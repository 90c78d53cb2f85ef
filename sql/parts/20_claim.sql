-- idempotency install script: the claim/finish protocol.
--
-- Clients need no rights on idempotency.keys: the functions read and write
-- it directly, and run what SQL they need as the table's owner with a
-- pinned search_path (src/idempotency.c).  They are not SECURITY DEFINER,
-- which would cost every call a switch of user and settings.

CREATE TYPE idempotency.claim_result AS (
    action           text,          -- execute | replay | in_progress | mismatch | pending | expired
    http_status      integer,       -- what to answer, unless action = execute
    error_code       text,          -- request_in_progress | idempotency_key_reuse | outcome_pending | key_expired
    retry_after      integer,       -- seconds, for the Retry-After header of a 409
    response_status  integer,       -- replay: the stored status
    response_headers jsonb,         -- replay: stored headers plus Idempotent-Replayed and Idempotency-Key
    response_body    bytea,         -- replay: the stored body, byte for byte
    response_json    jsonb,         -- replay: the stored body, when it was JSON
    lease_token      bigint,        -- execute in lease mode: present it to finish
    expires_at       timestamptz,   -- when the key is forgotten
    replayed         boolean,
    response_body_ref text,         -- replay: where the body is, when it was stored as a reference
    mismatch         jsonb          -- mismatch: the members that differ, when both requests had a digest
);

CREATE FUNCTION idempotency.idem_claim(
    tenant text, endpoint text, key text, fingerprint bytea,
    ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
    wait interval DEFAULT NULL, digest bytea DEFAULT NULL)
RETURNS idempotency.claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_finish(
    tenant text, endpoint text, key text, status integer,
    body jsonb DEFAULT NULL, headers jsonb DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_finish_bytes(
    tenant text, endpoint text, key text, status integer,
    body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish_bytes'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_finish_ref(
    tenant text, endpoint text, key text, status integer, body_ref text,
    headers jsonb DEFAULT NULL, lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish_ref'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_fail(
    tenant text, endpoint text, key text,
    outcome text DEFAULT 'unknown', reason text DEFAULT NULL,
    lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_release(
    tenant text, endpoint text, key text, lease_token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_heartbeat(
    tenant text, endpoint text, key text, lease_token bigint, extend interval)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_heartbeat'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_resolve(
    tenant text, endpoint text, key text, status integer, body jsonb,
    headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_resolve'
LANGUAGE C VOLATILE;

CREATE FUNCTION idempotency.idem_lookup(tenant text, endpoint text, key text)
RETURNS TABLE (state text, fingerprint bytea, lease_held boolean,
               created_at timestamptz, completed_at timestamptz,
               expires_at timestamptz, locked_until timestamptz,
               response_status integer)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE
ROWS 1;
