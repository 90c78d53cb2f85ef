-- idempotency 0.3.0 to 0.4.0
--
-- Kept as it is once released; the install script of 0.4.0 is assembled
-- from sql/parts.  Every change of the schema between the two versions is
-- made here too, so that an updated database equals a fresh install (the
-- regression test "upgrade" compares them).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- idempotency.endpoints.resolver: text, not regprocedure.  pg_upgrade
-- refuses a database with a reg* column that names functions (their OIDs are
-- not kept); the resolver is now stored by its canonical name, checked and
-- normalized by the trigger endpoints_resolver, and found again at each
-- call.  The names are written with the search_path pg_catalog alone, so
-- that every one is schema-qualified as the trigger writes them; a resolver
-- whose function was dropped becomes its former OID in digits, which names
-- no function (a call reports it, as it did before).
DO $resolver_text$
DECLARE
    saved text := pg_catalog.current_setting('search_path');
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
    ALTER TABLE idempotency.endpoints
        ALTER COLUMN resolver TYPE text USING resolver::text;
    PERFORM pg_catalog.set_config('search_path', saved, true);
END
$resolver_text$;
