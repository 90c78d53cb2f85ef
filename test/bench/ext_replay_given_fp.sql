-- Replay path, extension, with the fingerprint sent by the application
-- (computed where the request arrives) instead of computed in the
-- statement: the claim alone against the plain lookup.
\set r random(1, :nreplay)
SELECT action, response_status, response_headers, response_json FROM idempotency.idem_claim('acme', 'POST /payments', 'r' || :r, :fp::bytea);
