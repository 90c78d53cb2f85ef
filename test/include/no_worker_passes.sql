-- skip where the maintenance worker may run a pass during the test
SELECT coalesce(current_setting('idempotency.enable_worker', true) = 'on'
                AND current_setting('idempotency.maintenance_interval', true)::interval < '1 hour',
                false) AS worker_passes_likely \gset
\if :worker_passes_likely
\echo 'skipped: this server''s maintenance worker runs passes more often than once an hour, and one would change what this test sees'
\endif
