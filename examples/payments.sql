-- examples/payments.sql: the story of a payment API made safe to retry,
-- step by step.  "make run" runs it in database demo.
\pset footer off
\echo
\echo '1. The extension lives in schema idempotency.'
SELECT extname, extversion FROM pg_extension WHERE extname = 'idempotency';
