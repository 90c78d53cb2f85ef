-- idempotency install script: mismatch diagnostics (src/diag.c).
--
-- A claim may pass the digest of its request (idem_request_digest): keyed
-- hashes of the members of the canonical body, never their values.  It is
-- kept with the key (idempotency.keys.request_digest), and a later claim of
-- the key with another request says which members differ
-- (claim_result.mismatch).

-- The database's secret, 32 random bytes made here (gen_random_uuid uses
-- the server's strong random source: 244 random bits).  Readable by the
-- extension's owner only; not dumped by pg_dump, so that a restored
-- database makes a secret of its own (digests stored before then compare
-- with nothing).  Changing the row (as the owner) makes every backend read
-- it again.
CREATE TABLE idempotency.diagnostics_secret (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret  bytea NOT NULL CHECK (length(secret) = 32)
);
INSERT INTO idempotency.diagnostics_secret (secret)
SELECT pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::text
                                            || pg_catalog.gen_random_uuid()::text, '-', ''), 'hex');
REVOKE ALL ON idempotency.diagnostics_secret FROM PUBLIC;
CREATE TRIGGER diagnostics_secret_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.diagnostics_secret
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.idem_endpoints_changed();

CREATE FUNCTION idempotency.idem_request_digest(
    tenant text, endpoint text, key text, body jsonb,
    method text DEFAULT NULL, path text DEFAULT NULL, exclude text[] DEFAULT NULL)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_request_digest'
LANGUAGE C STABLE;
COMMENT ON FUNCTION idempotency.idem_request_digest(text, text, text, jsonb, text, text, text[]) IS
    'Digest of a request for idem_claim''s mismatch diagnostics: keyed hashes of its members, never their values';
