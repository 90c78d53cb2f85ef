-- examples/plproxy_proxy.sql: the proxy side of examples/plproxy_shard.sql,
-- run in the proxy database, which has the extensions plproxy and
-- idempotency_plproxy (for the type idempotency.claim_result) and the
-- server idempotency that lists the shards (README "Scaling out").
CREATE SCHEMA app;

CREATE FUNCTION app.create_payment(tenant text, key text, amount_cents bigint)
RETURNS idempotency.claim_result
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON hashtext(tenant);
    TARGET app.create_payment;
$$;
