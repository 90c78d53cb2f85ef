--
-- Key helpers: formats, version and variant bits, ordering of successive
-- values, uniqueness, and determinism of downstream keys.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
SET search_path = idempotency, public;

-- idem_uuidv7: RFC 9562 version 7, variant 10
CREATE TEMP TABLE u AS
SELECT n, idem_uuidv7() AS v FROM generate_series(1, 20000) AS n;

SELECT count(*) AS n,
       count(DISTINCT v) AS distinct_values,
       bool_and(v::text ~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$')
           AS version_7_variant_10
FROM u;

-- each value is larger than the one made before it (in the session)
SELECT count(*) AS not_increasing
FROM (SELECT v, lag(v) OVER (ORDER BY n) AS prev FROM u) s
WHERE prev IS NOT NULL AND v <= prev;

-- the first 48 bits are the Unix time in milliseconds of the call; a value
-- may run ahead of the clock only when a millisecond's counter is exhausted
SELECT bool_and(abs(ms - extract(epoch FROM clock_timestamp()) * 1000) < 600000)
           AS time_is_now
FROM (SELECT ('x' || lpad(replace(v::text, '-', ''), 32, '0'))::bit(128)::bit(48)::bigint AS ms
      FROM u) s;

-- idem_ulid: 26 characters of Crockford base32; the first is at most 7
CREATE TEMP TABLE l AS
SELECT n, idem_ulid() AS v FROM generate_series(1, 20000) AS n;

SELECT count(*) AS n,
       count(DISTINCT v) AS distinct_values,
       bool_and(v ~ '^[0-7][0-9A-HJKMNP-TV-Z]{25}$') AS crockford_26
FROM l;

SELECT count(*) AS not_increasing
FROM (SELECT v, lag(v) OVER (ORDER BY n) AS prev FROM l) s
WHERE prev IS NOT NULL AND v COLLATE "C" <= prev COLLATE "C";

-- its first 10 characters are the same milliseconds as a UUIDv7 made now
CREATE FUNCTION pg_temp.crockford_decode(s text) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT sum((strpos('0123456789ABCDEFGHJKMNPQRSTVWXYZ', substr(s, i, 1)) - 1)
               * 32::numeric ^ (length(s) - i))
    FROM generate_series(1, length(s)) AS i
$$;
SELECT abs(pg_temp.crockford_decode(left(idem_ulid(), 10))
           - extract(epoch FROM clock_timestamp()) * 1000) < 600000 AS ulid_time_is_now;

-- every helper gives a key the claim accepts
SELECT bool_and(idem_key_valid(v::text)) AS uuid_valid FROM u;
SELECT bool_and(idem_key_valid(v)) AS ulid_valid FROM l;

-- idem_token: 22 characters of base64url, 128 random bits
CREATE TEMP TABLE t AS SELECT idem_token() AS v FROM generate_series(1, 20000);
SELECT count(*) AS n,
       count(DISTINCT v) AS distinct_values,
       bool_and(v ~ '^[A-Za-z0-9_-]{21}[AQgw]$') AS base64url_22,
       bool_and(idem_key_valid(v)) AS valid
FROM t;
-- every base64url character appears in some first position (randomness)
SELECT count(DISTINCT left(v, 1)) AS first_chars FROM t;

-- idem_downstream_key: deterministic, valid, and different for any
-- difference in the scope or the step
SELECT idem_downstream_key('acme', 'POST /payments', 'k-1', 'charge')
     = idem_downstream_key('acme', 'POST /payments', 'k-1', 'charge') AS deterministic;
SELECT length(k) AS length, idem_key_valid(k) AS valid, k ~ '^[A-Za-z0-9_-]{43}$' AS base64url
FROM (SELECT idem_downstream_key('acme', 'POST /payments', 'k-1', 'charge') AS k) s;
SELECT count(DISTINCT k) AS distinct_keys
FROM (VALUES (idem_downstream_key('acme', 'POST /payments', 'k-1', 'charge')),
             (idem_downstream_key('other', 'POST /payments', 'k-1', 'charge')),
             (idem_downstream_key('acme', 'POST /refunds', 'k-1', 'charge')),
             (idem_downstream_key('acme', 'POST /payments', 'k-2', 'charge')),
             (idem_downstream_key('acme', 'POST /payments', 'k-1', 'capture')),
             -- the framing keeps the boundaries between the parts
             (idem_downstream_key('acm', 'eP', 'k-1', 'charge')),
             (idem_downstream_key('acme', 'POST /payments', 'k-1c', 'harge'))) AS v(k);
-- a known value, so that the derivation cannot change unnoticed between
-- versions (keys already sent to providers must stay the same)
SELECT idem_downstream_key('acme', 'POST /payments', 'k-1', 'charge') AS known_value;
-- the documented derivation, written in SQL
SELECT translate(rtrim(encode(sha256(
           convert_to('idempotency downstream key v1', 'UTF8')
           || int4send(4) || convert_to('acme', 'UTF8')
           || int4send(14) || convert_to('POST /payments', 'UTF8')
           || int4send(3) || convert_to('k-1', 'UTF8')
           || int4send(6) || convert_to('charge', 'UTF8')), 'base64'), '='), '+/', '-_')
     = idem_downstream_key('acme', 'POST /payments', 'k-1', 'charge') AS documented;

-- the scope and the key are checked as the claim checks them
\set VERBOSITY terse
SELECT idem_downstream_key('acme', 'POST /payments', 'bad key', 'charge');
SELECT idem_downstream_key(NULL, 'POST /payments', 'k-1', 'charge');
SELECT idem_downstream_key('acme', 'POST /payments', 'k-1', '');
SELECT idem_downstream_key('acme', 'POST /payments', 'k-1', NULL);
\set VERBOSITY default

-- idem_key_hash: 16 hex characters, the documented SHA-256 prefix
SELECT idem_key_hash('acme', 'POST /payments', 'k-1') AS key_hash,
       idem_key_hash('acme', 'POST /payments', 'k-1')
     = left(encode(sha256(int4send(4) || convert_to('acme', 'UTF8')
                          || int4send(14) || convert_to('POST /payments', 'UTF8')
                          || int4send(3) || convert_to('k-1', 'UTF8')), 'hex'), 16)
           AS documented;
SELECT idem_key_hash('acme', 'POST /payments', 'k-1')
    <> idem_key_hash('other', 'POST /payments', 'k-1') AS scoped;
