--
-- Request fingerprints: RFC 8785 canonical JSON, its SHA-256, exclusions by
-- JSON Pointer, raw JSON text, idem_fingerprint's framing, bad input.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
SET search_path = idempotency, public;

-- errors shown as SQLSTATE and message
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- member order: UTF-16 code units, not jsonb's shortest-first order
SELECT idem_canonical_json('{"bb": 1, "a": 2, "ab": 3, "": 4, "B": 5, "b": 6}');
-- U+FB33 (one UTF-16 unit, EF AC B3) sorts after U+1F602 (surrogate pair
-- D83D DE02), although its code point is smaller; U+00F6 and U+20AC before
SELECT idem_canonical_json(jsonb_build_object(
    U&'\FB33', 1, U&'\+01F602', 2, U&'\00F6', 3, U&'\20AC', 4, 'z', 5));
-- same lead surrogate, different trail: code point order
SELECT idem_canonical_json(jsonb_build_object(U&'\+01F603', 1, U&'\+01F602', 2, U&'\E000', 3));

-- nested structures, literals, no white space
SELECT idem_canonical_json('{"z": [true, false, null, {"y": {}, "x": []}], "a": {"c": "d"}}');
SELECT idem_canonical_json('"just a string"'), idem_canonical_json('null'),
       idem_canonical_json('true'), idem_canonical_json('[]'), idem_canonical_json('{}');

-- numbers through the double, in ECMAScript form
SELECT n, idem_canonical_json(n::jsonb) AS canonical
FROM (VALUES ('4200'), ('4200.0'), ('4.2e3'), ('42e2'), ('1e21'), ('1e20'),
             ('123456789012345678901'), ('0.0000001'), ('1e-7'), ('0.000001'),
             ('-0'), ('-0.0'), ('0e10'), ('-1.5'), ('0.1'), ('1.0000000000000001'),
             ('333333333.33333329'), ('9007199254740993'), ('1e308'),
             ('1.7976931348623157e308'), ('5e-324'), ('2.5e-324'),
             ('123.456e-300'), ('1E+2'), ('100000000000000000000000')) AS t(n);
-- hundreds of digits: still the nearest double
SELECT idem_canonical_json(('0.' || repeat('3', 400))::jsonb) AS third,
       idem_canonical_json(('-' || repeat('9', 300) || '.5')::jsonb) AS nines,
       idem_canonical_json(('1' || repeat('0', 22) || '.' || repeat('0', 30) || '1')::jsonb) AS big_plus_tiny;
-- same number, same text, however it was written
SELECT count(DISTINCT idem_canonical_json(n::jsonb)) AS distinct_forms
FROM (VALUES ('4200'), ('4200.0'), ('4.2e3'), ('4200.000'), ('0.42e4'), ('42e2')) AS t(n);

-- numbers beyond the double range are errors, not Infinity or 0
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('1e309')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('{"a": [-1.8e308]}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('1e-400')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json_text('[2e-324]')$$);

-- the float8 formatter
SELECT x, idem_number_text(x)
FROM (VALUES (0::float8), ('-0'::float8), (1), (-1), (0.1), (1e21), (1e-7), (123e-20),
             ('1.7976931348623157e308'), ('5e-324'), (2^53), (2^53 + 2),
             (1/3::float8)) AS t(x);
SELECT pg_temp.err($$SELECT idempotency.idem_number_text('NaN')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_number_text('-Infinity')$$);

-- strings: minimal escaping, everything else literal
SELECT idem_canonical_json(to_jsonb(E'q"b\\s/\b\f\n\r\t\x01\x1f\x7f' || U&'\00e9\2028\+01F600'));
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json_text('"\u0000"')$$);

-- exclusions by JSON Pointer
SELECT idem_canonical_json('{"amount": 100, "client_ts": "2026-01-01", "meta": {"trace_id": "x", "v": 1}}',
                           '{/client_ts,/meta/trace_id}');
SELECT idem_canonical_json('{"items": [{"sku": "a", "added_at": 1}, {"sku": "b", "added_at": 2}], "n": 2}',
                           '{/items/*/added_at}');
SELECT idem_canonical_json('{"items": [10, 20, 30]}', '{/items/1}');
SELECT idem_canonical_json('{"items": [10, 20, 30]}', '{/items/*}');
SELECT idem_canonical_json('{"a": {"x": 1, "y": 2}, "b": {"x": 3}}', '{/*/x}');
-- ~1 is "/", ~0 is "~"
SELECT idem_canonical_json('{"a/b": 1, "m~n": 2, "c": 3}', '{/a~1b,/m~0n}');
-- pointers that match nothing are fine; "01" and "-" are not indexes
SELECT idem_canonical_json('{"a": [1, 2], "b": "x"}', '{/nope,/a/5,/a/01,/a/-,/b/c,/a/x}');
-- a pointer to a member that holds a scalar, under a scalar
SELECT idem_canonical_json('"scalar"', '{/a}');
-- the empty member name
SELECT idem_canonical_json('{"": 1, "a": {"": 2, "b": 3}}', '{/a/}');
-- malformed pointers and NULL elements are errors
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('{}', '{a}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('{}', '{/a~2}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('{}', '{/a~}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('{}', '{""}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json('{}', ARRAY['/a', NULL])$$);

-- SHA-256 of the UTF-8 canonical bytes
SELECT idem_canonical_json_sha256('{"b": 2, "a": 1}') =
       sha256(convert_to('{"a":1,"b":2}', 'UTF8')) AS sha_matches;
SELECT encode(idem_canonical_json_sha256(jsonb_build_object('k', U&'\00e9')), 'hex') =
       encode(sha256('\x7b226b223a22c3a9227d'::bytea), 'hex') AS sha_is_over_utf8;
SELECT idem_canonical_json_sha256('{"a": 1, "ts": 5}', '{/ts}') =
       idem_canonical_json_sha256('{"a": 1.0}') AS sha_with_exclusion;

-- raw JSON text: same result as jsonb, duplicates refused
SELECT idem_canonical_json_text('{ "b" : [ 1.50 , 2e0 ], "a" : "\u00e9" }');
SELECT idem_canonical_json_text('{"b": 1, "a": {"x": 1, "y": 2}}', '{/a/y}');
SELECT idem_canonical_json_text_sha256('{"b": 2, "a": 1}') =
       idem_canonical_json_sha256('{"a": 1, "b": 2}') AS text_sha_matches;
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json_text('{"a": 1, "b": 2, "a": 3}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json_text('[{"x": {"k": 1, "k": 1}}]')$$);
-- names equal only after unescaping are duplicates too
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json_text('{"a": 1, "\u0061": 2}')$$);
-- the same names in different objects are fine
SELECT idem_canonical_json_text('{"a": {"a": 1}, "b": {"a": 2}}');
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json_text('{"a": ')$$);
-- an untyped literal is never ambiguous: each name takes one type
SELECT idem_canonical_json('{"a": 1, "a": 2}') AS jsonb_keeps_last;

-- deep nesting fails cleanly
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json_text(repeat('[', 100000) || repeat(']', 100000))$$);
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json((repeat('[', 100000) || repeat(']', 100000))::jsonb)$$);
-- a deep jsonb built without the parser reaches our own recursion check
CREATE TEMP TABLE deep (j jsonb);
DO $$
DECLARE d jsonb := '1';
BEGIN
    FOR i IN 1..3000 LOOP
        d := jsonb_build_array(d);
    END LOOP;
    INSERT INTO deep VALUES (d);
END $$;
SELECT length(idem_canonical_json(j)) AS deep_length FROM deep;
-- objects 3000 deep are fine with the default max_stack_depth
SELECT length(idem_canonical_json((repeat('{"a":', 3000) || '1' || repeat('}', 3000))::jsonb)) AS deep_objects;
SET max_stack_depth = '100kB';
SELECT pg_temp.err($$SELECT idempotency.idem_canonical_json(j) FROM deep$$);
RESET max_stack_depth;

-- NULL arguments
SELECT idem_canonical_json(NULL) IS NULL AS null_body,
       idem_canonical_json('{}', NULL) IS NULL AS null_exclude,
       idem_canonical_json_sha256(NULL) IS NULL AS null_body_sha,
       idem_canonical_json_text(NULL) IS NULL AS null_text,
       idem_number_text(NULL) IS NULL AS null_number;

-- idem_fingerprint: framing documented in the README
SELECT idem_fingerprint('POST', '/v1/payments', '{"currency": "EUR", "amount": 1000}') =
       sha256(convert_to(E'idem-fingerprint-v1\nPOST\n/v1/payments\n{"amount":1000,"currency":"EUR"}', 'UTF8'))
       AS framing_with_body;
SELECT idem_fingerprint('get', '/v1/payments/42', NULL) =
       sha256(convert_to(E'idem-fingerprint-v1\nGET\n/v1/payments/42\n', 'UTF8')) AS framing_without_body;
-- the README's worked examples
SELECT encode(idem_fingerprint('POST', '/v1/payments',
       '{"amount": 1000, "currency": "EUR", "client_ts": "2026-11-30T10:00:00Z"}', '{/client_ts}'), 'hex')
       AS readme_example_1;
SELECT encode(idem_fingerprint('delete', '/v1/payments/pay_42', NULL), 'hex') AS readme_example_2;
-- method case does not matter, the path and the body do; JSON null is a body
SELECT idem_fingerprint('post', '/p', '{"a": 1}') = idem_fingerprint('POST', '/p', '{"a": 1.0}') AS same,
       idem_fingerprint('POST', '/p', '{"a": 1}') = idem_fingerprint('POST', '/P', '{"a": 1}') AS path_case,
       idem_fingerprint('POST', '/p', NULL) = idem_fingerprint('POST', '/p', 'null') AS null_vs_json_null,
       idem_fingerprint('POST', '/p', '{"a": 1, "t": 2}', '{/t}') = idem_fingerprint('POST', '/p', '{"a": 1}') AS excluded,
       idem_fingerprint('POST', '/p', '{"a": 1}', NULL) = idem_fingerprint('POST', '/p', '{"a": 1}') AS null_exclude,
       length(idem_fingerprint('POST', '/p', NULL)) AS bytes;
SELECT pg_temp.err($$SELECT idempotency.idem_fingerprint(NULL, '/p', '{}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_fingerprint('POST', NULL, '{}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_fingerprint('', '/p', '{}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_fingerprint('PO ST', '/p', '{}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_fingerprint('POST', '', '{}')$$);
SELECT pg_temp.err($$SELECT idempotency.idem_fingerprint('POST', E'/p\nGET', '{}')$$);

-- volatility and strictness as documented; each with and without exclude
SELECT proname, pg_get_function_arguments(oid) AS args, provolatile, proparallel, proisstrict
FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace
  AND (proname LIKE 'idem_canonical%' OR proname IN ('idem_fingerprint', 'idem_number_text'))
ORDER BY proname, pronargs;
-- named arguments
SELECT idem_canonical_json(body => '{"b": 1, "a": 2}') AS named,
       idem_canonical_json(exclude => '{/a}', body => '{"b": 1, "a": 2}') AS named_exclude,
       encode(idem_fingerprint(method => 'GET', path => '/x', body => NULL), 'hex') =
       encode(sha256(convert_to(E'idem-fingerprint-v1\nGET\n/x\n', 'UTF8')), 'hex') AS named_fingerprint;

-- a body of more than 10 MB: canonical length as predicted, SHA-256 (fed
-- in chunks) equal to the hash of the whole text
CREATE TEMP TABLE big AS
SELECT jsonb_build_object('items', jsonb_agg(jsonb_build_object(
           'price', i * 1.25, 'name', 'item ' || i, 'id', i) ORDER BY i),
       'count', count(*)) AS body
FROM generate_series(1, 250000) AS i;
SELECT length(idem_canonical_json(body)) > 10000000 AS over_10mb,
       length(idem_canonical_json(body)) =
         (SELECT sum(length(format('{"id":%s,"name":"item %s","price":%s}', i, i,
                      trim(trailing '.' FROM trim(trailing '0' FROM (i * 1.25)::text)))))
                 + 249999 + length('{"count":250000,"items":[]}')
          FROM generate_series(1, 250000) AS i) AS length_as_predicted,
       idem_canonical_json_sha256(body) = sha256(convert_to(idem_canonical_json(body), 'UTF8')) AS chunked_sha
FROM big;
-- the same body without the 250,000 names
SELECT length(idem_canonical_json(body, '{/items/*/name}')) AS without_names
FROM big;

--
-- Raw JSON text is canonicalized directly when it can be: the bytes must be
-- those of the jsonb path for every document, and the documents it leaves
-- to that path must behave as before.
--
-- generated documents: nested objects and arrays, names that sort by UTF-16
-- code units, escapes, numbers of every form, white space between tokens
CREATE FUNCTION pg_temp.gen(depth int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    scalars text[] := ARRAY[
        '0', '-0', '-0.0', '1', '-1', '100', '1e21', '1E-7', '1e+2', '0.1', '2.50',
        '4.2e3', '0e10', '1e20', '0.000001', '0.0000001', '-1.5E-10', '0.1e1',
        '123456789012345678901234567890', '5e-324', '2.5e-324', '1.7976931348623157e308',
        '1.0000000000000001', '333333333.33333329', '9007199254740993', '12345678901234567',
        '0.' || repeat('3', 60), repeat('9', 100), '-' || repeat('1', 70) || 'e-5',
        'true', 'false', 'null', '""', '"plain"', '"q\"b\\s\/"', '"\b\f\n\r\t"',
        '"\u0001\u001f\u007f"', '"\u00e9\u20AC"', '"\ud83d\ude00"', '"é€😀"', '"\uFB33"',
        '"tab\there"', '"\u0022\u005c"', E'"\x7f"', '"\uffff\uFFFE"', '[]', '{}'];
    names text[] := ARRAY[
        '"a"', '"b"', '"B"', '""', '"aa"', '"ab"', '"é"', '"\u00e9x"', '"€"', '"😀"',
        '"\ud83d\ude01"', '"\uFB33"', '"\uE000"', '"a\nb"', '"a/b"', '"m~n"', '"z"',
        '"\u0061b"', '"k\"q"', '"10"', '"1"'];
    spaces text[] := ARRAY['', '', '', ' ', E'\n  ', E'\t', E' \r\n '];
    r float8 := random();
    n int := floor(random() * 6)::int;
    items text[] := '{}';
    s text;
    k text;
    used text[] := '{}';
BEGIN
    IF depth <= 0 OR r < 0.3 THEN
        RETURN scalars[1 + floor(random() * array_length(scalars, 1))::int];
    END IF;
    FOR j IN 1..n LOOP
        s := pg_temp.gen(depth - 1);
        IF r >= 0.6 THEN
            k := names[1 + floor(random() * array_length(names, 1))::int];
            -- names are unique once unescaped
            CONTINUE WHEN (k::jsonb #>> '{}') = ANY (used);
            used := used || (k::jsonb #>> '{}');
            s := k || spaces[1 + floor(random() * 7)::int] || ':' || spaces[1 + floor(random() * 7)::int] || s;
        END IF;
        items := items || s;
    END LOOP;
    s := CASE WHEN r < 0.6 THEN '[' ELSE '{' END || spaces[1 + floor(random() * 7)::int];
    FOR j IN 1..coalesce(array_length(items, 1), 0) LOOP
        IF j > 1 THEN
            s := s || spaces[1 + floor(random() * 7)::int] || ',' || spaces[1 + floor(random() * 7)::int];
        END IF;
        s := s || items[j];
    END LOOP;
    RETURN s || spaces[1 + floor(random() * 7)::int] || CASE WHEN r < 0.6 THEN ']' ELSE '}' END;
END $$;
SELECT setseed(0.8785);
CREATE TEMP TABLE xdocs AS
SELECT i, pg_temp.gen(5) AS doc FROM generate_series(1, 3000) AS i;
-- objects of more than 32 members, in any order
INSERT INTO xdocs
SELECT 3000 + g, '{' || string_agg(format('"%s": %s', k, CASE WHEN k % 7 = 0 THEN '{"y": 1, "x": [2]}' ELSE k::text END),
                                   ', ' ORDER BY md5(g::text || k::text)) || '}'
FROM generate_series(1, 20) AS g, generate_series(1, 30 + g * 3) AS k
GROUP BY g;
-- the same documents laid out by jsonb_pretty, and as compact jsonb text
INSERT INTO xdocs SELECT 10000 + i, jsonb_pretty(doc::jsonb) FROM xdocs WHERE i <= 3020;
INSERT INTO xdocs SELECT 20000 + i, doc::jsonb::text FROM xdocs WHERE i <= 3020;
SELECT count(*) AS documents,
       count(*) FILTER (WHERE doc LIKE '{%') AS objects,
       count(*) FILTER (WHERE doc::json::text = doc) AS json_keeps_text,
       count(*) FILTER (WHERE idem_canonical_json_text(doc) IS DISTINCT FROM
                              idem_canonical_json(doc::jsonb)) AS text_mismatches,
       count(*) FILTER (WHERE idem_canonical_json_text_sha256(doc) IS DISTINCT FROM
                              idem_canonical_json_sha256(doc::jsonb)) AS sha_mismatches,
       count(*) FILTER (WHERE idem_canonical_json_text(doc::json::text) IS DISTINCT FROM
                              idem_canonical_json(doc::json::jsonb)) AS json_mismatches
FROM xdocs;
-- what differs, if anything
SELECT i, doc, idem_canonical_json_text(doc) AS text_path, idem_canonical_json(doc::jsonb) AS jsonb_path
FROM xdocs
WHERE idem_canonical_json_text(doc) IS DISTINCT FROM idem_canonical_json(doc::jsonb)
ORDER BY i LIMIT 3;

-- with exclusions
CREATE TEMP TABLE xptrs AS
SELECT * FROM (VALUES (1, '{/a}'::text[]), (2, '{/*/a,/b}'), (3, '{/0,/1/*}'),
                      (4, '{/*/*}'), (5, '{/é,/😀,/a~1b,/m~0n}'), (6, '{/,/a/0/b,/nope}'),
                      (7, '{/*}'), (8, ARRAY['/k"q', '/a\nb']), (9, ARRAY[E'/a\nb', '/10', '/1']),
                      (10, '{/7/y,/14/x/0,/21}')) AS t(p, ptrs);
SELECT count(*) AS cases,
       count(*) FILTER (WHERE idem_canonical_json_text(doc, ptrs) IS DISTINCT FROM
                              idem_canonical_json(doc::jsonb, ptrs)) AS text_mismatches,
       count(*) FILTER (WHERE idem_canonical_json_text_sha256(doc, ptrs) IS DISTINCT FROM
                              idem_canonical_json_sha256(doc::jsonb, ptrs)) AS sha_mismatches,
       count(*) FILTER (WHERE idem_canonical_json_text(doc, ptrs) IS DISTINCT FROM
                              idem_canonical_json_text(doc)) AS changed_by_exclusion
FROM xdocs, xptrs WHERE i % 3 = p % 3;
SELECT i, p, doc, idem_canonical_json_text(doc, ptrs) AS text_path,
       idem_canonical_json(doc::jsonb, ptrs) AS jsonb_path
FROM xdocs, xptrs
WHERE i % 3 = p % 3 AND idem_canonical_json_text(doc, ptrs) IS DISTINCT FROM
                        idem_canonical_json(doc::jsonb, ptrs)
ORDER BY i, p LIMIT 3;

-- what is left to the jsonb path: the same results and errors as before
SELECT left(d, 24) AS d, pg_temp.err(format('SELECT idempotency.idem_canonical_json_text(%L)', d)) AS result
FROM unnest(ARRAY[
    '{"a": 1, "b": {"c": 2, "c": 3}}', '{"é": 1, "\u00e9": 2}', '[{"\ud83d\ude00": 1, "😀": 2}]',
    '{"a": 1,}', '[1,]', '[01]', '[1.]', '[.5]', '[+1]', '[1e]', '[1e+]', '[-]', '[1.5e3.2]',
    '[tru]', '[nul]', '[truex]', '[1true]', '{"a" 1}', '{a: 1}', '[''a'']', '[1] x', '', '  ',
    '[1', '{"a": 1', '"abc', E'"a\tb"', E'"a\nb"', '"\x"', '"\u12"', '"\u12G4"', '"\ud800"',
    '"\udc00"', '"\ud800\u0041"', '"\ud800x"', '"\u0000"', '{"\u0000": 1}',
    '[1e400]', '[-1e309]', '[1e-400]', '[2e-324]', '[1e1000]', '[0e1000]', '[0e99999999999]',
    '[1e99999999999]', '[0.' || repeat('0', 20000) || '1]', '{"a": [1, 2], "a": 3}']) AS d;
SELECT d, pg_temp.err(format('SELECT idempotency.idem_canonical_json_text(%L, %L)', d, p)) AS result
FROM (VALUES ('{"a": {"x": 1, "x": 2}, "b": 1}', '{/a}'),
             ('{"a": [1e400], "b": 1}', '{/a}'),
             ('{"a": [0e99999999999], "b": 1}', '{/a}'),
             ('{"a": 1', '{nope}'),
             ('{"a": 1}', '{nope}'),
             ('{"a": 1}', '{/a~2}'),
             ('{"a": 1', '{/a,NULL}'),
             ('{"a": 1}', '{/a,NULL}')) AS t(d, p);
-- a text with two faults raises the error the jsonb path raises, that of
-- the first fault in the text, whatever their kinds; a repeated name is
-- refused once the rest has been read as JSON
SELECT d, pg_temp.err(format('SELECT idempotency.idem_canonical_json_text(%L)', d)) AS text_path,
       pg_temp.err(format('SELECT idempotency.idem_canonical_json(%L::jsonb)', d)) AS jsonb_path
FROM unnest(ARRAY['[1e-999999999, "\u0000"]', '[1e999999999, "\ud800"]',
                  '{"a": 1, "a": 2} x', '[{"a": 1, "a": 2}, "\u0000"]',
                  '[{"a": 1, "a": 2}, 1e400]']) AS d;
-- numbers the fast path leaves to numeric: the same as through jsonb
SELECT idem_canonical_json_text('[0e999, 0.' || repeat('0', 100) || ', 1' || repeat('0', 70) || ', 1e-323]') AS long_numbers,
       idem_canonical_json_text('[0e999, 0.' || repeat('0', 100) || ', 1' || repeat('0', 70) || ', 1e-323]') =
       idem_canonical_json(('[0e999, 0.' || repeat('0', 100) || ', 1' || repeat('0', 70) || ', 1e-323]')::jsonb) AS same;
-- nesting: the fast path's depth bound, and beyond it
SELECT idem_canonical_json_text(repeat('[', 64) || repeat(']', 64)) = idem_canonical_json((repeat('[', 64) || repeat(']', 64))::jsonb) AS depth_64,
       idem_canonical_json_text(repeat('{"a":', 65) || '1' || repeat('}', 65)) = idem_canonical_json((repeat('{"a":', 65) || '1' || repeat('}', 65))::jsonb) AS depth_65,
       idem_canonical_json_text(repeat('{"b": 1, "a":', 500) || '[]' || repeat('}', 500)) = idem_canonical_json((repeat('{"b": 1, "a":', 500) || '[]' || repeat('}', 500))::jsonb) AS depth_500;
-- the big body as text: more than the fast path's 4 MB, and less
SELECT idem_canonical_json_text_sha256(body::text) = idem_canonical_json_sha256(body) AS big_text_sha,
       idem_canonical_json_text(body::text, '{/items/*/name}') = idem_canonical_json(body, '{/items/*/name}') AS big_text_excluded,
       idem_canonical_json_text(jsonb_path_query_array(body, '$.items[0 to 9999]')::text) =
       idem_canonical_json(jsonb_path_query_array(body, '$.items[0 to 9999]')) AS medium_text
FROM big;
