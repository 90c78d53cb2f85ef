--
-- RFC 8785 conformance: the test data of the RFC's author (test/data/rfc8785,
-- see test/data/README.md) through the raw-text and the jsonb paths.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
SET search_path = idempotency, public;
\getenv abs_srcdir PG_ABS_SRCDIR
\set dir :abs_srcdir '/data/rfc8785'

CREATE TEMP TABLE rfc8785 AS
SELECT name,
       pg_read_file(:'dir' || '/input/' || name || '.json') AS input,
       pg_read_file(:'dir' || '/output/' || name || '.json') AS output,
       regexp_replace(pg_read_file(:'dir' || '/outhex/' || name || '.txt'), '\s', '', 'g') AS outhex
FROM unnest(ARRAY['arrays', 'french', 'structures', 'unicode', 'values', 'weird']) AS name;

-- every case, three ways: raw text, jsonb, and the expected bytes in hex
SELECT name,
       idem_canonical_json_text(input) = output AS text_ok,
       idem_canonical_json(input::jsonb) = output AS jsonb_ok,
       encode(convert_to(idem_canonical_json_text(input), 'UTF8'), 'hex') = outhex AS bytes_ok,
       idem_canonical_json_text_sha256(input) = sha256(decode(outhex, 'hex')) AS sha_ok
FROM rfc8785 ORDER BY name;

-- and what they look like
SELECT name, idem_canonical_json_text(input) AS canonical FROM rfc8785 ORDER BY name;
