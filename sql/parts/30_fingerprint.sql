-- idempotency install script: request fingerprints.
--
-- RFC 8785 (JSON Canonicalization Scheme) serialization of request bodies,
-- its SHA-256, and the request fingerprint over method, path and body.
--
-- Each function exists with and without its trailing exclusion list rather
-- than with "exclude text[] DEFAULT '{}'": resolving an argument default
-- costs the parser and the planner, on every simple-protocol query, about as
-- much as canonicalizing and hashing a 300-byte body.  Both forms run the
-- same C function; without the list nothing is excluded.

CREATE FUNCTION idempotency.idem_canonical_json(body jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json(body jsonb, exclude text[])
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json(jsonb) IS
'RFC 8785 canonical form of a jsonb value';
COMMENT ON FUNCTION idempotency.idem_canonical_json(jsonb, text[]) IS
'RFC 8785 canonical form of a jsonb value, without the members named by the JSON Pointers in exclude';

CREATE FUNCTION idempotency.idem_canonical_json_sha256(body jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json_sha256(body jsonb, exclude text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json_sha256(jsonb) IS
'SHA-256 of the UTF-8 bytes of idem_canonical_json(body)';
COMMENT ON FUNCTION idempotency.idem_canonical_json_sha256(jsonb, text[]) IS
'SHA-256 of the UTF-8 bytes of idem_canonical_json(body, exclude)';

-- Raw JSON text has its own names, so that an untyped literal never has to
-- choose between text and jsonb: it rejects duplicate member names.
CREATE FUNCTION idempotency.idem_canonical_json_text(body text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json_text'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json_text(body text, exclude text[])
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json_text'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json_text(text) IS
'RFC 8785 canonical form of raw JSON text; duplicate member names are an error (22030)';
COMMENT ON FUNCTION idempotency.idem_canonical_json_text(text, text[]) IS
'RFC 8785 canonical form of raw JSON text without the members named in exclude; duplicate member names are an error (22030)';

CREATE FUNCTION idempotency.idem_canonical_json_text_sha256(body text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_text_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
CREATE FUNCTION idempotency.idem_canonical_json_text_sha256(body text, exclude text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_canonical_json_text_sha256'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_canonical_json_text_sha256(text) IS
'SHA-256 of idem_canonical_json_text(body)';
COMMENT ON FUNCTION idempotency.idem_canonical_json_text_sha256(text, text[]) IS
'SHA-256 of idem_canonical_json_text(body, exclude)';

-- Not strict: a NULL body is a request without a body, a NULL exclusion
-- list excludes nothing; a NULL method or path is an error.
CREATE FUNCTION idempotency.idem_fingerprint(method text, path text, body jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION idempotency.idem_fingerprint(method text, path text, body jsonb, exclude text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.idem_fingerprint(text, text, jsonb) IS
'SHA-256 over "idem-fingerprint-v1", the upper-cased method, the path and the canonical body (see doc/fingerprints.md)';
COMMENT ON FUNCTION idempotency.idem_fingerprint(text, text, jsonb, text[]) IS
'SHA-256 over "idem-fingerprint-v1", the upper-cased method, the path and the canonical body without the members named in exclude (see doc/fingerprints.md)';

CREATE FUNCTION idempotency.idem_number_text(value float8)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_number_text'
LANGUAGE C IMMUTABLE PARALLEL SAFE STRICT;
COMMENT ON FUNCTION idempotency.idem_number_text(float8) IS
'ECMAScript (RFC 8785) serialization of a double, as used for JSON numbers in canonical form';
