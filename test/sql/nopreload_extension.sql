--
-- Without shared_preload_libraries the extension installs and works, and
-- what needs shared memory says clearly what is missing.
--
\set VERBOSITY default
SHOW shared_preload_libraries;
CREATE EXTENSION idempotency CASCADE;
SELECT extname FROM pg_extension WHERE extname IN ('idempotency', 'pgcrypto') ORDER BY 1;

-- shared memory features refuse with a hint that names the setting
SELECT idempotency.idem_stats_reset();

DROP EXTENSION idempotency;
SELECT count(*) AS schemas_left FROM pg_namespace WHERE nspname = 'idempotency';
