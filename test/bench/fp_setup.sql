-- Bodies for the fingerprint benchmarks (fp_*.sql): a realistic payment
-- request of about 300 bytes, and an order of about 64 KB with many numbers
-- (integers, prices, rates, and one full-precision double per line).
-- Assumes the extension exists.
DROP TABLE IF EXISTS bench_bodies;
CREATE TABLE bench_bodies (name text PRIMARY KEY, body jsonb NOT NULL);

INSERT INTO bench_bodies VALUES ('small', '{
  "amount": 12500,
  "currency": "EUR",
  "customer": "cus_8f3a2b1c9d",
  "description": "Order #48213, 2 items",
  "capture": true,
  "payment_method": {"type": "card", "card": {"last4": "4242", "exp_month": 12, "exp_year": 2028}},
  "metadata": {"order_id": "48213", "channel": "web", "trace_id": "7f9c2e4a51b34d0e"},
  "client_ts": "2026-11-30T10:00:00.123Z"
}');

INSERT INTO bench_bodies
SELECT 'large', jsonb_build_object(
    'order_id', 'ord_20261130_000042',
    'currency', 'EUR',
    'created', '2026-11-30T10:00:00Z',
    'lines', jsonb_agg(jsonb_build_object(
        'line', i,
        'sku', 'SKU-' || lpad((i * 7919 % 100000)::text, 6, '0'),
        'qty', i % 7 + 1,
        'unit_price', round((i * 37 % 10000) / 100.0, 2),
        'tax_rate', CASE WHEN i % 3 = 0 THEN 0.055 ELSE 0.2 END,
        'discount', round((i % 13) * 0.25, 2),
        'weight_kg', round((i * 13 % 5000) / 1000.0, 3),
        'score', sin(i)::float8) ORDER BY i),
    'total', sum(round((i * 37 % 10000) / 100.0, 2) * (i % 7 + 1)))
FROM generate_series(1, 480) AS i;
