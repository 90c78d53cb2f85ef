-- Replay path, extension: a claim of a completed key returns the stored
-- response.  @FP@ as in ext_execute.sql.
\set r random(1, :nreplay)
SELECT action, response_status, response_headers, response_json FROM idempotency.idem_claim('acme', 'POST /payments', 'r' || :r, @FP@);
