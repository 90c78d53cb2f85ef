-- RFC 8785 canonical SHA-256 of the small body given as raw JSON text, which
-- takes the fast text path (compare with fp_canonical_small.sql, and with
-- fp_builtin_small.sql, which pays for the same body::text)
SELECT idempotency.idem_canonical_json_text_sha256(body::text) FROM bench_bodies WHERE name = 'small';
