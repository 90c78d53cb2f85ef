--
-- The extension installs into schema idempotency, pulls in pgcrypto, and
-- DROP EXTENSION leaves nothing behind.
--
\set VERBOSITY terse

-- start from a database without the extension, whatever ran before
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idempotency CASCADE;
DROP EXTENSION IF EXISTS pgcrypto CASCADE;
RESET client_min_messages;

-- objects that exist before the extension
CREATE TEMP TABLE before_rels AS SELECT oid, relname FROM pg_class;
CREATE TEMP TABLE before_types AS SELECT oid, typname FROM pg_type;
CREATE TEMP TABLE before_procs AS SELECT oid, proname FROM pg_proc;
CREATE TEMP TABLE before_nsp AS SELECT oid, nspname FROM pg_namespace;

CREATE EXTENSION idempotency CASCADE;

-- (pgcrypto's version is the server's own)
SELECT extname, CASE extname WHEN 'idempotency' THEN extversion END AS extversion, extrelocatable
FROM pg_extension WHERE extname IN ('idempotency', 'pgcrypto') ORDER BY 1;

-- the schema is the extension's own
SELECT pg_describe_object(classid, objid, objsubid) AS member
FROM pg_depend
WHERE refclassid = 'pg_extension'::regclass
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND deptype = 'e' AND classid = 'pg_namespace'::regclass;

-- no member lives outside schema idempotency
SELECT count(*) AS members_outside_schema
FROM pg_depend d
JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND d.deptype = 'e' AND c.relnamespace <> 'idempotency'::regnamespace;

-- the storage is partitioned by expiry time
SELECT c.relname, p.partstrat, a.attname AS partition_column
FROM pg_partitioned_table p
JOIN pg_class c ON c.oid = p.partrelid
JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
WHERE c.relnamespace = 'idempotency'::regnamespace;

-- PUBLIC has no access to the storage
SELECT has_table_privilege('public', 'idempotency.keys', 'SELECT') AS public_can_read_keys,
       has_schema_privilege('public', 'idempotency', 'USAGE') AS public_has_schema_usage;

-- a second CREATE is refused, IF NOT EXISTS is a no-op
CREATE EXTENSION idempotency;
CREATE EXTENSION IF NOT EXISTS idempotency;

DROP EXTENSION idempotency;
DROP EXTENSION pgcrypto;

-- nothing is left behind
SELECT relname FROM pg_class WHERE oid NOT IN (SELECT oid FROM before_rels)
  AND relpersistence <> 't' AND relname NOT LIKE 'pg_toast%' AND relname NOT LIKE 'before_%';
SELECT typname FROM pg_type WHERE oid NOT IN (SELECT oid FROM before_types)
  AND typname NOT LIKE '%before_%' AND typnamespace <> pg_my_temp_schema();
SELECT proname FROM pg_proc WHERE oid NOT IN (SELECT oid FROM before_procs);
SELECT nspname FROM pg_namespace WHERE oid NOT IN (SELECT oid FROM before_nsp)
  AND nspname NOT LIKE 'pg_temp%' AND nspname NOT LIKE 'pg_toast_temp%';

-- and it installs again afterwards
CREATE EXTENSION idempotency CASCADE;
SELECT count(*) > 0 AS has_keys_table FROM pg_class
WHERE relname = 'keys' AND relnamespace = 'idempotency'::regnamespace;
