--
-- Fingerprints in a database whose encoding is not UTF-8: names and strings
-- are sorted and hashed as UTF-8, text results come back in LATIN1.
--
CREATE DATABASE fp_latin1 ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C';
\c fp_latin1
SET client_encoding = 'UTF8';
SET client_min_messages = warning;
CREATE EXTENSION idempotency CASCADE;
RESET client_min_messages;
SET search_path = idempotency, public;

-- U+00E9 sorts after "z" (code unit 0xE9 > 0x7A) whatever the encoding
SELECT idem_canonical_json('{"é": "ü", "z": 1, "a\n": "x"}');
SELECT idem_canonical_json_text('{"é": "ü", "z": 1}');
-- the hash is over the UTF-8 bytes, as in a UTF-8 database
SELECT idem_canonical_json_sha256('{"é": "ü", "z": 1}') =
       sha256('\x7b227a223a312c22c3a9223a22c3bc227d'::bytea) AS utf8_hash;
SELECT idem_fingerprint('POST', '/é', '{"a": 1}') =
       sha256('\x6964656d2d66696e6765727072696e742d76310a504f53540a2fc3a90a7b2261223a317d'::bytea) AS utf8_fingerprint;

\c contrib_regression
DROP DATABASE fp_latin1;
