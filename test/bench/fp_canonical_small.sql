-- RFC 8785 canonical SHA-256 of the small body (compare with fp_builtin_small.sql)
SELECT idempotency.idem_canonical_json_sha256(body) FROM bench_bodies WHERE name = 'small';
