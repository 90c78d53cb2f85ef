-- the helpers the pg_regress tests share, in the schema regress
\set ECHO none
-- What this file defines is not echoed (pg_regress runs psql with -a, which
-- the last line restores): a test's expected output shows only the line that
-- includes it, so a helper added here changes no test's output.  A test
-- includes it with
--     \getenv abs_srcdir PG_ABS_SRCDIR
--     \i :abs_srcdir/include/helpers.sql
-- and calls the helpers schema-qualified.  The schema outlives the session
-- (a test that reconnects as another role still finds them) and is made
-- once per database: including the file again is harmless, and prints
-- nothing.  Every role may call them.
DO $$
BEGIN
    CREATE SCHEMA regress;
EXCEPTION WHEN duplicate_schema THEN
    NULL;
END $$;
GRANT USAGE ON SCHEMA regress TO PUBLIC;

-- a fingerprint for the tests: any 32 bytes will do
CREATE OR REPLACE FUNCTION regress.fp(s text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT sha256(convert_to(s, 'UTF8')) $$;

-- run a statement; show "ok", or its error: the SQLSTATE and the message
-- (verbosity terse), and the detail (detail), and the hint (verbose).  With
-- verbose, a SELECT shows the first column of its first row too ("ok: x").
CREATE OR REPLACE FUNCTION regress.try(stmt text, verbosity text DEFAULT 'terse')
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text; hnt text; res text;
BEGIN
    IF verbosity IS NULL OR verbosity NOT IN ('terse', 'detail', 'verbose') THEN
        RAISE EXCEPTION 'regress.try: verbosity must be terse, detail or verbose, not %',
            coalesce(verbosity, 'NULL');
    END IF;
    BEGIN
        IF verbosity = 'verbose' AND stmt ~* '^\s*select' THEN
            EXECUTE stmt INTO res;
        ELSE
            EXECUTE stmt;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                                det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
        IF verbosity = 'terse' THEN
            det := NULL;
        END IF;
        IF verbosity <> 'verbose' THEN
            hnt := NULL;
        END IF;
        RETURN st || ': ' || msg || coalesce(' / ' || nullif(det, ''), '')
               || coalesce(' / ' || nullif(hnt, ''), '');
    END;
    RETURN 'ok' || coalesce(': ' || res, '');
END $$;

GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA regress TO PUBLIC;
\set ECHO all
