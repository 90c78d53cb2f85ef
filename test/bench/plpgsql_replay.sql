-- Replay path, PL/pgSQL reference: a claim of a completed key.
\set r random(1, :nreplay)
SELECT action, response_status, response_body FROM ref.idem_claim('acme', 'POST /payments', 'r' || :r, :body::jsonb);
