-- The database set-up of the HTTP examples (examples/express,
-- examples/fastapi): the extension, a login role for the application with
-- the extension's client role, a time limit on transactions left idle (a
-- frozen instance must not hold its claims for ever), and the business
-- tables the examples write to.  Run as a superuser in the application's
-- database; running it again changes nothing.

CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'shop_api') THEN
        CREATE ROLE shop_api LOGIN;
    END IF;
END
$$;
GRANT idempotency_client TO shop_api;
ALTER ROLE shop_api SET idle_in_transaction_session_timeout = '30s';

CREATE TABLE IF NOT EXISTS shop_charges (
    id text PRIMARY KEY DEFAULT 'ch_' || md5(random()::text),
    amount bigint NOT NULL CHECK (amount > 0),
    currency text NOT NULL,
    created timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shop_receipts (
    charge_id text PRIMARY KEY,
    sent timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON shop_charges, shop_receipts TO shop_api;
