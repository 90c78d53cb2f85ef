--
-- The extension's own SHA-256 (src/sha256.c), which idem_tombstone_hash,
-- idem_key_hash and idem_downstream_key go through: the NIST examples
-- (FIPS 180-2, appendix B), the same digest as PostgreSQL's sha256() for
-- every length around the block boundaries, and the three hashes the same
-- as the SQL computation of their framed input (as 0.3.0 computed them:
-- the scope_hash of the tombstones it stored must stay the same), with
-- idempotency.encryption_key unset and set to keys of several lengths (the
-- key is absorbed once per backend and value).
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
-- the library's test entry points (no SQL object of the extension names
-- them): the compression the CPU allows (its SHA extensions where it has
-- them), and the portable one whatever the CPU has
CREATE FUNCTION pg_temp.own_sha256(bytea) RETURNS bytea
    AS '$libdir/idempotency', 'idem_sha256_test' LANGUAGE C STRICT;
CREATE FUNCTION pg_temp.own_sha256_portable(bytea) RETURNS bytea
    AS '$libdir/idempotency', 'idem_sha256_test_portable' LANGUAGE C STRICT;

-- NIST: "abc", "", the two-block messages of 56 and 112 bytes, a million "a"
CREATE TEMP TABLE nist (i integer, m text);
INSERT INTO nist VALUES (1, 'abc'),
             (2, ''),
             (3, 'abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq'),
             (4, 'abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu'),
             (5, repeat('a', 1000000));
SELECT encode(pg_temp.own_sha256(convert_to(m, 'UTF8')), 'hex') AS digest
FROM nist ORDER BY i;
SELECT encode(pg_temp.own_sha256_portable(convert_to(m, 'UTF8')), 'hex') AS portable_digest
FROM nist ORDER BY i;

-- every length from 0 to 1,312 bytes of varied bytes
WITH blob AS (
    SELECT string_agg(sha256(int4send(j)), ''::bytea ORDER BY j) AS b
    FROM generate_series(0, 40) AS j)
SELECT count(*) AS lengths,
       count(*) FILTER (WHERE pg_temp.own_sha256(substring(b FROM 1 FOR n))
                              IS DISTINCT FROM sha256(substring(b FROM 1 FOR n))) AS differ,
       count(*) FILTER (WHERE pg_temp.own_sha256_portable(substring(b FROM 1 FOR n))
                              IS DISTINCT FROM sha256(substring(b FROM 1 FOR n))) AS portable_differ
FROM blob, generate_series(0, 1312) AS n;

-- the framed input, in SQL: each part preceded by its length (4 bytes,
-- big-endian)
CREATE FUNCTION pg_temp.framed(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$SELECT int4send(octet_length(convert_to(t, 'UTF8'))) || convert_to(t, 'UTF8')$$;
CREATE FUNCTION pg_temp.tomb_sql(ekey text, t text, e text, k text) RETURNS bytea
    LANGUAGE sql IMMUTABLE
    AS $$SELECT substring(sha256(convert_to('idempotency tombstone', 'UTF8') ||
                                 pg_temp.framed(ekey) || pg_temp.framed(t) ||
                                 pg_temp.framed(e) || pg_temp.framed(k))
                          FROM 1 FOR 16)$$;
CREATE TEMP TABLE scopes AS
    SELECT i,
           left(repeat('tenant-' || i, 1 + i % 9), 1 + (i * 7) % 60) AS t,
           CASE WHEN i % 5 = 0 THEN 'POST /€/' || i ELSE 'POST /pay' END AS e,
           left(md5(i::text) || md5((i + 1)::text) || md5((i + 2)::text), 1 + (i * 13) % 96) AS k
    FROM generate_series(1, 400) AS i;
CREATE TEMP TABLE results (ekey text, scopes int, differ int);
CREATE FUNCTION pg_temp.compare(ekey text) RETURNS void LANGUAGE sql
    AS $$INSERT INTO results
         SELECT ekey, count(*),
                count(*) FILTER (WHERE idempotency.idem_tombstone_hash(t, e, k)
                                       IS DISTINCT FROM pg_temp.tomb_sql(ekey, t, e, k))
         FROM scopes$$;

SELECT pg_temp.compare('');
SET idempotency.encryption_key = 'k';
SELECT pg_temp.compare('k');
SET idempotency.encryption_key = 'a key of thirty-nine bytes, 0123456789!';
SELECT pg_temp.compare('a key of thirty-nine bytes, 0123456789!');
SET idempotency.encryption_key = 'a key that makes the prefix one block long';
SELECT pg_temp.compare('a key that makes the prefix one block long');
SET idempotency.encryption_key = 'a key of a hundred bytes and more, so that the label and the key fill more than one whole block.';
SELECT pg_temp.compare('a key of a hundred bytes and more, so that the label and the key fill more than one whole block.');
-- and back: the state absorbed for a key is not kept for the next one
RESET idempotency.encryption_key;
SELECT pg_temp.compare('');
SELECT length(ekey) AS key_bytes, 25 + length(ekey) AS prefix_bytes, scopes, differ
FROM results ORDER BY ctid;

-- idem_key_hash and idem_downstream_key: unkeyed, framed alike
SELECT count(*) AS scopes,
       count(*) FILTER (WHERE idempotency.idem_key_hash(t, e, k) IS DISTINCT FROM
                        encode(substring(sha256(pg_temp.framed(t) || pg_temp.framed(e) ||
                                                pg_temp.framed(k)) FROM 1 FOR 8), 'hex')) AS key_hash_differ,
       count(*) FILTER (WHERE idempotency.idem_downstream_key(t, e, k, 'step ' || i) IS DISTINCT FROM
                        rtrim(translate(encode(sha256(convert_to('idempotency downstream key v1', 'UTF8') ||
                                                      pg_temp.framed(t) || pg_temp.framed(e) ||
                                                      pg_temp.framed(k) || pg_temp.framed('step ' || i)),
                                               'base64'), E'+/\n', '-_'), '=')) AS downstream_differ
FROM scopes;
