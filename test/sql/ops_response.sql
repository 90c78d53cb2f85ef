--
-- Stored responses: sensitive headers are dropped, the size cap, endpoints
-- that keep no body, encryption at rest, compression.
--
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/no_worker_passes.sql
\if :worker_passes_likely
\quit
\endif
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

\i :abs_srcdir/include/helpers.sql

-- claim and finish in one transaction; returns nothing
CREATE FUNCTION pg_temp.rsp_store(endpoint text, key text, status int,
                                  body jsonb, headers jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    a text;
BEGIN
    SELECT action INTO a
    FROM idempotency.idem_claim('t1', endpoint, key, regress.fp(key));
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
    FROM idempotency.idem_claim('t1', endpoint, key, regress.fp(key)) c
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
SELECT response_headers FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-1';
SELECT response_headers::text ~ 'secret' AS secret_stored FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-1';
SELECT action, response_status, response_headers, response_json FROM pg_temp.rsp_replay('POST /r', 'h-1');
RESET idempotency.extra_sensitive_headers;
-- without the setting, only the three defaults go
SELECT pg_temp.rsp_store('POST /r', 'h-2', 200, '{}',
    '{"X-Api-Key": "kept", "Set-Cookie": "dropped"}');
SELECT response_headers FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-2';
-- only sensitive headers: an empty object is kept
SELECT pg_temp.rsp_store('POST /r', 'h-3', 200, '{}', '{"Authorization": "x"}');
SELECT response_headers FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-3';
-- resolve drops them too
SELECT action FROM idempotency.idem_claim('t1', 'POST /r', 'h-4', regress.fp('h-4'),
                                          lease => interval '1 hour');
SELECT idempotency.idem_fail('t1', 'POST /r', 'h-4', 'unknown',
       lease_token => (SELECT lease_token FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-4'));
SELECT idempotency.idem_resolve('t1', 'POST /r', 'h-4', 200, '{"ok": true}',
                                '{"Set-Cookie": "x", "ETag": "\"1\""}');
SELECT state, response_headers FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-4';

-- Header names are HTTP tokens: a name with spaces around it (which would
-- not match "Set-Cookie") or any other non-token character is refused,
-- and so is a value that is not a string or an array of strings.
SELECT regress.try(format($$SELECT pg_temp.rsp_store('POST /r', 'h-5', 200, '{}', %L)$$, h), 'detail') AS refused
FROM unnest(ARRAY['{"Set-Cookie ": "sid=secret"}', '{" Authorization": "Bearer x"}',
                  '{"Set-Cookie:": "x"}', '{"": "x"}', '{"X-Count": 1}', '{"X-Flag": true}',
                  '{"X-None": null}', '{"X-Obj": {"a": "b"}}', '{"Link": ["<a>", 2]}',
                  '{"Link": [["<a>"]]}']) h;
-- A value with a line break or another control character is refused: a
-- CR LF would split the replayed header in two.  A tab is allowed.
SELECT regress.try(format($$SELECT pg_temp.rsp_store('POST /r', 'h-5', 200, '{}', %L)$$, h), 'detail') AS refused
FROM unnest(ARRAY['{"Location": "/a\r\nSet-Cookie: sid=stolen"}', '{"X-A": "a\nb"}',
                  '{"X-A": "a\rb"}', '{"Link": ["<a>", "<b>\r\n"]}', '{"X-A": "\u0001"}',
                  '{"X-A": "x\u007f"}']) h;
SELECT count(*) AS rows_of_refused_key FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-5';
-- an empty array is an array of strings
SELECT pg_temp.rsp_store('POST /r', 'h-6', 200, '{}', '{"Vary": [], "X-Id": "1", "X-Tab": "a\tb", "X-Utf8": "été"}');
SELECT response_headers FROM idempotency.keys WHERE tenant = 't1' AND key = 'h-6';

--
-- The size cap: idempotency.max_response_bytes, then the endpoint's own.
--
SHOW idempotency.max_response_bytes;
SET idempotency.max_response_bytes = 20;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-1', 200, to_jsonb(repeat('x', 18)))$$, 'detail') AS twenty_bytes;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-2', 200, to_jsonb(repeat('x', 19)))$$, 'detail') AS twenty_one_bytes;
SELECT length(response_body) AS stored_length FROM idempotency.keys WHERE tenant = 't1' AND endpoint = 'POST /r' AND key = 'c-1';
SELECT count(*) AS rows_of_refused_key FROM idempotency.keys WHERE tenant = 't1' AND key = 'c-2';
-- finish_bytes counts bytes
SELECT regress.try($$
    SELECT idempotency.idem_claim('t1', 'POST /r', 'c-3', regress.fp('c-3'));
    SELECT idempotency.idem_finish_bytes('t1', 'POST /r', 'c-3', 200, decode(repeat('00', 21), 'hex'))$$, 'detail')
    AS bytes_21;
SELECT regress.try($$
    SELECT idempotency.idem_claim('t1', 'POST /r', 'c-3', regress.fp('c-3'));
    SELECT idempotency.idem_finish_bytes('t1', 'POST /r', 'c-3', 200, decode(repeat('00', 20), 'hex'))$$, 'detail')
    AS bytes_20;
-- in lease mode the claim stays in progress: a smaller body can follow
SELECT action FROM idempotency.idem_claim('t1', 'POST /r', 'c-4', regress.fp('c-4'),
                                          lease => interval '1 hour');
SELECT lease_token AS c4_token FROM idempotency.keys WHERE tenant = 't1' AND key = 'c-4' \gset
SELECT regress.try(format($$SELECT idempotency.idem_finish('t1', 'POST /r', 'c-4', 200, to_jsonb(repeat('x', 30)), lease_token => %s)$$, :c4_token), 'detail') AS too_large;
SELECT state FROM idempotency.keys WHERE tenant = 't1' AND key = 'c-4';
SELECT idempotency.idem_finish('t1', 'POST /r', 'c-4', 200, '"small"', lease_token => :c4_token);
SELECT state, convert_from(response_body, 'UTF8') AS body FROM idempotency.keys WHERE tenant = 't1' AND key = 'c-4';
-- no body: nothing to cap
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-5', 204, NULL)$$, 'detail') AS no_body;
-- headers count too (their JSON text): 12 bytes of body and 10 of headers
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-11', 200, to_jsonb(repeat('x', 10)), '{"A": "b"}')$$, 'detail') AS body_and_headers;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-12', 200, '1', '{"A": "b"}')$$, 'detail') AS small_enough;
-- also without a body, or with a reference to one
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-13', 204, NULL, jsonb_build_object('X-Long', repeat('y', 20)))$$, 'detail') AS headers_only;
SELECT regress.try($$
    SELECT idempotency.idem_claim('t1', 'POST /r', 'c-14', regress.fp('c-14'));
    SELECT idempotency.idem_finish_ref('t1', 'POST /r', 'c-14', 200, 's3://bucket/c-14',
                                       jsonb_build_object('X-Long', repeat('y', 20)))$$, 'detail') AS ref_with_headers;
RESET idempotency.max_response_bytes;
-- an endpoint's own limit applies whatever the setting, smaller or larger
INSERT INTO idempotency.endpoints (endpoint, max_response_bytes) VALUES
    ('POST /small', 10), ('POST /large', 1000000);
SET idempotency.max_response_bytes = 20;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /small', 'c-6', 200, to_jsonb(repeat('x', 9)))$$, 'detail') AS small_11_bytes;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /small', 'c-7', 200, to_jsonb(repeat('x', 8)))$$, 'detail') AS small_10_bytes;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /large', 'c-8', 200, to_jsonb(repeat('x', 5000)))$$, 'detail') AS large_5002_bytes;
RESET idempotency.max_response_bytes;
-- the default cap, 256kB
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-9', 200, to_jsonb(repeat('x', 262142)))$$, 'detail') AS exactly_256kB;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'c-10', 200, to_jsonb(repeat('x', 262143)))$$, 'detail') AS one_byte_more;

--
-- store_response = false: status and headers only, and the replay says so.
--
INSERT INTO idempotency.endpoints (endpoint, store_response) VALUES ('POST /tokens', false);
SELECT pg_temp.rsp_store('POST /tokens', 'o-1', 201, '{"one_time_token": "secret-url"}',
                         '{"Location": "/tokens/1", "Set-Cookie": "x"}');
SELECT state, response_status, response_headers, body_kind, response_body, body_encrypted
FROM idempotency.keys WHERE tenant = 't1' AND key = 'o-1';
SELECT * FROM pg_temp.rsp_replay('POST /tokens', 'o-1');
-- not even the cap applies: nothing is kept
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /tokens', 'o-2', 200, to_jsonb(repeat('x', 300000)))$$, 'detail') AS large_omitted;
-- a response without a body is just that
SELECT pg_temp.rsp_store('POST /tokens', 'o-3', 204, NULL);
SELECT body_kind FROM idempotency.keys WHERE tenant = 't1' AND key = 'o-3';
SELECT * FROM pg_temp.rsp_replay('POST /tokens', 'o-3');

--
-- Encryption at rest.
--
-- rows stored before a key is set
SELECT pg_temp.rsp_store('POST /r', 'e-0', 200, '{"card": "plain-before-key"}');
SET idempotency.encryption_key = 'first key';
SELECT pg_temp.rsp_store('POST /r', 'e-1', 200, '{"card": "4111-secret"}', '{"Content-Type": "application/json"}');
BEGIN;
SELECT action FROM idempotency.idem_claim('t1', 'POST /r', 'e-2', regress.fp('e-2'));
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
SELECT response_body FROM idempotency.idem_claim('t1', 'POST /r', 'e-2', regress.fp('e-2'));
-- rows stored before the key stay readable
SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-0');
-- a wrong key, or none, is a clear error and never garbage
SET idempotency.encryption_key = 'second key';
SELECT regress.try($$SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-1')$$, 'detail') AS wrong_key;
RESET idempotency.encryption_key;
SELECT regress.try($$SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-1')$$, 'detail') AS no_key;
SELECT * FROM pg_temp.rsp_replay('POST /r', 'e-0');
-- the right key again
SET idempotency.encryption_key = 'first key';
SELECT action, response_json FROM pg_temp.rsp_replay('POST /r', 'e-1');
-- the cap applies to the body before encryption
SET idempotency.max_response_bytes = 20;
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'e-3', 200, to_jsonb(repeat('x', 18)))$$, 'detail') AS twenty_bytes_encrypted;
SELECT body_encrypted, length(response_body) > 20 AS stored_longer FROM idempotency.keys WHERE tenant = 't1' AND key = 'e-3';
SELECT regress.try($$SELECT pg_temp.rsp_store('POST /r', 'e-4', 200, to_jsonb(repeat('x', 19)))$$, 'detail') AS twenty_one_bytes_encrypted;
RESET idempotency.max_response_bytes;
RESET idempotency.encryption_key;

-- the key is hidden from everybody but superusers
CREATE ROLE regress_idem_rsp_user;
SET ROLE regress_idem_rsp_user;
-- (the SQLSTATE only: the message differs between server versions)
SELECT left(regress.try($$SHOW idempotency.encryption_key$$, 'detail'), 5) AS show_key;
SELECT count(*) AS listed FROM pg_settings WHERE name = 'idempotency.encryption_key';
SELECT regress.try($$SET idempotency.encryption_key = 'x'$$, 'detail') AS set_key;
RESET ROLE;
DROP ROLE regress_idem_rsp_user;

--
-- Compression of stored bodies: lz4 where the server has it, on the
-- partitioned table, its default partition and new partitions.
--
-- a partition made by hand, which the DDL guard refuses (test defend)
SET idempotency.ddl_guard = off;
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
RESET idempotency.ddl_guard;

--
-- Replayed JSON bodies: the stored text is turned back into jsonb directly,
-- or by jsonb_in for what the direct builder leaves to it; either way the
-- datum is the one jsonb_in gives, byte for byte (*= compares the binary
-- images).  Generated documents go through idem_finish and a replay; raw
-- texts that jsonb never writes (duplicate names, white space, exponents,
-- escapes) are put in response_body directly and replayed.
--
CREATE FUNCTION pg_temp.rsp_gen(depth int) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    scalars text[] := ARRAY[
        '0', '-0', '1.0', '1.50', '1e3', '1E-7', '-12.5e+2', '0.000',
        '123456789012345678901234567890.123', '-42', '9007199254740993',
        '1e-600',
        '""', '"plain"', '"é café"', '"日本語テキスト"', '"😀 emoji 🎉"',
        '"a\"quote"', '"back\\slash"', '"line\nbreak\ttab"', '"\u0001\u001f"',
        '"\u00e9 escaped"', '"\ud83d\ude00"', '"\/slash"', '"mixed é \n 😀"',
        'true', 'false', 'null'];
    keys text[] := ARRAY['id', 'a', 'b', 'status', 'amount', '', 'ü', '键',
        '😀', 'a"b', 'new\nline', 'longer_member_name', 'x', 'aa'];
    r float8 := random();
    n int := floor(random() * 5)::int;
    acc jsonb;
BEGIN
    IF depth <= 0 OR r < 0.4 THEN
        RETURN scalars[1 + floor(random() * array_length(scalars, 1))::int]::jsonb;
    ELSIF r < 0.7 THEN
        acc := '[]';
        FOR i IN 1 .. n LOOP
            acc := acc || jsonb_build_array(pg_temp.rsp_gen(depth - 1));
        END LOOP;
    ELSE
        acc := '{}';
        FOR i IN 1 .. n LOOP
            acc := acc || jsonb_build_object(keys[1 + floor(random() * array_length(keys, 1))::int],
                                             pg_temp.rsp_gen(depth - 1));
        END LOOP;
    END IF;
    RETURN acc;
END $$;

-- the replay of key, compared with jsonb_in of text t
CREATE FUNCTION pg_temp.rsp_same(key text, t text, OUT action text, OUT same boolean)
LANGUAGE sql AS $$
    SELECT r.action,
           coalesce(r.response_json = t::jsonb AND
                    r.response_json::text = t::jsonb::text AND a *= b, false)
    FROM pg_temp.rsp_replay('POST /j', key) r,
         LATERAL (SELECT r.response_json) a, LATERAL (SELECT t::jsonb) b
$$;

SELECT setseed(0.4711);
CREATE TEMP TABLE rsp_docs AS
SELECT i, pg_temp.rsp_gen(4) AS d FROM generate_series(1, 3000) i;
-- every scalar at the top level, empty containers, deep nesting
INSERT INTO rsp_docs
SELECT 3000 + row_number() OVER (), d::jsonb FROM unnest(ARRAY[
    '0', '-0', '1.0', '1.50', '1e3', '1E-7', '123456789012345678901234567890.123',
    '"é"', '"😀"', '"a\"b"', 'true', 'false', 'null', '[]', '{}', '[[]]',
    '{"a": {}}', '[{}, [], "", 0]',
    repeat('[', 64) || repeat(']', 64), repeat('[', 65) || repeat(']', 65),
    repeat('{"a": ', 70) || '1' || repeat('}', 70)]) d;
SELECT count(*) AS documents,
       count(*) FILTER (WHERE jsonb_typeof(d) = 'object') AS objects,
       count(*) FILTER (WHERE jsonb_typeof(d) = 'array') AS arrays,
       count(*) FILTER (WHERE jsonb_typeof(d) NOT IN ('object', 'array')) AS scalars,
       count(*) FILTER (WHERE d::text LIKE '%\\%') AS with_escapes
FROM rsp_docs;
-- one statement claims every document's key: more than the default limit
SET idempotency.max_claims_per_transaction = 4000;
SELECT count(*) AS stored
FROM (SELECT pg_temp.rsp_store('POST /j', 'j-' || i, 200, d) FROM rsp_docs) s;
CREATE TEMP TABLE rsp_back AS
SELECT i, d, s.action, s.same FROM rsp_docs, pg_temp.rsp_same('j-' || i, d::text) s;
RESET idempotency.max_claims_per_transaction;
SELECT count(*) AS replayed, count(*) FILTER (WHERE action <> 'replay') AS not_replayed,
       count(*) FILTER (WHERE NOT same) AS mismatches
FROM rsp_back;
SELECT b.i, b.d::text AS stored, r.response_json::text AS replayed
FROM rsp_back b, pg_temp.rsp_replay('POST /j', 'j-' || b.i) r
WHERE NOT b.same ORDER BY b.i LIMIT 5;

-- raw texts, as no jsonb is written
CREATE TEMP TABLE rsp_raw (i int, t text);
INSERT INTO rsp_raw
SELECT row_number() OVER (), t FROM unnest(ARRAY[
    '{"a": 1, "a": 2}', '{"b": 1, "a": 2, "b": [3], "a": {"a": 4, "a": 5}}',
    '{"a\"b": 1, "a\u0022b": 2, "a\\b": 3}', '[{"x": 1, "x": null}, {"x": 2}]',
    E' \n\t{ "a" : [ 1 , 2 ,\r\n {} ] , "b":{"c":[]} } \n',
    '1e3', '1E-7', '-0.0e+0', '1e999', '-1e-999', '1e1000', '0.1E+02', '10e-1',
    repeat('9', 600), '-' || repeat('1', 512), '[' || repeat('1', 513) || ']',
    '"\u00e9\ud83d\ude00\/\b\f\n\r\t\"\\"', '"\u0041\u00DF\u6F22"', '{"\u00e9": "é"}',
    '"é😀"', 'true', ' null ', '[true,false,null]', '{"k":"v","k":"w"}', '[]', '{}',
    '{"long_name": 1, "s": 2, "mid": 3, "": 4}']) t;
UPDATE idempotency.keys k SET response_body = convert_to(r.t, 'UTF8')
FROM rsp_raw r WHERE k.tenant = 't1' AND k.endpoint = 'POST /j' AND k.key = 'j-' || r.i;
SELECT r.i, left(r.t, 40) AS text, s.action, s.same
FROM rsp_raw r, pg_temp.rsp_same('j-' || r.i, r.t) s ORDER BY r.i;
-- text jsonb_in refuses still raises its error
UPDATE idempotency.keys SET response_body = convert_to('{"a": 1,}', 'UTF8')
WHERE tenant = 't1' AND endpoint = 'POST /j' AND key = 'j-1';
SELECT regress.try($$SELECT * FROM pg_temp.rsp_replay('POST /j', 'j-1')$$, 'detail') AS invalid_body;

DELETE FROM idempotency.keys WHERE tenant = 't1' AND endpoint IN ('POST /r', 'POST /small', 'POST /large', 'POST /tokens', 'POST /j');
DELETE FROM idempotency.endpoints WHERE endpoint IN ('POST /small', 'POST /large', 'POST /tokens');
