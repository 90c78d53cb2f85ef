-- idempotency install script: counters in shared memory.

CREATE FUNCTION idempotency.idem_stats_reset()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE STRICT;
