-- ext_pay on an endpoint that keeps no tombstones (tombstone_ttl = 0): see README.md
-- The extension's execute path as an application's stored procedure would call it.
CREATE FUNCTION ext_pay_notomb(p_tenant text, p_key text, p_body jsonb, OUT action text, OUT status int, OUT body jsonb)
LANGUAGE plpgsql AS $$
DECLARE c idempotency.claim_result; pid bigint;
BEGIN
  SELECT * INTO c FROM idempotency.idem_claim(p_tenant, 'POST /v1/payments-notomb', p_key,
      idempotency.idem_fingerprint('POST', '/v1/payments', p_body));
  action := c.action;
  IF c.action = 'execute' THEN
    INSERT INTO payments (tenant_id, amount, currency, idem_key)
    VALUES (p_tenant, (p_body->>'amount')::bigint, p_body->>'currency', p_key) RETURNING id INTO pid;
    body := jsonb_build_object('id', pid, 'status', 'succeeded', 'amount', p_body->'amount');
    PERFORM idempotency.idem_finish(p_tenant, 'POST /v1/payments-notomb', p_key, 201, body, '{"Content-Type":"application/json"}');
    status := 201;
  ELSE
    status := c.http_status; body := c.response_json;
  END IF;
END $$;
