-- test/bench/replay_setup.sql: :nreplay completed keys 'r1' .. 'rN' for the
-- replay scripts, each stored three ways: through the extension's own
-- claim and finish (one transaction per key, as an application would do),
-- through the PL/pgSQL reference, and as plain rows of replay_plain.
-- bench.sh sets bench.body, bench.resp and bench.fp (the fingerprint the
-- replay scripts send) first.
SELECT set_config('bench.nreplay', :'nreplay', false);
DO $$
DECLARE
    body jsonb := current_setting('bench.body')::jsonb;
    resp jsonb := current_setting('bench.resp')::jsonb;
    fp   bytea := current_setting('bench.fp')::bytea;
    i    int;
BEGIN
    FOR i IN 1 .. current_setting('bench.nreplay')::int LOOP
        PERFORM idempotency.idem_claim('acme', 'POST /payments', 'r' || i, fp);
        PERFORM idempotency.idem_finish('acme', 'POST /payments', 'r' || i, 201, resp);
        PERFORM ref.idem_claim('acme', 'POST /payments', 'r' || i, body);
        PERFORM ref.idem_finish('acme', 'POST /payments', 'r' || i, 201, resp);
        COMMIT;
    END LOOP;
END;
$$;
INSERT INTO replay_plain (tenant, endpoint, key, response_status, response_body, expires_at)
SELECT 'acme', 'POST /payments', 'r' || i, 201, current_setting('bench.resp')::jsonb, now() + interval '24 hours'
  FROM generate_series(1, current_setting('bench.nreplay')::int) i;
VACUUM ANALYZE;
