-- Replay path, baseline: a plain primary-key lookup of a stored response row.
\set r random(1, :nreplay)
SELECT response_status, response_headers, response_body FROM replay_plain WHERE tenant = 'acme' AND endpoint = 'POST /payments' AND key = 'r' || :r;
