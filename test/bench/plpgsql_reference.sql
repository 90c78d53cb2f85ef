-- test/bench/plpgsql_reference.sql: the same protocol as the extension's
-- atomic mode, written in PL/pgSQL the way a guide to idempotency keys in
-- PostgreSQL would have it.  scripts/bench.sh compares the extension with it.
--
-- One unpartitioned table with a primary key on (tenant, endpoint, key).
-- The claim inserts an in_progress row with INSERT ... ON CONFLICT DO
-- NOTHING RETURNING; a concurrent claim of the same key waits on the unique
-- index until the first transaction ends, then finds its row.  The
-- application then does its business write and finishes the key with an
-- UPDATE to completed, in the same transaction.  The fingerprint is
-- sha256(convert_to(body::text, 'UTF8')).  Expired rows are replaced.

CREATE SCHEMA ref;

CREATE TABLE ref.idem_keys (
    tenant          text NOT NULL,
    endpoint        text NOT NULL,
    key             text NOT NULL,
    fingerprint     bytea NOT NULL,
    state           text NOT NULL DEFAULT 'in_progress'
                    CHECK (state IN ('in_progress', 'completed')),
    response_status integer,
    response_body   jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (tenant, endpoint, key)
);

CREATE FUNCTION ref.idem_claim(p_tenant text, p_endpoint text, p_key text,
                               p_body jsonb, p_ttl interval DEFAULT '24 hours',
                               OUT action text, OUT response_status integer,
                               OUT response_body jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_fp    bytea := sha256(convert_to(p_body::text, 'UTF8'));
    v_row   ref.idem_keys;
    v_key   text;
BEGIN
    LOOP
        INSERT INTO ref.idem_keys (tenant, endpoint, key, fingerprint, expires_at)
        VALUES (p_tenant, p_endpoint, p_key, v_fp, now() + p_ttl)
        ON CONFLICT DO NOTHING
        RETURNING key INTO v_key;
        IF v_key IS NOT NULL THEN
            action := 'execute';
            RETURN;
        END IF;

        SELECT * INTO v_row FROM ref.idem_keys
         WHERE tenant = p_tenant AND endpoint = p_endpoint AND key = p_key;
        IF NOT FOUND THEN
            CONTINUE;               -- the other claim rolled back: try again
        END IF;
        IF v_row.expires_at <= now() THEN
            DELETE FROM ref.idem_keys
             WHERE tenant = p_tenant AND endpoint = p_endpoint AND key = p_key
               AND expires_at <= now();
            CONTINUE;
        END IF;
        EXIT;
    END LOOP;

    IF v_row.fingerprint <> v_fp THEN
        action := 'mismatch';
    ELSIF v_row.state = 'completed' THEN
        action := 'replay';
        response_status := v_row.response_status;
        response_body := v_row.response_body;
    ELSE
        action := 'in_progress';
    END IF;
END;
$$;

CREATE FUNCTION ref.idem_finish(p_tenant text, p_endpoint text, p_key text,
                                p_status integer, p_body jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ref.idem_keys
       SET state = 'completed', response_status = p_status,
           response_body = p_body, completed_at = now()
     WHERE tenant = p_tenant AND endpoint = p_endpoint AND key = p_key
       AND state = 'in_progress';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no claim in progress for key %', p_key;
    END IF;
END;
$$;
