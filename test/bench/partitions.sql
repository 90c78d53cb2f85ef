-- test/bench/partitions.sql: dated partitions of idempotency.keys for the
-- benchmark databases, used only while the build has no maintenance pass
-- (idempotency.idem_maintenance); bench.sh prefers that when it exists.
-- Makes :nparts daily partitions from today on, each a standalone table
-- with UNIQUE (tenant, endpoint, key), attached FOR VALUES FROM .. TO ...
SELECT set_config('bench.nparts', :'nparts', false);
DO $$
DECLARE
    d0  date := current_date;
    i   int;
    nm  text;
BEGIN
    FOR i IN 0 .. current_setting('bench.nparts')::int - 1 LOOP
        nm := format('keys_bench_%s', to_char(d0 + i, 'YYYYMMDD'));
        EXECUTE format('CREATE TABLE idempotency.%I (LIKE idempotency.keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS, UNIQUE (tenant, endpoint, key))', nm);
        EXECUTE format('ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.%I FOR VALUES FROM (%L) TO (%L)',
                       nm, (d0 + i)::timestamptz, (d0 + i + 1)::timestamptz);
    END LOOP;
END;
$$;
