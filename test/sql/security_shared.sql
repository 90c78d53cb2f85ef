--
-- Security of what the extension keeps where every role can look (issue 35,
-- items 4 and 6):
-- * idempotency.encryption_key is refused as a database's, a role's or a
--   function's setting (stored in catalogs every role reads), for the
--   lowest role that could try (one holding idempotency_admin, and TEMP)
--   and for a superuser;
-- * the lock tag of a claim in pg_locks is not the unkeyed hash of its
--   scope that any role could compute from a guess (before 0.4.0:
--   hash_bytes_extended of the framed tenant, endpoint and key).
-- The bound of diagnoses and the counters across databases, and the
-- server log, are in test/t/091_security_shared.pl.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;

\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/include/helpers.sql

-- the library is loaded in this session (the check of the setting is its)
SELECT idempotency.idem_key_hash('t', 'e', 'k') IS NOT NULL AS loaded;

SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_sec_admin;
RESET client_min_messages;
CREATE ROLE regress_sec_admin;
GRANT idempotency_admin TO regress_sec_admin;

-- the lowest role: refused (it may not set a superuser's setting anyway)
SET ROLE regress_sec_admin;
SELECT left(regress.try(format('ALTER DATABASE %I SET idempotency.encryption_key = %L',
                               current_database(), 'k3y-admin')), 5) AS admin_database;
SELECT regress.try($$ALTER ROLE regress_sec_admin SET idempotency.encryption_key = 'k3y-admin'$$,
                   'detail') AS admin_role;
SELECT regress.try($$CREATE FUNCTION pg_temp.keyed() RETURNS int LANGUAGE sql
                     SET idempotency.encryption_key = 'k3y-admin' AS 'SELECT 1'$$,
                   'detail') AS admin_function;
RESET ROLE;

-- a superuser: refused too, with an error that quotes neither the value
-- nor the statement
SELECT regress.try(format('ALTER DATABASE %I SET idempotency.encryption_key = %L',
                          current_database(), 'k3y-super'), 'verbose') AS super_database;
SELECT regress.try($$ALTER ROLE regress_sec_admin SET idempotency.encryption_key = 'k3y-super'$$,
                   'verbose') AS super_role;
SELECT regress.try(format('ALTER ROLE regress_sec_admin IN DATABASE %I SET idempotency.encryption_key = %L',
                          current_database(), 'k3y-super')) AS super_role_in_database;
SELECT regress.try($$ALTER ROLE ALL SET idempotency.encryption_key = 'k3y-super'$$) AS super_all_roles;
SELECT regress.try($$CREATE FUNCTION pg_temp.keyed() RETURNS int LANGUAGE sql
                     SET idempotency.encryption_key = 'k3y-super' AS 'SELECT 1'$$) AS super_function;
CREATE FUNCTION pg_temp.unkeyed() RETURNS int LANGUAGE sql AS 'SELECT 1';
SELECT regress.try($$ALTER FUNCTION pg_temp.unkeyed() SET idempotency.encryption_key = 'k3y-super'$$)
       AS super_alter_function;
SET idempotency.encryption_key = 'k3y-session';
SELECT regress.try($$CREATE FUNCTION pg_temp.keyed() RETURNS int LANGUAGE sql
                     SET idempotency.encryption_key FROM CURRENT AS 'SELECT 1'$$) AS super_from_current;
RESET idempotency.encryption_key;

-- nothing of it stored where every role reads
SELECT count(*) AS stored_settings FROM pg_db_role_setting
WHERE array_to_string(setconfig, ' ') ILIKE '%encryption_key%';
SELECT count(*) AS stored_function_settings FROM pg_proc
WHERE array_to_string(proconfig, ' ') ILIKE '%encryption_key%';

-- the documented ways still work: SET in a superuser's session (and
-- postgresql.conf / ALTER SYSTEM, test/t/050_encryption_at_rest.pl)
SET idempotency.encryption_key = 'k3y-session';
SHOW idempotency.encryption_key;
RESET idempotency.encryption_key;

-- a claim's lock tag: the formula of 0.3.0, which any role could compute
CREATE FUNCTION pg_temp.unkeyed_tag(t text, e text, k text, OUT hi bigint, OUT lo bigint)
LANGUAGE sql AS $$
    WITH h1 AS (SELECT hashtextextended(t COLLATE "C",
                           hashint4extended(octet_length(t), 0)) AS h),
         h2 AS (SELECT hashtextextended(e COLLATE "C",
                           hashint4extended(octet_length(e), h)) AS h FROM h1),
         h3 AS (SELECT hashtextextended(k COLLATE "C",
                           hashint4extended(octet_length(k), h)) AS h FROM h2)
    SELECT (h >> 32) & 4294967295, h & 4294967295 FROM h3
$$;
BEGIN;
SELECT action FROM idempotency.idem_claim('tenant-b', 'POST /orders', 'order-1042', regress.fp('a'));
-- the claim holds its scope lock
SELECT count(*) AS scope_locks FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid()
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database());
-- and no tag computed from the right guess among 1,000 matches it
SELECT count(*) AS guessed FROM pg_locks l,
       generate_series(1001, 2000) g,
       LATERAL pg_temp.unkeyed_tag('tenant-b', 'POST /orders', 'order-' || g) o
WHERE l.locktype = 'advisory' AND l.objsubid = 18756
  AND l.classid::bigint = o.hi AND l.objid::bigint = o.lo;
ROLLBACK;

DROP ROLE regress_sec_admin;
