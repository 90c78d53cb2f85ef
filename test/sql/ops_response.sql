--
-- Stored responses: sensitive headers are dropped, the size cap, endpoints
-- that keep no body, encryption at rest, compression.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

CREATE FUNCTION pg_temp.rsp_fp(s text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT sha256(convert_to(s, 'UTF8')) $$;

CREATE FUNCTION pg_temp.rsp_try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            det = PG_EXCEPTION_DETAIL;
    RETURN st || ': ' || msg || coalesce(' / ' || nullif(det, ''), '');
END $$;

-- claim and finish in one transaction; returns nothing
CREATE FUNCTION pg_temp.rsp_store(endpoint text, key text, status int,
                                  body jsonb, headers jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    a text;
BEGIN
    SELECT action INTO a
    FROM idempotency.idem_claim('t1', endpoint, key, pg_temp.rsp_fp(key));
    IF a <> 'execute' THEN
        RAISE EXCEPTION 'claim of % gave %', key, a;
    END IF;
    PERFORM idempotency.idem_finish('t1', endpoint, key, status, body, headers);
END $$;

CREATE FUNCTION pg_temp.rsp_replay(endpoint text, key text)
RETURNS TABLE (action text, response_status int, response_headers jsonb,
               response_json jsonb, body text)
LANGUAGE sql AS $$
    SELECT c.action, c.response_status, c.response_headers - 'Idempotency-Key',
           c.response_json, convert_from(c.response_body, 'UTF8')
    FROM idempotency.idem_claim('t1', endpoint, key, pg_temp.rsp_fp(key)) c
$$;

--
-- Sensitive headers: the three by default, any case, plus the setting's.
--
SET idempotency.extra_sensitive_headers = 'X-Api-Key, x-session-token';
SELECT pg_temp.rsp_store('POST /r', 'h-1', 201, '{"id": 1}',
    '{"Set-Cookie": "sid=secret1", "set-cookie": "sid=secret2",
      "AUTHORIZATION": "Bearer secret3", "Proxy-Authorization": "Basic secret4",
      "x-api-key": "secret5", "X-Session-Token": ["secret6", "secret7"],
      "Content-Type": "application/json", "X-Request-Id": "r-1",
      "Link": ["<a>; rel=next", "<b>; rel=prev"]}');
SELECT response_headers FROM idempotency.keys WHERE key = 'h-1';
SELECT response_headers::text ~ 'secret' AS secret_stored FROM idempotency.keys WHERE key = 'h-1';
SELECT action, response_status, response_headers, response_json FROM pg_temp.rsp_replay('POST /r', 'h-1');
RESET idempotency.extra_sensitive_headers;
-- without the setting, only the three defaults go
SELECT pg_temp.rsp_store('POST /r', 'h-2', 200, '{}',
    '{"X-Api-Key": "kept", "Set-Cookie": "dropped"}');
SELECT response_headers FROM idempotency.keys WHERE key = 'h-2';
-- only sensitive headers: an empty object is kept
SELECT pg_temp.rsp_store('POST /r', 'h-3', 200, '{}', '{"Authorization": "x"}');
SELECT response_headers FROM idempotency.keys WHERE key = 'h-3';
-- resolve drops them too
SELECT action FROM idempotency.idem_claim('t1', 'POST /r', 'h-4', pg_temp.rsp_fp('h-4'),
                                          lease => interval '1 hour');
SELECT idempotency.idem_fail('t1', 'POST /r', 'h-4', 'unknown',
       lease_token => (SELECT lease_token FROM idempotency.keys WHERE key = 'h-4'));
SELECT idempotency.idem_resolve('t1', 'POST /r', 'h-4', 200, '{"ok": true}',
                                '{"Set-Cookie": "x", "ETag": "\"1\""}');
SELECT state, response_headers FROM idempotency.keys WHERE key = 'h-4';

--
-- The size cap: idempotency.max_response_bytes, then the endpoint's own.
--
SHOW idempotency.max_response_bytes;
SET idempotency.max_response_bytes = 20;
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /r', 'c-1', 200, to_jsonb(repeat('x', 18)))$$) AS twenty_bytes;
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /r', 'c-2', 200, to_jsonb(repeat('x', 19)))$$) AS twenty_one_bytes;
SELECT length(response_body) AS stored_length FROM idempotency.keys WHERE key = 'c-1';
SELECT count(*) AS rows_of_refused_key FROM idempotency.keys WHERE key = 'c-2';
-- finish_bytes counts bytes
SELECT pg_temp.rsp_try($$
    SELECT idempotency.idem_claim('t1', 'POST /r', 'c-3', pg_temp.rsp_fp('c-3'));
    SELECT idempotency.idem_finish_bytes('t1', 'POST /r', 'c-3', 200, decode(repeat('00', 21), 'hex'))$$)
    AS bytes_21;
SELECT pg_temp.rsp_try($$
    SELECT idempotency.idem_claim('t1', 'POST /r', 'c-3', pg_temp.rsp_fp('c-3'));
    SELECT idempotency.idem_finish_bytes('t1', 'POST /r', 'c-3', 200, decode(repeat('00', 20), 'hex'))$$)
    AS bytes_20;
-- in lease mode the claim stays in progress: a smaller body can follow
SELECT action FROM idempotency.idem_claim('t1', 'POST /r', 'c-4', pg_temp.rsp_fp('c-4'),
                                          lease => interval '1 hour');
SELECT lease_token AS c4_token FROM idempotency.keys WHERE key = 'c-4' \gset
SELECT pg_temp.rsp_try(format($$SELECT idempotency.idem_finish('t1', 'POST /r', 'c-4', 200, to_jsonb(repeat('x', 30)), lease_token => %s)$$, :c4_token)) AS too_large;
SELECT state FROM idempotency.keys WHERE key = 'c-4';
SELECT idempotency.idem_finish('t1', 'POST /r', 'c-4', 200, '"small"', lease_token => :c4_token);
SELECT state, convert_from(response_body, 'UTF8') AS body FROM idempotency.keys WHERE key = 'c-4';
-- no body: nothing to cap
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /r', 'c-5', 204, NULL)$$) AS no_body;
RESET idempotency.max_response_bytes;
-- an endpoint's own limit applies whatever the setting, smaller or larger
INSERT INTO idempotency.endpoints (endpoint, max_response_bytes) VALUES
    ('POST /small', 10), ('POST /large', 1000000);
SET idempotency.max_response_bytes = 20;
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /small', 'c-6', 200, to_jsonb(repeat('x', 9)))$$) AS small_11_bytes;
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /small', 'c-7', 200, to_jsonb(repeat('x', 8)))$$) AS small_10_bytes;
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /large', 'c-8', 200, to_jsonb(repeat('x', 5000)))$$) AS large_5002_bytes;
RESET idempotency.max_response_bytes;
-- the default cap, 256kB
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /r', 'c-9', 200, to_jsonb(repeat('x', 262142)))$$) AS exactly_256kB;
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /r', 'c-10', 200, to_jsonb(repeat('x', 262143)))$$) AS one_byte_more;

--
-- store_response = false: status and headers only, and the replay says so.
--
INSERT INTO idempotency.endpoints (endpoint, store_response) VALUES ('POST /tokens', false);
SELECT pg_temp.rsp_store('POST /tokens', 'o-1', 201, '{"one_time_token": "secret-url"}',
                         '{"Location": "/tokens/1", "Set-Cookie": "x"}');
SELECT state, response_status, response_headers, body_kind, response_body, body_encrypted
FROM idempotency.keys WHERE key = 'o-1';
SELECT * FROM pg_temp.rsp_replay('POST /tokens', 'o-1');
-- not even the cap applies: nothing is kept
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /tokens', 'o-2', 200, to_jsonb(repeat('x', 300000)))$$) AS large_omitted;
-- a response without a body is just that
SELECT pg_temp.rsp_store('POST /tokens', 'o-3', 204, NULL);
SELECT body_kind FROM idempotency.keys WHERE key = 'o-3';
SELECT * FROM pg_temp.rsp_replay('POST /tokens', 'o-3');

--
-- Encryption at rest.
--
-- rows stored before a key is set
SELECT pg_temp.rsp_store('POST /r', 'e-0', 200, '{"card": "plain-before-key"}');
SET idempotency.encryption_key = 'first key';
SELECT pg_temp.rsp_store('POST /r', 'e-1', 200, '{"card": "4111-secret"}', '{"Content-Type": "application/json"}');
BEGIN;
SELECT action FROM idempotency.idem_claim('t1', 'POST /r', 'e-2', pg_temp.rsp_fp('e-2'));
SELECT idempotency.idem_finish_bytes('t1', 'POST /r', 'e-2', 200, '\xdeadbeef00ff');
COMMIT;
SELECT k.key, k.body_kind, k.body_encrypted,
       position(p.plain IN k.response_body) > 0 AS plaintext_stored,
       length(k.response_body) > length(p.plain) AS longer_than_plaintext
FROM idempotency.keys k
JOIN (VALUES ('e-0', convert_to('{"card": "plain-before-key"}', 'UTF8')),
             ('e-1', convert_to('{"card": "4111-secret"}', 'UTF8')),
             ('e-2', '\xdeadbeef00ff'::bytea)) AS p(key, plain) ON p.key = k.key
ORDER BY k.key;
-- decrypted on replay, byte for byte
SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-1');
SELECT response_body FROM idempotency.idem_claim('t1', 'POST /r', 'e-2', pg_temp.rsp_fp('e-2'));
-- rows stored before the key stay readable
SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-0');
-- a wrong key, or none, is a clear error and never garbage
SET idempotency.encryption_key = 'second key';
SELECT pg_temp.rsp_try($$SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-1')$$) AS wrong_key;
RESET idempotency.encryption_key;
SELECT pg_temp.rsp_try($$SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-1')$$) AS no_key;
SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-0');
-- the right key again
SET idempotency.encryption_key = 'first key';
SELECT action, response_json FROM pg_temp.rsp_replay('POST /r', 'e-1');
-- the cap applies to the body before encryption
SET idempotency.max_response_bytes = 20;
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /r', 'e-3', 200, to_jsonb(repeat('x', 18)))$$) AS twenty_bytes_encrypted;
SELECT body_encrypted, length(response_body) > 20 AS stored_longer FROM idempotency.keys WHERE key = 'e-3';
SELECT pg_temp.rsp_try($$SELECT pg_temp.rsp_store('POST /r', 'e-4', 200, to_jsonb(repeat('x', 19)))$$) AS twenty_one_bytes_encrypted;
RESET idempotency.max_response_bytes;
RESET idempotency.encryption_key;

-- the key is hidden from everybody but superusers
CREATE ROLE regress_idem_rsp_user;
SET ROLE regress_idem_rsp_user;
SELECT pg_temp.rsp_try($$SHOW idempotency.encryption_key$$) AS show_key;
SELECT count(*) AS listed FROM pg_settings WHERE name = 'idempotency.encryption_key';
SELECT pg_temp.rsp_try($$SET idempotency.encryption_key = 'x'$$) AS set_key;
RESET ROLE;
DROP ROLE regress_idem_rsp_user;

--
-- Compression of stored bodies: lz4 where the server has it, on the
-- partitioned table, its default partition and new partitions.
--
CREATE TABLE idempotency.keys_rsp_test PARTITION OF idempotency.keys
    FOR VALUES FROM ('2000-01-01') TO ('2000-01-02');
SELECT c.relname,
       a.attcompression = CASE WHEN 'lz4' = ANY (s.enumvals) THEN 'l' ELSE '' END
           AS lz4_if_available
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
CROSS JOIN (SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression') s
WHERE a.attname = 'response_body' AND c.relnamespace = 'idempotency'::regnamespace
  AND c.relkind IN ('r', 'p')
ORDER BY 1;
DROP TABLE idempotency.keys_rsp_test;

DELETE FROM idempotency.keys WHERE tenant = 't1' AND endpoint IN ('POST /r', 'POST /small', 'POST /large', 'POST /tokens');
DELETE FROM idempotency.endpoints WHERE endpoint IN ('POST /small', 'POST /large', 'POST /tokens');
