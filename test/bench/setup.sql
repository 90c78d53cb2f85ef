-- test/bench/setup.sql: tables shared by every benchmark script, run by
-- scripts/bench.sh in each benchmark database (as superuser).
--
-- payments is the business table: every script that executes a request
-- writes the same one row into it.  floor_keys is the "floor": an
-- unpartitioned key table with a unique index that the floor script writes
-- one row into, with no check at all.  replay_plain holds stored responses
-- for the plain primary-key lookup that the replay path is compared with.

SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;

CREATE TABLE payments (
    id              bigint PRIMARY KEY,
    tenant          text NOT NULL,
    amount          numeric(12, 2) NOT NULL,
    currency        text NOT NULL,
    idempotency_key text NOT NULL
);

CREATE TABLE floor_keys (
    tenant          text NOT NULL,
    endpoint        text NOT NULL,
    key             text NOT NULL,
    fingerprint     bytea NOT NULL,
    response_status integer,
    response_body   jsonb,
    expires_at      timestamptz NOT NULL
);
CREATE UNIQUE INDEX floor_keys_scope_idx ON floor_keys (tenant, endpoint, key);

CREATE TABLE replay_plain (
    tenant          text NOT NULL,
    endpoint        text NOT NULL,
    key             text NOT NULL,
    response_status integer NOT NULL,
    response_headers jsonb,
    response_body   jsonb,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (tenant, endpoint, key)
);

-- one row per claim of the contention scenario, to count the actions
CREATE UNLOGGED TABLE bench_actions (
    action  text NOT NULL,
    key     text NOT NULL
);

-- An endpoint that keeps no tombstones of expired keys, for
-- ext_execute_no_tombstones.sql (builds without tombstones have no such
-- column: the endpoint then behaves as any other).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'idempotency.endpoints'::regclass
               AND attname = 'tombstone_ttl') THEN
        INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl)
        VALUES ('POST /payments-nt', '0');
    END IF;
END $$;
