--
-- ECMAScript number serialization: 100,000 vectors (test/data, see its
-- README) of IEEE-754 bit patterns and the text Node.js gives for them.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
SET search_path = idempotency, public;
\getenv abs_srcdir PG_ABS_SRCDIR
\set vectors :abs_srcdir '/data/es6-numbers-100k.txt'

CREATE TEMP TABLE es6 (hex text, expected text);
COPY es6 FROM :'vectors' WITH (FORMAT csv);
SELECT count(*) AS vectors FROM es6;

-- the double of each bit pattern, decoded in SQL (exact: a power of two
-- times an integer below 2^53)
CREATE TEMP TABLE es6v AS
SELECT hex, expected,
       CASE WHEN bits < 0 THEN -1 ELSE 1 END *
       CASE WHEN e = 0 THEN m::float8 * power(2::float8, -1074)
            ELSE (m + (1::bigint << 52))::float8 * power(2::float8, e - 1075) END AS x
FROM (SELECT hex, expected, bits,
             ((bits >> 52) & 2047)::int AS e,
             bits & ((1::bigint << 52) - 1) AS m
      FROM (SELECT hex, expected, ('x' || lpad(hex, 16, '0'))::bit(64)::bigint AS bits
            FROM es6) s) t;

-- float8 path: every vector must match
SELECT count(*) FILTER (WHERE idem_number_text(x) IS DISTINCT FROM expected) AS float8_mismatches
FROM es6v;
-- decimal text path: the expected text read back as a jsonb number
SELECT count(*) FILTER (WHERE idem_canonical_json(expected::jsonb) IS DISTINCT FROM expected) AS jsonb_mismatches
FROM es6v;
-- another decimal form of the same double: PostgreSQL's own float8 output
SELECT count(*) FILTER (WHERE idem_canonical_json(to_jsonb(x)) IS DISTINCT FROM expected) AS to_jsonb_mismatches
FROM es6v;
-- 17 significant digits, the longest decimal that still reads back
SELECT count(*) FILTER (WHERE idem_canonical_json(ltrim(to_char(x, '9.9999999999999999EEEE'))::jsonb) IS DISTINCT FROM expected)
       AS digits17_mismatches
FROM es6v WHERE x <> 0;

-- raw JSON text takes its own path: the same forms, and as through jsonb
SELECT count(*) FILTER (WHERE idem_canonical_json_text(expected) IS DISTINCT FROM expected) AS text_mismatches,
       count(*) FILTER (WHERE idem_canonical_json_text(to_jsonb(x)::text) IS DISTINCT FROM expected) AS text_float8_mismatches,
       count(*) FILTER (WHERE x <> 0 AND idem_canonical_json_text(ltrim(to_char(x, '9.9999999999999999EEEE')))
                              IS DISTINCT FROM expected) AS text_digits17_mismatches
FROM es6v;

-- PostgreSQL's own shortest form (float8out) is not ECMAScript's on the
-- doubles whose shortest decimal lies exactly halfway to a neighbour (see
-- number_format.c): it gives them more digits, and differs nowhere else
SET extra_float_digits = 1;
SELECT count(*) FILTER (WHERE pg_digits <> es_digits) AS float8out_differs,
       count(*) FILTER (WHERE length(pg_digits) > length(es_digits)) AS float8out_longer,
       count(*) FILTER (WHERE pg_digits <> es_digits AND ('x' || lpad(hex, 16, '0'))::bit(64)::bigint % 2 = 0)
           AS of_them_even
FROM (SELECT hex, trim(regexp_replace(split_part(x::text, 'e', 1), '[^0-9]', '', 'g'), '0') AS pg_digits,
             trim(regexp_replace(split_part(expected, 'e', 1), '[^0-9]', '', 'g'), '0') AS es_digits
      FROM es6v WHERE x <> 0) s;
RESET extra_float_digits;
SELECT hex, expected, x::text AS float8out
FROM es6v WHERE hex IN ('44b52d02c7e14af6', '4365ba350e3c3bcc') ORDER BY hex;

-- a few samples
SELECT hex, expected, idem_number_text(x) AS got
FROM es6v
WHERE hex IN ('0', '8000000000000000', '1', '7fefffffffffffff', '444b1ae4d6e2ef50',
              '3eb0c6f7a0b5ed8d', '3eb0c6f7a0b5ed8c', '44b52d02c7e14af5', '3fd5555555555555')
ORDER BY hex;
