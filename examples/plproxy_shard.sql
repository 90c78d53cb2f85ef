-- examples/plproxy_shard.sql: the shard side of one API operation behind a
-- PL/Proxy proxy (README "Scaling out"), run in every shard database, which
-- has the idempotency extension.
--
-- A proxied call is a transaction of its own on its shard, so atomic mode
-- cannot span two proxied calls (a claim through the proxy commits before
-- any finish could).  The operation is therefore one shard-side function
-- that claims the key, does the business write and finishes the key in one
-- transaction; the proxy routes the whole function by tenant
-- (examples/plproxy_proxy.sql).  A duplicate that races it waits on the
-- claim or answers in_progress; a retry replays; an error anywhere rolls
-- back the claim with the business write.

CREATE SCHEMA app;

-- The business table.  No unique constraint on the key: exactly one row
-- per key is what the claim guarantees (and what the tests count).
CREATE TABLE app.payments (
    id              bigserial PRIMARY KEY,
    tenant          text NOT NULL,
    idempotency_key text NOT NULL,
    amount_cents    bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION app.create_payment(tenant text, key text, amount_cents bigint)
RETURNS idempotency.claim_result
LANGUAGE plpgsql AS $$
DECLARE
    request jsonb := jsonb_build_object('amount_cents', amount_cents);
    c       idempotency.claim_result;
    body    jsonb;
    new_id  bigint;
BEGIN
    c := idempotency.idem_claim(tenant, 'POST /payments', key,
             idempotency.idem_fingerprint('POST', '/payments', request));
    IF c.action <> 'execute' THEN
        RETURN c;               -- replay, in_progress, mismatch, pending
    END IF;

    INSERT INTO app.payments (tenant, idempotency_key, amount_cents)
    VALUES (tenant, key, amount_cents)
    RETURNING id INTO new_id;

    body := jsonb_build_object('id', new_id, 'amount_cents', amount_cents);
    PERFORM idempotency.idem_finish(tenant, 'POST /payments', key, 201, body);
    -- the first answer, shaped as a replay's will be
    c.response_status := 201;
    c.response_json := body;
    RETURN c;
END
$$;
