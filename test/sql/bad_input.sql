--
-- Bad input to every SQL-callable function of the extension: NULL for each
-- argument, empty strings, values one past each limit, out-of-range numbers,
-- intervals and timestamps, malformed JSON.  Each call runs through
-- bi.t(label, statement), which shows "ok: " and the first column of its
-- result, or the SQLSTATE and message of its error.  A call that succeeds
-- is rolled back afterwards (so that every call meets the same keys), and
-- says "(writes)" when it had changed idempotency.keys, .endpoints or
-- .events before that; after every call, refused or not, the tables are
-- compared with what they held before it ("[TABLES CHANGED]" would say
-- they differ), and the statement's commit would raise IK500 if a refused
-- claim had left a pending claim behind.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

CREATE SCHEMA bi;
CREATE FUNCTION bi.state() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce((SELECT string_agg(k::text, '|' ORDER BY k::text) FROM idempotency.keys k), '')
               || '#' || coalesce((SELECT string_agg(e::text, '|' ORDER BY e::text) FROM idempotency.endpoints e), '')
               || '#' || coalesce((SELECT string_agg(v::text, '|' ORDER BY v::text) FROM idempotency.events v), ''))
$$;
CREATE FUNCTION bi.t(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    before text := bi.state();
    res text;
    st text;
    msg text;
    result text;
BEGIN
    BEGIN
        EXECUTE stmt INTO res;
        result := 'ok: ' || coalesce(left(res, 72), 'NULL');
        IF bi.state() IS DISTINCT FROM before THEN
            result := result || ' (writes)';
        END IF;
        RAISE EXCEPTION 'roll back';
    EXCEPTION WHEN OTHERS THEN
        IF result IS NULL THEN
            GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
            result := st || ': ' || left(msg, 120);
        END IF;
    END;
    IF bi.state() IS DISTINCT FROM before THEN
        result := result || ' [TABLES CHANGED]';
    END IF;
    RETURN result;
END $$;

-- fixtures: an endpoint with a small size cap, one in lease mode, and keys
-- in progress (leased), completed and failed
INSERT INTO idempotency.endpoints (endpoint, max_response_bytes) VALUES ('POST /small', 16);
INSERT INTO idempotency.endpoints (endpoint, lease) VALUES ('POST /lease', '1 hour');
CREATE TABLE bi.tok AS
SELECT lease_token AS token
FROM idempotency.idem_claim('t', 'POST /lease', 'k-leased', sha256('x'));
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k-done', sha256('x'));
SELECT idempotency.idem_finish('t', 'POST /pay', 'k-done', 201, '{"ok": true}');
COMMIT;
SELECT idempotency.idem_fail('t', 'POST /lease', 'k-failed', 'failed', lease_token => lease_token)
FROM idempotency.idem_claim('t', 'POST /lease', 'k-failed', sha256('x'));
SELECT tenant, endpoint, key, state FROM idempotency.keys ORDER BY key;

-- idem_claim(tenant, endpoint, key, fingerprint, ttl, lease, wait)
SELECT label, bi.t(stmt) FROM (VALUES
  ('tenant NULL',        $$SELECT action FROM idempotency.idem_claim(NULL, 'POST /pay', 'k1', sha256('x'))$$),
  ('endpoint NULL',      $$SELECT action FROM idempotency.idem_claim('t', NULL, 'k1', sha256('x'))$$),
  ('key NULL',           $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', NULL, sha256('x'))$$),
  ('fingerprint NULL',   $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', NULL)$$),
  ('ttl NULL',           $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => NULL)$$),
  ('lease NULL',         $$SELECT action FROM idempotency.idem_claim('t', 'POST /lease', 'k1', sha256('x'), lease => NULL)$$),
  ('wait NULL',          $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => NULL)$$),
  ('tenant empty',       $$SELECT action FROM idempotency.idem_claim('', 'POST /pay', 'k1', sha256('x'))$$),
  ('endpoint empty',     $$SELECT action FROM idempotency.idem_claim('t', '', 'k1', sha256('x'))$$),
  ('key empty',          $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', '', sha256('x'))$$),
  ('key 255',            $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', repeat('k', 255), sha256('x'))$$),
  ('key 256',            $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', repeat('k', 256), sha256('x'))$$),
  ('key 1 MB',           $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', repeat('k', 1048576), sha256('x'))$$),
  ('key space',          $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k 1', sha256('x'))$$),
  ('key non-ASCII',      $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'clé', sha256('x'))$$),
  ('key newline',        $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', E'k1\n', sha256('x'))$$),
  ('tenant 255 bytes',   $$SELECT action FROM idempotency.idem_claim(repeat('t', 255), 'POST /pay', 'k1', sha256('x'))$$),
  ('tenant 256 bytes',   $$SELECT action FROM idempotency.idem_claim(repeat('t', 256), 'POST /pay', 'k1', sha256('x'))$$),
  ('tenant 128 x é',     $$SELECT action FROM idempotency.idem_claim(repeat('é', 128), 'POST /pay', 'k1', sha256('x'))$$),
  ('endpoint 255 bytes', $$SELECT action FROM idempotency.idem_claim('t', repeat('e', 255), 'k1', sha256('x'))$$),
  ('endpoint 256 bytes', $$SELECT action FROM idempotency.idem_claim('t', repeat('e', 256), 'k1', sha256('x'))$$),
  ('fingerprint 0 B',    $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', '')$$),
  ('fingerprint 31 B',   $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', substr(sha256('x'), 1, 31))$$),
  ('fingerprint 33 B',   $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x') || '\x00'::bytea)$$),
  ('ttl negative',       $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '-1 second')$$),
  ('ttl zero',           $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '0')$$),
  ('ttl 1 microsecond',  $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '1 microsecond')$$),
  ('ttl = max_ttl',      $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '7 days')$$),
  ('ttl > max_ttl',      $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '7 days 1 second')$$),
  ('ttl 1 month -31 d',  $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '1 month -31 days')$$),
  ('ttl huge',           $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '178000000 years')$$),
  ('ttl huge negative',  $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '-178000000 years')$$),
  ('ttl 101 years',      $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '101 years')$$),
  ('ttl 40000 days',     $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '40000 days')$$),
  ('lease negative',     $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), lease => '-1 second')$$),
  ('lease zero',         $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), lease => '0')$$),
  ('lease > ttl',        $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '1 hour', lease => '2 hours')$$),
  ('lease huge',         $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), lease => '178000000 years')$$),
  ('lease huge negative', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), lease => '-178000000 years')$$),
  ('ttl 100 years',      $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), ttl => '100 years')$$),
  ('lease 100 years',    $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), lease => '100 years')$$),
  ('lease 101 years',    $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), lease => '101 years')$$),
  ('lease 36525 days',   $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), lease => '36525 days')$$),
  ('wait negative',      $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '-1 second')$$),
  ('wait zero',          $$SELECT action FROM idempotency.idem_claim('t', 'POST /lease', 'k-leased', sha256('x'), wait => '0')$$),
  ('wait 1 month -31 d', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '1 month -31 days')$$),
  ('wait huge',          $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '178000000 years')$$),
  ('wait huge negative', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '-178000000 years')$$),
  ('wait 2147483647 ms', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '2147483647 milliseconds')$$),
  ('wait 2147483648 ms', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '2147483648 milliseconds')$$),
  ('wait 1 month',       $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '1 month')$$),
  ('wait 1000000 years', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '1000000 years')$$),
  ('wait overflows usecs', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '2000000 years')$$),
  ('wait overflows, negative', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '-2000000 years')$$),
  ('wait overflows deadline', $$SELECT action FROM idempotency.idem_claim('t', 'POST /pay', 'k1', sha256('x'), wait => '290000 years')$$)
) AS v(label, stmt);

-- idem_finish(tenant, endpoint, key, status, body jsonb, headers jsonb,
-- lease_token), on the leased key
SELECT label, bi.t(replace(stmt, 'TOKEN', (SELECT token::text FROM bi.tok))) FROM (VALUES
  ('tenant NULL',        $$SELECT idempotency.idem_finish(NULL, 'POST /lease', 'k-leased', 200, '{}', NULL, TOKEN)$$),
  ('endpoint NULL',      $$SELECT idempotency.idem_finish('t', NULL, 'k-leased', 200, '{}', NULL, TOKEN)$$),
  ('key NULL',           $$SELECT idempotency.idem_finish('t', 'POST /lease', NULL, 200, '{}', NULL, TOKEN)$$),
  ('status NULL',        $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', NULL, '{}', NULL, TOKEN)$$),
  ('body NULL',          $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 204, NULL, NULL, TOKEN)$$),
  ('headers NULL',       $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', NULL, TOKEN)$$),
  ('lease_token NULL',   $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', NULL, NULL)$$),
  ('lease_token wrong',  $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', NULL, -1)$$),
  ('key empty',          $$SELECT idempotency.idem_finish('t', 'POST /lease', '', 200, '{}', NULL, TOKEN)$$),
  ('key 256',            $$SELECT idempotency.idem_finish('t', 'POST /lease', repeat('k', 256), 200, '{}', NULL, TOKEN)$$),
  ('status -1',          $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', -1, '{}', NULL, TOKEN)$$),
  ('status 0',           $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 0, '{}', NULL, TOKEN)$$),
  ('status 99',          $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 99, '{}', NULL, TOKEN)$$),
  ('status 100',         $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 100, '{}', NULL, TOKEN)$$),
  ('status 599',         $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 599, '{}', NULL, TOKEN)$$),
  ('status 600',         $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 600, '{}', NULL, TOKEN)$$),
  ('status int max',     $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 2147483647, '{}', NULL, TOKEN)$$),
  ('body malformed',     $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{"a": ', NULL, TOKEN)$$),
  ('body JSON null',     $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, 'null', NULL, TOKEN)$$),
  ('body = max_response_bytes', $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, to_jsonb(repeat('x', 262142)), NULL, TOKEN)$$),
  ('body > max_response_bytes', $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, to_jsonb(repeat('x', 262143)), NULL, TOKEN)$$),
  ('body 64 MB',         $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, to_jsonb(repeat('x', 64 * 1048576)), NULL, TOKEN)$$),
  ('headers array',      $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '["a"]', TOKEN)$$),
  ('headers string',     $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '"a"', TOKEN)$$),
  ('headers JSON null',  $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', 'null', TOKEN)$$),
  ('header value number', $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '{"X-A": 1}', TOKEN)$$),
  ('header value null',  $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '{"X-A": null}', TOKEN)$$),
  ('header value object', $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '{"X-A": {"b": "c"}}', TOKEN)$$),
  ('header array of numbers', $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '{"X-A": [1, 2]}', TOKEN)$$),
  ('header value CRLF',  $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '{"X-A": "a\r\nSet-Cookie: s=1"}', TOKEN)$$),
  ('header name empty',  $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '{"": "a"}', TOKEN)$$),
  ('header name space',  $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', '{"X A": "a"}', TOKEN)$$),
  ('100000 headers',     $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', (SELECT jsonb_object_agg('X-H' || g, 'v') FROM generate_series(1, 100000) g), TOKEN)$$),
  ('header of 1 MB',     $$SELECT idempotency.idem_finish('t', 'POST /lease', 'k-leased', 200, '{}', jsonb_build_object('X-A', repeat('v', 1048576)), TOKEN)$$),
  ('completed key',      $$SELECT idempotency.idem_finish('t', 'POST /pay', 'k-done', 200, '{}')$$),
  ('missing key',        $$SELECT idempotency.idem_finish('t', 'POST /pay', 'k-never', 200, '{}')$$)
) AS v(label, stmt);

-- a smaller cap of the endpoint's own (16 bytes)
BEGIN;
SELECT action FROM idempotency.idem_claim('t', 'POST /small', 'k-small', sha256('x'));
SELECT bi.t($$SELECT idempotency.idem_finish('t', 'POST /small', 'k-small', 200, to_jsonb('0123456789abcd'::text))$$) AS body_16_bytes,
       bi.t($$SELECT idempotency.idem_finish('t', 'POST /small', 'k-small', 200, to_jsonb('0123456789abcde'::text))$$) AS body_17_bytes,
       bi.t($$SELECT idempotency.idem_finish_bytes('t', 'POST /small', 'k-small', 200, '\x00000000000000000000000000000000')$$) AS bytes_16,
       bi.t($$SELECT idempotency.idem_finish_bytes('t', 'POST /small', 'k-small', 200, '\x0000000000000000000000000000000000')$$) AS bytes_17;
SELECT idempotency.idem_release('t', 'POST /small', 'k-small');
COMMIT;

-- idem_finish_bytes(tenant, endpoint, key, status, body bytea, headers,
-- lease_token)
SELECT label, bi.t(replace(stmt, 'TOKEN', (SELECT token::text FROM bi.tok))) FROM (VALUES
  ('tenant NULL',        $$SELECT idempotency.idem_finish_bytes(NULL, 'POST /lease', 'k-leased', 200, '\x00', NULL, TOKEN)$$),
  ('endpoint NULL',      $$SELECT idempotency.idem_finish_bytes('t', NULL, 'k-leased', 200, '\x00', NULL, TOKEN)$$),
  ('key NULL',           $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', NULL, 200, '\x00', NULL, TOKEN)$$),
  ('status NULL',        $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', NULL, '\x00', NULL, TOKEN)$$),
  ('body NULL',          $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', 204, NULL, NULL, TOKEN)$$),
  ('body empty',         $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', 200, '', NULL, TOKEN)$$),
  ('lease_token NULL',   $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', 200, '\x00', NULL, NULL)$$),
  ('status 600',         $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', 600, '\x00', NULL, TOKEN)$$),
  ('body = max_response_bytes', $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', 200, convert_to(repeat('x', 262144), 'UTF8'), NULL, TOKEN)$$),
  ('body > max_response_bytes', $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', 200, convert_to(repeat('x', 262145), 'UTF8'), NULL, TOKEN)$$),
  ('headers array',      $$SELECT idempotency.idem_finish_bytes('t', 'POST /lease', 'k-leased', 200, '\x00', '[]', TOKEN)$$)
) AS v(label, stmt);

-- idem_finish_ref(tenant, endpoint, key, status, body_ref, headers,
-- lease_token)
SELECT label, bi.t(replace(stmt, 'TOKEN', (SELECT token::text FROM bi.tok))) FROM (VALUES
  ('tenant NULL',        $$SELECT idempotency.idem_finish_ref(NULL, 'POST /lease', 'k-leased', 200, 's3://b/o', NULL, TOKEN)$$),
  ('endpoint NULL',      $$SELECT idempotency.idem_finish_ref('t', NULL, 'k-leased', 200, 's3://b/o', NULL, TOKEN)$$),
  ('key NULL',           $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', NULL, 200, 's3://b/o', NULL, TOKEN)$$),
  ('status NULL',        $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', 'k-leased', NULL, 's3://b/o', NULL, TOKEN)$$),
  ('body_ref NULL',      $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', 'k-leased', 200, NULL, NULL, TOKEN)$$),
  ('body_ref empty',     $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', 'k-leased', 200, '', NULL, TOKEN)$$),
  ('body_ref 1 MB',      $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', 'k-leased', 200, repeat('r', 1048576), NULL, TOKEN)$$),
  ('lease_token NULL',   $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', 'k-leased', 200, 's3://b/o', NULL, NULL)$$),
  ('status 600',         $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', 'k-leased', 600, 's3://b/o', NULL, TOKEN)$$),
  ('headers string',     $$SELECT idempotency.idem_finish_ref('t', 'POST /lease', 'k-leased', 200, 's3://b/o', '"x"', TOKEN)$$)
) AS v(label, stmt);

-- idem_fail(tenant, endpoint, key, outcome, reason, lease_token)
SELECT label, bi.t(replace(stmt, 'TOKEN', (SELECT token::text FROM bi.tok))) FROM (VALUES
  ('tenant NULL',        $$SELECT idempotency.idem_fail(NULL, 'POST /lease', 'k-leased', 'failed', 'r', TOKEN)$$),
  ('endpoint NULL',      $$SELECT idempotency.idem_fail('t', NULL, 'k-leased', 'failed', 'r', TOKEN)$$),
  ('key NULL',           $$SELECT idempotency.idem_fail('t', 'POST /lease', NULL, 'failed', 'r', TOKEN)$$),
  ('outcome NULL',       $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', NULL, 'r', TOKEN)$$),
  ('outcome empty',      $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', '', 'r', TOKEN)$$),
  ('outcome FAILED',     $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', 'FAILED', 'r', TOKEN)$$),
  ('outcome completed',  $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', 'completed', 'r', TOKEN)$$),
  ('reason NULL',        $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', 'failed', NULL, TOKEN)$$),
  ('reason empty',       $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', 'failed', '', TOKEN)$$),
  ('reason 1 MB',        $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', 'failed', repeat('r', 1048576), TOKEN)$$),
  ('lease_token NULL',   $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-leased', 'failed', 'r', NULL)$$),
  ('failed key again',   $$SELECT idempotency.idem_fail('t', 'POST /lease', 'k-failed', 'failed', 'r')$$)
) AS v(label, stmt);

-- idem_release(tenant, endpoint, key, lease_token)
SELECT label, bi.t(replace(stmt, 'TOKEN', (SELECT token::text FROM bi.tok))) FROM (VALUES
  ('tenant NULL',        $$SELECT idempotency.idem_release(NULL, 'POST /lease', 'k-leased', TOKEN)$$),
  ('endpoint NULL',      $$SELECT idempotency.idem_release('t', NULL, 'k-leased', TOKEN)$$),
  ('key NULL',           $$SELECT idempotency.idem_release('t', 'POST /lease', NULL, TOKEN)$$),
  ('lease_token NULL',   $$SELECT idempotency.idem_release('t', 'POST /lease', 'k-leased', NULL)$$),
  ('lease_token 0',      $$SELECT idempotency.idem_release('t', 'POST /lease', 'k-leased', 0)$$),
  ('completed key',      $$SELECT idempotency.idem_release('t', 'POST /pay', 'k-done')$$),
  ('tenant 256 bytes',   $$SELECT idempotency.idem_release(repeat('t', 256), 'POST /lease', 'k-leased', TOKEN)$$)
) AS v(label, stmt);

-- idem_heartbeat(tenant, endpoint, key, lease_token, extend)
SELECT label, bi.t(replace(stmt, 'TOKEN', (SELECT token::text FROM bi.tok))) FROM (VALUES
  ('tenant NULL',        $$SELECT idempotency.idem_heartbeat(NULL, 'POST /lease', 'k-leased', TOKEN, '1 minute') > now()$$),
  ('endpoint NULL',      $$SELECT idempotency.idem_heartbeat('t', NULL, 'k-leased', TOKEN, '1 minute') > now()$$),
  ('key NULL',           $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', NULL, TOKEN, '1 minute') > now()$$),
  ('lease_token NULL',   $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', NULL, '1 minute') > now()$$),
  ('extend NULL',        $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, NULL) > now()$$),
  ('extend negative',    $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, '-1 minute') > now()$$),
  ('extend zero',        $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, '0') > now()$$),
  ('extend past expiry', $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, '2 days') > now()$$),
  ('extend huge',        $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, '178000000 years') > now()$$),
  ('extend huge negative', $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, '-178000000 years') > now()$$),
  ('extend 101 years',   $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, '101 years') > now()$$),
  ('extend 100 years',   $$SELECT idempotency.idem_heartbeat('t', 'POST /lease', 'k-leased', TOKEN, '100 years') > now()$$),
  ('completed key',      $$SELECT idempotency.idem_heartbeat('t', 'POST /pay', 'k-done', 1, '1 minute') > now()$$)
) AS v(label, stmt);

-- idem_resolve(tenant, endpoint, key, status, body jsonb, headers), on the
-- failed key
SELECT label, bi.t(stmt) FROM (VALUES
  ('tenant NULL',        $$SELECT idempotency.idem_resolve(NULL, 'POST /lease', 'k-failed', 200, '{}')$$),
  ('endpoint NULL',      $$SELECT idempotency.idem_resolve('t', NULL, 'k-failed', 200, '{}')$$),
  ('key NULL',           $$SELECT idempotency.idem_resolve('t', 'POST /lease', NULL, 200, '{}')$$),
  ('status NULL',        $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-failed', NULL, '{}')$$),
  ('body NULL',          $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-failed', 200, NULL)$$),
  ('headers NULL',       $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-failed', 200, '{}', NULL)$$),
  ('status 99',          $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-failed', 99, '{}')$$),
  ('status 600',         $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-failed', 600, '{}')$$),
  ('body > max_response_bytes', $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-failed', 200, to_jsonb(repeat('x', 262143)))$$),
  ('headers array',      $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-failed', 200, '{}', '[1]')$$),
  ('in-progress key',    $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-leased', 200, '{}')$$),
  ('missing key',        $$SELECT idempotency.idem_resolve('t', 'POST /lease', 'k-never', 200, '{}')$$)
) AS v(label, stmt);

-- idem_lookup(tenant, endpoint, key)
SELECT label, bi.t(stmt) FROM (VALUES
  ('tenant NULL',        $$SELECT count(*) FROM idempotency.idem_lookup(NULL, 'POST /pay', 'k-done')$$),
  ('endpoint NULL',      $$SELECT count(*) FROM idempotency.idem_lookup('t', NULL, 'k-done')$$),
  ('key NULL',           $$SELECT count(*) FROM idempotency.idem_lookup('t', 'POST /pay', NULL)$$),
  ('key empty',          $$SELECT count(*) FROM idempotency.idem_lookup('t', 'POST /pay', '')$$),
  ('key 256',            $$SELECT count(*) FROM idempotency.idem_lookup('t', 'POST /pay', repeat('k', 256))$$),
  ('missing key',        $$SELECT count(*) FROM idempotency.idem_lookup('t', 'POST /pay', 'k-never')$$)
) AS v(label, stmt);

-- the fingerprint functions: STRICT except idem_fingerprint
SELECT label, bi.t(stmt) FROM (VALUES
  ('canonical_json NULL',          $$SELECT idempotency.idem_canonical_json(NULL)$$),
  ('canonical_json exclude NULL',  $$SELECT idempotency.idem_canonical_json('{}', NULL)$$),
  ('canonical_json malformed',     $$SELECT idempotency.idem_canonical_json('{"a": ')$$),
  ('canonical_json exclude {}',    $$SELECT idempotency.idem_canonical_json('{"a": 1}', '{}')$$),
  ('canonical_json exclude {NULL}', $$SELECT idempotency.idem_canonical_json('{"a": 1}', '{NULL}')$$),
  ('canonical_json exclude empty', $$SELECT idempotency.idem_canonical_json('{"a": 1}', '{""}')$$),
  ('canonical_json exclude no /',  $$SELECT idempotency.idem_canonical_json('{"a": 1}', '{a}')$$),
  ('canonical_json exclude ~2',    $$SELECT idempotency.idem_canonical_json('{"a": 1}', '{/~2}')$$),
  ('canonical_json exclude 2-D',   $$SELECT idempotency.idem_canonical_json('{"a": 1}', '{{/a},{/b}}')$$),
  ('canonical_json exclude 10000', $$SELECT idempotency.idem_canonical_json('{"a": 1}', (SELECT array_agg('/x' || g) FROM generate_series(1, 10000) g))$$),
  ('canonical_json depth 5000',    $$SELECT length(idempotency.idem_canonical_json((repeat('[', 5000) || repeat(']', 5000))::jsonb))$$),
  ('canonical_json 1e308',         $$SELECT idempotency.idem_canonical_json('1e308')$$),
  ('canonical_json 1e309',         $$SELECT idempotency.idem_canonical_json('1e309')$$),
  ('canonical_json 1e-400',        $$SELECT idempotency.idem_canonical_json('1e-400')$$),
  ('canonical_json_sha256 NULL',   $$SELECT idempotency.idem_canonical_json_sha256(NULL)$$),
  ('canonical_json_sha256 1e309',  $$SELECT idempotency.idem_canonical_json_sha256('[1e309]')$$),
  ('canonical_json_sha256 excl. NULL', $$SELECT idempotency.idem_canonical_json_sha256('{}', NULL)$$),
  ('canonical_json_sha256 excl. {NULL}', $$SELECT idempotency.idem_canonical_json_sha256('{}', '{NULL}')$$),
  ('canonical_json_text NULL',     $$SELECT idempotency.idem_canonical_json_text(NULL)$$),
  ('canonical_json_text empty',    $$SELECT idempotency.idem_canonical_json_text('')$$),
  ('canonical_json_text spaces',   $$SELECT idempotency.idem_canonical_json_text('   ')$$),
  ('canonical_json_text unclosed', $$SELECT idempotency.idem_canonical_json_text('{"a": 1')$$),
  ('canonical_json_text trailing', $$SELECT idempotency.idem_canonical_json_text('{} x')$$),
  ('canonical_json_text comma',    $$SELECT idempotency.idem_canonical_json_text('[1,]')$$),
  ('canonical_json_text NaN',      $$SELECT idempotency.idem_canonical_json_text('NaN')$$),
  ('canonical_json_text 01',       $$SELECT idempotency.idem_canonical_json_text('01')$$),
  ('canonical_json_text duplicate', $$SELECT idempotency.idem_canonical_json_text('{"a": 1, "a": 2}')$$),
  ('canonical_json_text lone surrogate', $$SELECT idempotency.idem_canonical_json_text('"\ud800"')$$),
  ('canonical_json_text \u0000',   $$SELECT idempotency.idem_canonical_json_text('"\u0000"')$$),
  ('canonical_json_text bad escape', $$SELECT idempotency.idem_canonical_json_text('"\x"')$$),
  ('canonical_json_text control char', $$SELECT idempotency.idem_canonical_json_text(E'"\t"')$$),
  ('canonical_json_text 1e309',    $$SELECT idempotency.idem_canonical_json_text('1e309')$$),
  ('canonical_json_text depth 5000', $$SELECT length(idempotency.idem_canonical_json_text(repeat('[', 5000) || repeat(']', 5000)))$$),
  ('canonical_json_text depth 1000000', $$SELECT length(idempotency.idem_canonical_json_text(repeat('[', 1000000) || repeat(']', 1000000)))$$),
  ('canonical_json_text excl. NULL', $$SELECT idempotency.idem_canonical_json_text('{}', NULL)$$),
  ('canonical_json_text excl. no /', $$SELECT idempotency.idem_canonical_json_text('{}', '{a}')$$),
  ('canonical_json_text_sha256 NULL', $$SELECT idempotency.idem_canonical_json_text_sha256(NULL)$$),
  ('canonical_json_text_sha256 empty', $$SELECT idempotency.idem_canonical_json_text_sha256('')$$),
  ('canonical_json_text_sha256 dup', $$SELECT idempotency.idem_canonical_json_text_sha256('{"a": 1, "a": 2}')$$),
  ('canonical_json_text_sha256 excl. {NULL}', $$SELECT idempotency.idem_canonical_json_text_sha256('{}', '{NULL}')$$),
  ('fingerprint method NULL',      $$SELECT idempotency.idem_fingerprint(NULL, '/p', '{}')$$),
  ('fingerprint path NULL',        $$SELECT idempotency.idem_fingerprint('POST', NULL, '{}')$$),
  ('fingerprint body NULL',        $$SELECT idempotency.idem_fingerprint('POST', '/p', NULL)$$),
  ('fingerprint exclude NULL',     $$SELECT idempotency.idem_fingerprint('POST', '/p', '{}', NULL)$$),
  ('fingerprint method empty',     $$SELECT idempotency.idem_fingerprint('', '/p', '{}')$$),
  ('fingerprint method space',     $$SELECT idempotency.idem_fingerprint('PO ST', '/p', '{}')$$),
  ('fingerprint method newline',   $$SELECT idempotency.idem_fingerprint(E'POST\n', '/p', '{}')$$),
  ('fingerprint method non-ASCII', $$SELECT idempotency.idem_fingerprint('PÖST', '/p', '{}')$$),
  ('fingerprint path empty',       $$SELECT idempotency.idem_fingerprint('POST', '', '{}')$$),
  ('fingerprint path newline',     $$SELECT idempotency.idem_fingerprint('POST', E'/p\n', '{}')$$),
  ('fingerprint path DEL',         $$SELECT idempotency.idem_fingerprint('POST', E'/p\x7f', '{}')$$),
  ('fingerprint path 1 MB',        $$SELECT idempotency.idem_fingerprint('POST', repeat('/', 1048576), '{}')$$),
  ('fingerprint exclude {NULL}',   $$SELECT idempotency.idem_fingerprint('POST', '/p', '{}', '{NULL}')$$),
  ('fingerprint body 1e309',       $$SELECT idempotency.idem_fingerprint('POST', '/p', '[1e309]')$$),
  ('number_text NULL',             $$SELECT idempotency.idem_number_text(NULL)$$),
  ('number_text NaN',              $$SELECT idempotency.idem_number_text('NaN')$$),
  ('number_text Infinity',         $$SELECT idempotency.idem_number_text('Infinity')$$),
  ('number_text -Infinity',        $$SELECT idempotency.idem_number_text('-Infinity')$$),
  ('number_text -0',               $$SELECT idempotency.idem_number_text('-0')$$),
  ('number_text smallest',         $$SELECT idempotency.idem_number_text('4.9e-324')$$),
  ('number_text largest',          $$SELECT idempotency.idem_number_text('1.7976931348623157e308')$$)
) AS v(label, stmt);

-- key helpers
SELECT label, bi.t(stmt) FROM (VALUES
  ('key_valid NULL',               $$SELECT idempotency.idem_key_valid(NULL)$$),
  ('key_valid empty',              $$SELECT idempotency.idem_key_valid('')$$),
  ('key_valid 255',                $$SELECT idempotency.idem_key_valid(repeat('k', 255))$$),
  ('key_valid 256',                $$SELECT idempotency.idem_key_valid(repeat('k', 256))$$),
  ('key_valid non-ASCII',          $$SELECT idempotency.idem_key_valid('clé')$$),
  ('uuidv7 (no arguments)',        $$SELECT length(idempotency.idem_uuidv7()::text)$$),
  ('ulid (no arguments)',          $$SELECT length(idempotency.idem_ulid())$$),
  ('token (no arguments)',         $$SELECT length(idempotency.idem_token())$$),
  ('downstream_key tenant NULL',   $$SELECT idempotency.idem_downstream_key(NULL, 'e', 'k', 's')$$),
  ('downstream_key endpoint NULL', $$SELECT idempotency.idem_downstream_key('t', NULL, 'k', 's')$$),
  ('downstream_key key NULL',      $$SELECT idempotency.idem_downstream_key('t', 'e', NULL, 's')$$),
  ('downstream_key step NULL',     $$SELECT idempotency.idem_downstream_key('t', 'e', 'k', NULL)$$),
  ('downstream_key tenant empty',  $$SELECT idempotency.idem_downstream_key('', 'e', 'k', 's')$$),
  ('downstream_key key empty',     $$SELECT idempotency.idem_downstream_key('t', 'e', '', 's')$$),
  ('downstream_key step empty',    $$SELECT idempotency.idem_downstream_key('t', 'e', 'k', '')$$),
  ('downstream_key key 256',       $$SELECT idempotency.idem_downstream_key('t', 'e', repeat('k', 256), 's')$$),
  ('downstream_key tenant 256',    $$SELECT idempotency.idem_downstream_key(repeat('t', 256), 'e', 'k', 's')$$),
  ('downstream_key step 1 MB',     $$SELECT length(idempotency.idem_downstream_key('t', 'e', 'k', repeat('s', 1048576)))$$),
  ('key_hash tenant NULL',         $$SELECT idempotency.idem_key_hash(NULL, 'e', 'k')$$),
  ('key_hash endpoint NULL',       $$SELECT idempotency.idem_key_hash('t', NULL, 'k')$$),
  ('key_hash key NULL',            $$SELECT idempotency.idem_key_hash('t', 'e', NULL)$$),
  ('key_hash empty',               $$SELECT idempotency.idem_key_hash('', '', '')$$),
  ('key_hash key 256',             $$SELECT idempotency.idem_key_hash('t', 'e', repeat('k', 256))$$),
  ('key_hash key 255',             $$SELECT idempotency.idem_key_hash('t', 'e', repeat('k', 255))$$),
  ('key_hash key space',           $$SELECT idempotency.idem_key_hash('t', 'e', 'k 1')$$),
  ('key_hash tenant 256',          $$SELECT idempotency.idem_key_hash(repeat('t', 256), 'e', 'k')$$),
  ('key_hash endpoint empty',      $$SELECT idempotency.idem_key_hash('t', '', 'k')$$)
) AS v(label, stmt);

-- counters, maintenance, and the trigger functions called directly
SELECT label, bi.t(stmt) FROM (VALUES
  ('stats missing_ok NULL',        $$SELECT count(*) > 0 FROM idempotency.idem_stats(NULL)$$),
  ('stats missing_ok false',       $$SELECT count(*) > 0 FROM idempotency.idem_stats(false)$$),
  ('stats_reset (no arguments)',   $$SELECT idempotency.idem_stats_reset() IS NOT NULL$$),
  ('maintenance as_of NULL',       $$SELECT count(*) FROM idempotency.idem_maintenance(NULL)$$),
  ('maintenance as_of infinity',   $$SELECT string_agg(kind, ',') FROM idempotency.idem_maintenance('infinity')$$),
  ('maintenance as_of -infinity',  $$SELECT string_agg(kind, ',') FROM idempotency.idem_maintenance('-infinity')$$),
  ('maintenance as_of 44 BC',      $$SELECT string_agg(kind, ',') FROM idempotency.idem_maintenance('0044-03-15 00:00:00+00 BC')$$),
  ('maintenance as_of 4713 BC',    $$SELECT string_agg(kind, ',') FROM idempotency.idem_maintenance('4713-01-01 00:00:00+00 BC')$$),
  ('maintenance as_of year 294276', $$SELECT string_agg(kind, ',') FROM idempotency.idem_maintenance('294276-12-25 00:00:00+00')$$),
  ('endpoints_changed called',     $$SELECT idempotency.idem_endpoints_changed()$$),
  ('events_guard called',          $$SELECT idempotency.idem_events_guard()$$)
) AS v(label, stmt);

-- policies of idempotency.endpoints, which its trigger reads
SELECT label, bi.t(stmt) FROM (VALUES
  ('endpoint empty',               $$INSERT INTO idempotency.endpoints (endpoint) VALUES ('') RETURNING endpoint$$),
  ('endpoint 256',                 $$INSERT INTO idempotency.endpoints (endpoint) VALUES (repeat('e', 256)) RETURNING endpoint$$),
  ('ttl zero',                     $$INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('e', '0') RETURNING endpoint$$),
  ('lease negative',               $$INSERT INTO idempotency.endpoints (endpoint, lease) VALUES ('e', '-1 s') RETURNING endpoint$$),
  ('max_response_bytes -1',        $$INSERT INTO idempotency.endpoints (endpoint, max_response_bytes) VALUES ('e', -1) RETURNING endpoint$$),
  ('on_lease_expiry bogus',        $$INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry) VALUES ('e', 'x') RETURNING endpoint$$),
  ('resolve without resolver',     $$INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry) VALUES ('e', 'resolve') RETURNING endpoint$$),
  ('resolver of wrong signature',  $$INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver) VALUES ('e', 'resolve', 'pg_catalog.now()') RETURNING endpoint$$),
  ('ttl huge',                     $$INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('e', '178000000 years') RETURNING endpoint$$),
  ('ttl 1 microsecond',            $$INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('e', '1 microsecond') RETURNING endpoint$$),
  ('ttl 100 years',                $$INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('e', '100 years') RETURNING endpoint$$),
  ('ttl 100 years 1 us',           $$INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('e', '100 years 1 microsecond') RETURNING endpoint$$),
  ('ttl 1 month -31 days',         $$INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('e', '1 month -31 days') RETURNING endpoint$$),
  ('lease zero',                   $$INSERT INTO idempotency.endpoints (endpoint, lease) VALUES ('e', '0') RETURNING endpoint$$),
  ('lease 100 years',              $$INSERT INTO idempotency.endpoints (endpoint, lease) VALUES ('e', '100 years') RETURNING endpoint$$),
  ('lease 100 years 1 us',         $$INSERT INTO idempotency.endpoints (endpoint, lease) VALUES ('e', '100 years 1 microsecond') RETURNING endpoint$$),
  ('lease huge, by update',        $$UPDATE idempotency.endpoints SET lease = '178000000 years' WHERE endpoint = 'POST /lease' RETURNING endpoint$$),
  ('redact ok',                    $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', '{/card/number,/items/*/pan,/a~1b}') RETURNING endpoint$$),
  ('redact empty array',           $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', '{}') RETURNING endpoint$$),
  ('redact NULL element',          $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', '{/a,NULL}') RETURNING endpoint$$),
  ('redact empty pointer',         $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', '{""}') RETURNING endpoint$$),
  ('redact without /',             $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', '{card}') RETURNING endpoint$$),
  ('redact bad ~',                 $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', '{/a~2}') RETURNING endpoint$$),
  ('redact 64 pointers',           $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', (SELECT array_agg('/p' || g) FROM generate_series(1, 64) g)) RETURNING endpoint$$),
  ('redact 65 pointers',           $$INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact) VALUES ('e', (SELECT array_agg('/p' || g) FROM generate_series(1, 65) g)) RETURNING endpoint$$),
  ('check called',                 $$SELECT idempotency.idem_endpoints_check()$$)
) AS v(label, stmt);

-- nothing of the above stayed
SELECT tenant, endpoint, key, state FROM idempotency.keys ORDER BY key;
SELECT endpoint FROM idempotency.endpoints ORDER BY 1;

DELETE FROM idempotency.keys;
DELETE FROM idempotency.endpoints;
DROP SCHEMA bi CASCADE;
-- leave the database as the tests that follow expect it: without the
-- extension
DROP EXTENSION idempotency;
DROP EXTENSION pgcrypto;
