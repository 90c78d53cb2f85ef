-- idempotency install script: the outbox (doc/calling.md), the calling
-- side of the protocol.
--
-- An application that calls an idempotent API adds the call to the outbox
-- in the transaction of the business write that wants it
-- (idem_outbox_add): the operation and its Idempotency-Key exist exactly
-- when that transaction commits.  A sender (clients/node, clients/python)
-- leases due operations (idem_outbox_lease), sends each with its key,
-- records each attempt's outcome (idem_outbox_record) and gives back what
-- it did not send (idem_outbox_release); an operator puts an operation
-- that needs attention back (idem_outbox_retry).  Maintenance removes
-- finished operations after idempotency.outbox_retention (src/maint_outbox.c).
--
-- The tables are written by SQL, through these functions alone (SECURITY
-- DEFINER, every name qualified): nobody but the owner is granted anything
-- on them.  Their rows are the application's, so pg_dump keeps them.

CREATE TABLE idempotency.outbox (
    id                  bigserial PRIMARY KEY,
    -- the session's bound tenant (idempotency.tenant), NULL when unbound
    tenant              text COLLATE "C",
    key                 text COLLATE "C" NOT NULL,
    method              text NOT NULL
                        CHECK (method IN ('POST', 'PUT', 'PATCH', 'DELETE', 'GET')),
    url                 text NOT NULL,
    body                jsonb NOT NULL,
    headers             jsonb NOT NULL DEFAULT '{}',
    state               text NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'in_flight', 'succeeded', 'failed', 'attention')),
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL,
    lease_token         bigint,
    locked_until        timestamptz,
    -- when the current lease was taken: the start of the attempt it records
    leased_at           timestamptz,
    last_status         integer,
    last_error          text,
    response_status     integer,
    response_headers    jsonb,
    response_body       text,
    created_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    first_attempt_at    timestamptz,
    finished_at         timestamptz,
    -- a key names one operation of a tenant (the unbound sessions' NULL
    -- tenant is one tenant too)
    CONSTRAINT outbox_tenant_key_key UNIQUE NULLS NOT DISTINCT (tenant, key),
    CHECK ((state = 'in_flight') = (lease_token IS NOT NULL AND locked_until IS NOT NULL)),
    CHECK ((state IN ('succeeded', 'failed', 'attention')) = (finished_at IS NOT NULL))
);
-- what a lease looks for: due pending operations, lapsed leases
CREATE INDEX outbox_pending_idx ON idempotency.outbox (next_attempt_at, id)
    WHERE state = 'pending';
CREATE INDEX outbox_in_flight_idx ON idempotency.outbox (locked_until)
    WHERE state = 'in_flight';
-- what maintenance removes
CREATE INDEX outbox_finished_idx ON idempotency.outbox (finished_at)
    WHERE state IN ('succeeded', 'failed');
COMMENT ON TABLE idempotency.outbox IS
    'Calls of idempotent APIs to be sent, each with its Idempotency-Key (idem_outbox_add)';
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_id_seq', '');

-- One row per attempt of an operation: recorded (idem_outbox_record), or
-- lapsed (a lease taken over by another sender: outcome 'lapsed').
CREATE TABLE idempotency.outbox_attempts (
    outbox_id           bigint NOT NULL
                        REFERENCES idempotency.outbox (id) ON DELETE CASCADE,
    attempt             integer NOT NULL,
    started_at          timestamptz,
    ended_at            timestamptz,
    status              integer,
    error               text,
    outcome             text NOT NULL
                        CHECK (outcome IN ('succeeded', 'failed', 'attention', 'retry', 'lapsed'))
);
CREATE INDEX outbox_attempts_outbox_id_idx ON idempotency.outbox_attempts (outbox_id, attempt);
COMMENT ON TABLE idempotency.outbox_attempts IS
    'Every attempt of an operation of idempotency.outbox';
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_attempts', '');
-- Replica identity (doc/operations.md): maintenance deletes rows of both.
ALTER TABLE idempotency.outbox_attempts REPLICA IDENTITY FULL;
-- the final responses are compressed with lz4 where the server has it, as
-- the keys' stored bodies are
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_settings
               WHERE name = 'default_toast_compression'
                 AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE idempotency.outbox ALTER COLUMN response_body SET COMPRESSION lz4;
    END IF;
END
$$;

REVOKE ALL ON idempotency.outbox, idempotency.outbox_attempts, idempotency.outbox_id_seq
    FROM PUBLIC;

-- The tenant the session is bound to (idempotency.tenant), NULL when
-- unbound, read as the claim functions read it (src/tenant.c): without
-- shared_preload_libraries too, where a value a role's startup packet gave
-- the setting is refused and the role's own setting binds.  Called by the
-- outbox functions, which run as the owner.
CREATE FUNCTION idempotency.idem_outbox_tenant()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_outbox_tenant'
LANGUAGE C STABLE;

-- The largest body or response body the outbox keeps: the setting
-- idempotency.max_response_bytes, in bytes (the library, which defines it,
-- is loaded first: without shared_preload_libraries a session may not have
-- loaded it yet).
CREATE FUNCTION idempotency.idem_outbox_max_bytes()
RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    PERFORM idempotency.idem_outbox_tenant();
    SELECT s.setting::pg_catalog.int4 INTO n FROM pg_catalog.pg_settings s
    WHERE s.name OPERATOR(pg_catalog.=) 'idempotency.max_response_bytes';
    IF n IS NULL THEN
        RAISE EXCEPTION 'the setting idempotency.max_response_bytes is not defined'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Check that the library idempotency can be loaded.';
    END IF;
    RETURN n;
END
$$;

-- The operation to call: method, url, body (JSON), headers (an object of
-- strings, never an Idempotency-Key: the key is its own column); key NULL:
-- 16 random bytes in base64url (idem_token).  Its first attempt is due at
-- not_before (NULL: now).
CREATE FUNCTION idempotency.idem_outbox_add(method text, url text, body jsonb,
                                            headers jsonb DEFAULT '{}',
                                            key text DEFAULT NULL,
                                            not_before timestamptz DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    m text := pg_catalog.upper(idem_outbox_add.method);
    k text := idem_outbox_add.key;
    h record;
    bound text := idempotency.idem_outbox_tenant();
    max_bytes integer := idempotency.idem_outbox_max_bytes();
    body_bytes integer;
BEGIN
    IF m IS NULL OR url IS NULL OR body IS NULL OR headers IS NULL THEN
        RAISE EXCEPTION 'method, url, body and headers of an outbox operation must not be NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the JSON null (''null''::jsonb) for an empty body and ''{}'' for no headers.';
    END IF;
    IF m OPERATOR(pg_catalog.<>) ALL (ARRAY['POST', 'PUT', 'PATCH', 'DELETE', 'GET']) THEN
        RAISE EXCEPTION 'method "%" is not supported by the outbox', method
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use POST, PUT, PATCH, DELETE or GET.';
    END IF;
    IF url OPERATOR(pg_catalog.!~*) '^https?://[^/?#[:space:][:cntrl:]]+' OR
       url OPERATOR(pg_catalog.~) '[[:space:][:cntrl:]]' THEN
        RAISE EXCEPTION 'url of an outbox operation must be an absolute http or https URL'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It must start with http:// or https:// and a host, and contain no white space or control characters.';
    END IF;
    IF pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'headers of an outbox operation must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass an object of header names and string values, such as ''{"Content-Type": "application/json"}''.';
    END IF;
    FOR h IN SELECT e.key AS name, e.value FROM pg_catalog.jsonb_each(headers) e
    LOOP
        IF pg_catalog.lower(h.name) OPERATOR(pg_catalog.=) 'idempotency-key' THEN
            RAISE EXCEPTION 'headers of an outbox operation must not contain Idempotency-Key'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'The sender sends the operation''s own key, which is the argument key.',
                      HINT = 'Pass the key as the argument key, or leave it NULL to have one made.';
        END IF;
        IF pg_catalog.jsonb_typeof(h.value) OPERATOR(pg_catalog.<>) 'string' THEN
            RAISE EXCEPTION 'header "%" of an outbox operation is not a string', h.name
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = pg_catalog.format('Its value is a JSON %s.', pg_catalog.jsonb_typeof(h.value));
        END IF;
        IF h.name OPERATOR(pg_catalog.!~) '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR
           (h.value OPERATOR(pg_catalog.#>>) '{}'::text[]) OPERATOR(pg_catalog.~) '[\r\n]' THEN
            RAISE EXCEPTION 'header "%" of an outbox operation is not a valid HTTP header', h.name
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'A name is a token of RFC 9110 and a value holds no line break.';
        END IF;
    END LOOP;
    body_bytes := pg_catalog.octet_length(body::text);
    IF body_bytes OPERATOR(pg_catalog.>) max_bytes THEN
        RAISE EXCEPTION 'body of an outbox operation is too large'
            USING ERRCODE = 'IK413',
                  DETAIL = pg_catalog.format('It has %s bytes; idempotency.max_response_bytes allows %s.',
                                             body_bytes, max_bytes);
    END IF;
    IF k IS NULL THEN
        k := idempotency.idem_token();
    ELSIF NOT idempotency.idem_key_valid(k) THEN
        RAISE EXCEPTION 'idempotency key of an outbox operation is not valid'
            USING ERRCODE = 'IK400',
                  DETAIL = 'A key has 1 to 255 characters from A-Z, a-z, 0-9, "-" and "_".',
                  HINT = 'Leave the key NULL to have one made, or use a UUID, a ULID or another base32 or base64url string.';
    END IF;
    BEGIN
        INSERT INTO idempotency.outbox (tenant, key, method, url, body, headers,
                                        next_attempt_at)
        VALUES (bound, k, m, url, body, headers,
                coalesce(not_before, pg_catalog.now()));
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'idempotency key "%" is already in the outbox', k
            USING ERRCODE = 'unique_violation',
                  DETAIL = 'A key names one operation; adding the same operation twice is a mistake of the caller.',
                  HINT = 'Make a new key for a new operation; the operation already added is sent once.';
    END;
    RETURN k;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_add(text, text, jsonb, jsonb, text, timestamptz) IS
    'Add a call to the outbox in the caller''s transaction; returns its Idempotency-Key';

-- Lease due operations for a sender: pending ones whose next attempt is
-- due, and in-flight ones whose lease lapsed (their sender froze or died:
-- taken over with the same key, the lapsed attempt recorded as 'lapsed').
CREATE FUNCTION idempotency.idem_outbox_lease(max_operations integer DEFAULT 10,
                                              lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, key text, method text, url text, body jsonb, headers jsonb,
               attempts integer, lease_token bigint, created_at timestamptz,
               first_attempt_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound text := idempotency.idem_outbox_tenant();
BEGIN
    IF max_operations IS NULL OR max_operations OPERATOR(pg_catalog.<) 1
       OR max_operations OPERATOR(pg_catalog.>) 10000 THEN
        RAISE EXCEPTION 'max_operations must be between 1 and 10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval
       OR lease OPERATOR(pg_catalog.>) '1 day'::pg_catalog.interval THEN
        RAISE EXCEPTION 'lease must be longer than 0 and at most 1 day'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Lease for longer than one attempt takes, timeout included.';
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT o.id, o.state, o.attempts, o.leased_at
        FROM idempotency.outbox o
        WHERE (bound IS NULL OR o.tenant OPERATOR(pg_catalog.=) bound)
          AND ((o.state OPERATOR(pg_catalog.=) 'pending'
                AND o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now())
               OR (o.state OPERATOR(pg_catalog.=) 'in_flight'
                   AND o.locked_until OPERATOR(pg_catalog.<) pg_catalog.now()))
        ORDER BY o.next_attempt_at, o.id
        LIMIT max_operations
        FOR UPDATE SKIP LOCKED
    ), lapsed AS (
        INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, started_at, outcome, error)
        SELECT d.id, d.attempts, d.leased_at, 'lapsed', 'the lease lapsed before an outcome was recorded'
        FROM due d WHERE d.state OPERATOR(pg_catalog.=) 'in_flight'
    ), leased AS (
        UPDATE idempotency.outbox o
        SET state = 'in_flight',
            attempts = o.attempts OPERATOR(pg_catalog.+) 1,
            lease_token = ('x' OPERATOR(pg_catalog.||)
                           pg_catalog.substr(pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), 1, 12)
                           OPERATOR(pg_catalog.||)
                           pg_catalog.substr(pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), 17, 4)
                          )::pg_catalog.bit(64)::pg_catalog.int8,
            locked_until = pg_catalog.now() OPERATOR(pg_catalog.+) lease,
            leased_at = pg_catalog.now(),
            first_attempt_at = coalesce(o.first_attempt_at, pg_catalog.now())
        FROM due d
        WHERE o.id OPERATOR(pg_catalog.=) d.id
        RETURNING o.id, o.key, o.method, o.url, o.body, o.headers, o.attempts,
                  o.lease_token, o.created_at, o.first_attempt_at, o.next_attempt_at
    )
    SELECT l.id, l.key::text, l.method, l.url, l.body, l.headers, l.attempts,
           l.lease_token, l.created_at, l.first_attempt_at
    FROM leased l
    ORDER BY l.next_attempt_at, l.id;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_lease(integer, interval) IS
    'Lease due operations of the outbox for a sender (FOR UPDATE SKIP LOCKED)';

-- Find an operation by id and lock it, refusing another tenant's (IK401).
-- NULL when there is none, or, with a lease_token, when the operation is
-- not in flight under that lease (another sender took it over).
CREATE FUNCTION idempotency.idem_outbox_lock(id bigint, lease_token bigint DEFAULT NULL)
RETURNS idempotency.outbox
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound text := idempotency.idem_outbox_tenant();
    o idempotency.outbox;
BEGIN
    SELECT * INTO o FROM idempotency.outbox x
    WHERE x.id OPERATOR(pg_catalog.=) idem_outbox_lock.id
    FOR UPDATE;
    IF FOUND AND bound IS NOT NULL
       AND o.tenant IS DISTINCT FROM bound COLLATE "C" THEN
        -- the other tenant is not named
        RAISE EXCEPTION 'this session may not act for the tenant of outbox operation %', id
            USING ERRCODE = 'IK401',
                  DETAIL = pg_catalog.format('The setting idempotency.tenant binds this session to tenant "%s", and the operation belongs to another.', bound),
                  HINT = 'Connect as a role bound to the operation''s tenant.';
    END IF;
    IF NOT FOUND
       OR (idem_outbox_lock.lease_token IS NOT NULL
           AND (o.state OPERATOR(pg_catalog.<>) 'in_flight'
                OR o.lease_token IS DISTINCT FROM idem_outbox_lock.lease_token)) THEN
        RETURN NULL;
    END IF;
    RETURN o;
END
$$;

-- A text cut to at most max_bytes bytes, on a character boundary.
CREATE FUNCTION idempotency.idem_outbox_cut(t text, max_bytes integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    excess integer;
BEGIN
    IF t IS NULL OR max_bytes IS NULL
       OR pg_catalog.octet_length(t) OPERATOR(pg_catalog.<=) max_bytes THEN
        RETURN t;
    END IF;
    n := max_bytes;
    LOOP
        excess := pg_catalog.octet_length(pg_catalog.left(t, n)) OPERATOR(pg_catalog.-) max_bytes;
        EXIT WHEN excess OPERATOR(pg_catalog.<=) 0;
        n := n OPERATOR(pg_catalog.-) GREATEST(1, excess OPERATOR(pg_catalog./) 4);
    END LOOP;
    RETURN pg_catalog.left(t, n);
END
$$;

-- Record the outcome of an attempt under the lease of idem_outbox_lease:
-- 'succeeded', 'failed' or 'attention' (final), or 'retry' (pending again,
-- due at retry_at).  False, changing nothing, when the lease is no longer
-- the operation's (another sender took over) or it is not in flight.
CREATE FUNCTION idempotency.idem_outbox_record(id bigint, lease_token bigint, outcome text,
                                               status integer DEFAULT NULL,
                                               error text DEFAULT NULL,
                                               retry_at timestamptz DEFAULT NULL,
                                               response_headers jsonb DEFAULT NULL,
                                               response_body text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o idempotency.outbox;
    max_bytes integer := idempotency.idem_outbox_max_bytes();
    err text := idempotency.idem_outbox_cut(error, 2000);
BEGIN
    IF id IS NULL OR lease_token IS NULL OR outcome IS NULL THEN
        RAISE EXCEPTION 'id, lease_token and outcome must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF outcome OPERATOR(pg_catalog.<>) ALL (ARRAY['succeeded', 'failed', 'attention', 'retry']) THEN
        RAISE EXCEPTION 'invalid outcome: "%"', outcome
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Valid outcomes are "succeeded", "failed", "attention" and "retry".';
    END IF;
    IF outcome OPERATOR(pg_catalog.=) 'retry' AND retry_at IS NULL THEN
        RAISE EXCEPTION 'outcome "retry" needs retry_at'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass when the next attempt is due: now plus Retry-After or the backoff.';
    END IF;
    IF status IS NOT NULL AND (status OPERATOR(pg_catalog.<) 100 OR status OPERATOR(pg_catalog.>) 599) THEN
        RAISE EXCEPTION 'invalid HTTP status: %', status
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An HTTP status lies between 100 and 599; pass NULL when no response came.';
    END IF;
    IF response_headers IS NOT NULL
       AND pg_catalog.jsonb_typeof(response_headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'response_headers must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    o := idempotency.idem_outbox_lock(id, idem_outbox_record.lease_token);
    IF o.id IS NULL THEN
        RETURN false;
    END IF;

    INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, started_at, ended_at,
                                             status, error, outcome)
    VALUES (o.id, o.attempts, o.leased_at, pg_catalog.clock_timestamp(), status, err, outcome);

    IF outcome OPERATOR(pg_catalog.=) 'retry' THEN
        UPDATE idempotency.outbox x
        SET state = 'pending', next_attempt_at = retry_at,
            lease_token = NULL, locked_until = NULL, leased_at = NULL,
            last_status = status, last_error = err
        WHERE x.id OPERATOR(pg_catalog.=) o.id;
    ELSE
        UPDATE idempotency.outbox x
        SET state = outcome, finished_at = pg_catalog.now(),
            lease_token = NULL, locked_until = NULL, leased_at = NULL,
            last_status = status, last_error = err,
            response_status = status,
            response_headers = idem_outbox_record.response_headers,
            response_body = idempotency.idem_outbox_cut(idem_outbox_record.response_body, max_bytes)
        WHERE x.id OPERATOR(pg_catalog.=) o.id;
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_record(bigint, bigint, text, integer, text, timestamptz, jsonb, text) IS
    'Record the outcome of an attempt of an outbox operation under its lease';

-- Give a leased operation back unsent (a sender stopping): pending and
-- due now, its attempt not counted.  False when the lease is not the
-- operation's.
CREATE FUNCTION idempotency.idem_outbox_release(id bigint, lease_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o idempotency.outbox;
BEGIN
    IF id IS NULL OR lease_token IS NULL THEN
        RAISE EXCEPTION 'id and lease_token must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    o := idempotency.idem_outbox_lock(id, idem_outbox_release.lease_token);
    IF o.id IS NULL THEN
        RETURN false;
    END IF;
    UPDATE idempotency.outbox x
    SET state = 'pending', next_attempt_at = pg_catalog.now(),
        attempts = x.attempts OPERATOR(pg_catalog.-) 1,
        first_attempt_at = CASE WHEN x.attempts OPERATOR(pg_catalog.<=) 1 THEN NULL
                                ELSE x.first_attempt_at END,
        lease_token = NULL, locked_until = NULL, leased_at = NULL
    WHERE x.id OPERATOR(pg_catalog.=) o.id;
    RETURN true;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_release(bigint, bigint) IS
    'Give a leased outbox operation back unsent';

-- An operator's decision: an operation that needs attention, or failed,
-- goes back to pending with the same key, due now, with a new budget of
-- attempts and time (attempts 0, first_attempt_at NULL; its earlier
-- attempts stay in idempotency.outbox_attempts).
CREATE FUNCTION idempotency.idem_outbox_retry(id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o idempotency.outbox;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    o := idempotency.idem_outbox_lock(id);
    IF o.id IS NULL THEN
        RAISE EXCEPTION 'outbox operation % does not exist', id
            USING ERRCODE = 'IK404';
    END IF;
    IF o.state OPERATOR(pg_catalog.<>) ALL (ARRAY['attention', 'failed']) THEN
        RAISE EXCEPTION 'outbox operation % is in state "%", not attention or failed', id, o.state
            USING ERRCODE = 'IK409',
                  DETAIL = 'Only an operation that needs attention or failed can be put back.';
    END IF;
    UPDATE idempotency.outbox x
    SET state = 'pending', next_attempt_at = pg_catalog.now(), finished_at = NULL,
        attempts = 0, first_attempt_at = NULL
    WHERE x.id OPERATOR(pg_catalog.=) o.id;
END
$$;
COMMENT ON FUNCTION idempotency.idem_outbox_retry(bigint) IS
    'Put an outbox operation that needs attention or failed back to pending, with the same key';

-- The outbox per tenant (NULL: operations added by unbound sessions); a
-- session bound to a tenant (idempotency.tenant) sees that tenant's row alone.
-- Alert on attention > 0, a growing oldest_pending_age, lapsed leases.
CREATE VIEW idempotency.outbox_health AS
SELECT tenant,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'pending' AND next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE state = 'in_flight') AS in_flight,
       count(*) FILTER (WHERE state = 'in_flight' AND locked_until < now()) AS lapsed_leases,
       now() - min(created_at) FILTER (WHERE state IN ('pending', 'in_flight'))
           AS oldest_pending_age,
       count(*) FILTER (WHERE state = 'attention') AS attention,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded
FROM idempotency.outbox
WHERE idempotency.idem_outbox_tenant() IS NULL
   OR tenant = idempotency.idem_outbox_tenant() COLLATE "C"
GROUP BY tenant
ORDER BY tenant NULLS FIRST;

-- The operations of the outbox for an operator (idempotency_admin), who
-- finds here the id that idem_outbox_retry takes: never the key, the body
-- or the headers (a key is a secret, the body and headers may hold some).
-- A session bound to a tenant (idempotency.tenant) sees that tenant's
-- operations alone, as idem_outbox_retry acts on those alone; the barrier
-- keeps a caller's function in a WHERE clause from seeing the others'.
CREATE VIEW idempotency.outbox_operations WITH (security_barrier) AS
SELECT id, tenant, method, url, state, attempts, next_attempt_at, locked_until,
       state = 'in_flight' AND locked_until < now() AS lease_lapsed,
       last_status, last_error, created_at, first_attempt_at, finished_at
FROM idempotency.outbox
WHERE idempotency.idem_outbox_tenant() IS NULL
   OR tenant = idempotency.idem_outbox_tenant() COLLATE "C";
COMMENT ON VIEW idempotency.outbox_operations IS
    'The operations of the outbox for an operator, without their keys, bodies and headers';

-- The attempts of the outbox's operations for an operator: what each
-- attempt got (status, error) and how it ended, to decide on an operation
-- that needs attention before idem_outbox_retry.  Tenant-filtered as
-- outbox_operations, through the operation's row.
CREATE VIEW idempotency.outbox_operation_attempts WITH (security_barrier) AS
SELECT a.outbox_id AS id, o.tenant, a.attempt, a.started_at, a.ended_at,
       a.status, a.outcome, a.error
FROM idempotency.outbox_attempts a
JOIN idempotency.outbox o ON o.id OPERATOR(pg_catalog.=) a.outbox_id
WHERE idempotency.idem_outbox_tenant() IS NULL
   OR o.tenant = idempotency.idem_outbox_tenant() COLLATE "C";
COMMENT ON VIEW idempotency.outbox_operation_attempts IS
    'The attempts of the operations of the outbox for an operator';
