-- idempotency install script: moving a tenant's keys between databases,
-- for re-partitioning a sharded deployment (doc/scaling.md).
--
-- idem_export_keys returns one jsonb object per live key of a tenant (the
-- row of idempotency.keys as to_jsonb writes it); idem_import_keys writes
-- such objects into this database, keeping every column (expires_at, the
-- lease, the stored response) as it was.  Admin only: EXECUTE is revoked
-- from PUBLIC (sql/parts/99_privileges.sql).

-- The tenant checks shared by both: a NULL or empty tenant is malformed
-- (IK400), another tenant than the one the session is bound to is refused
-- (IK401), as the claim functions do.
CREATE FUNCTION idempotency.idem_transfer_check_tenant(tenant text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound text := pg_catalog.current_setting('idempotency.tenant', true);
BEGIN
    IF tenant IS NULL OR tenant = '' THEN
        RAISE EXCEPTION 'tenant is empty'
            USING ERRCODE = 'IK400',
                  DETAIL = 'Every key is scoped by tenant and endpoint; neither may be empty.';
    END IF;
    IF bound IS NOT NULL AND bound <> '' AND bound <> tenant COLLATE "C" THEN
        RAISE EXCEPTION 'this session may not act for tenant "%"', tenant
            USING ERRCODE = 'IK401',
                  DETAIL = pg_catalog.format('The setting idempotency.tenant binds this session to tenant "%s".', bound),
                  HINT = 'Pass the session''s own tenant, or connect as a role bound to the other tenant.';
    END IF;
END
$$;

-- Every live key of the tenant, in (endpoint, key) order.
CREATE FUNCTION idempotency.idem_export_keys(tenant text)
RETURNS SETOF jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.idem_transfer_check_tenant(tenant);
    RETURN QUERY
        -- without request_digest: with idem_request_digest it would let the
        -- holder test guesses of the request's values, and another
        -- database's secret could not read it anyway
        SELECT pg_catalog.to_jsonb(k) OPERATOR(pg_catalog.-) 'request_digest'
        FROM idempotency.keys k
        WHERE k.tenant = idem_export_keys.tenant
          AND k.expires_at > pg_catalog.now()
        ORDER BY k.endpoint, k.key;
END
$$;
COMMENT ON FUNCTION idempotency.idem_export_keys(text) IS
    'Every live key of a tenant, one jsonb object per key, for idem_import_keys in another database';

-- The checks of each row idem_import_keys writes (src/transfer.c): those
-- of a claim and a finish, by the same C functions; the row as a finish
-- would have stored it.  For the import alone: EXECUTE is granted to
-- nobody (sql/parts/99_privileges.sql), the import runs as the owner.
CREATE FUNCTION idempotency.idem_import_check(pos bigint, item idempotency.keys)
RETURNS idempotency.keys
AS 'MODULE_PATHNAME', 'idem_import_check'
LANGUAGE C VOLATILE;

-- A stored body as a replay reads it (decrypted when marked encrypted), for
-- idem_import_keys's comparison of a row with the live one.  The import's
-- alone, as idem_import_check.
CREATE FUNCTION idempotency.idem_import_plain_body(body bytea, encrypted boolean)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_import_plain_body'
LANGUAGE C VOLATILE;

-- Write keys exported by idem_export_keys (a jsonb array of them, or one
-- object).  A key whose live row here has the same content is left alone
-- (so that an import can run twice), one already expired is skipped, and a
-- live row with other content is never overwritten: an error (IK409), or
-- with on_conflict => 'keep' counted and left as it is.  One row per
-- outcome: inserted, unchanged, kept, expired.  An infinite expires_at, or
-- one later than idempotency.max_ttl from now, is refused (22023); a
-- request_digest in the JSON is dropped (digests are keyed with this
-- database's secret, and the export leaves them out).  Every element is
-- checked as a claim and a finish check what they store
-- (idem_import_check): the first one refused ends the import, with an
-- error naming it and its column, and nothing of the import is written.
--
-- Claims serialise on a lock of their scope that SQL cannot take; the
-- import locks idempotency.keys instead (ACCESS EXCLUSIVE, until the
-- transaction ends), which waits for every transaction that holds a claim
-- of this database and holds back new ones, and it reads what committed
-- before with a statement snapshot, which needs READ COMMITTED.
CREATE FUNCTION idempotency.idem_import_keys(keys jsonb, on_conflict text DEFAULT 'error')
RETURNS TABLE (outcome text, rows bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    items jsonb := idem_import_keys.keys;
    item jsonb;
    pos bigint := 0;
    r idempotency.keys;
    cur idempotency.keys;
    n_inserted bigint := 0;
    n_unchanged bigint := 0;
    n_kept bigint := 0;
    n_expired bigint := 0;
    max_ttl interval;
BEGIN
    IF on_conflict IS NULL OR on_conflict NOT IN ('error', 'keep') THEN
        RAISE EXCEPTION 'invalid value for on_conflict: "%"', on_conflict
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Valid values are "error" and "keep".';
    END IF;
    IF items IS NULL THEN
        RAISE EXCEPTION 'keys to import must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.jsonb_typeof(items) = 'object' THEN
        items := pg_catalog.jsonb_build_array(items);
    ELSIF pg_catalog.jsonb_typeof(items) <> 'array' THEN
        RAISE EXCEPTION 'keys to import must be a JSON array or object'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass what idem_export_keys returns: one object per key, or an array of them (jsonb_agg).';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'idem_import_keys must run at isolation level READ COMMITTED'
            USING ERRCODE = 'active_sql_transaction',
                  DETAIL = 'The import must see every key committed before it took its lock, which a transaction snapshot taken earlier would hide.';
    END IF;

    LOCK TABLE ONLY idempotency.keys IN ACCESS EXCLUSIVE MODE;

    FOR item IN SELECT e.value FROM pg_catalog.jsonb_array_elements(items) e
    LOOP
        pos := pos + 1;
        IF pg_catalog.jsonb_typeof(item) <> 'object' THEN
            RAISE EXCEPTION 'element % of the keys to import is not a JSON object', pos
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        r := pg_catalog.jsonb_populate_record(NULL::idempotency.keys, item);
        -- what a claim and a finish check, by the same C functions: the
        -- scope, the fingerprint, the state, created_at <= expires_at, the
        -- status, the headers (sensitive ones dropped), the body (JSON,
        -- decryptable, within the size cap, omitted where the endpoint
        -- keeps none); an error names the element and its column
        r := idempotency.idem_import_check(pos, r);
        PERFORM idempotency.idem_transfer_check_tenant(r.tenant);
        -- the setting in seconds, read once the library is loaded (the
        -- checks above call it)
        IF max_ttl IS NULL THEN
            SELECT pg_catalog.make_interval(secs => s.setting::double precision) INTO max_ttl
            FROM pg_catalog.pg_settings s WHERE s.name = 'idempotency.max_ttl';
        END IF;
        IF r.expires_at > pg_catalog.now() + max_ttl THEN
            RAISE EXCEPTION 'expires_at of element % of the keys to import is beyond idempotency.max_ttl from now', pos
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = pg_catalog.format('It is %s; keys may be kept until %s at the latest.',
                                                 r.expires_at, pg_catalog.now() + max_ttl),
                      HINT = 'Raise idempotency.max_ttl in this database to what the source database allowed.';
        END IF;
        -- a digest is keyed with the source database's secret: dropped
        r.request_digest := NULL;

        IF r.expires_at <= pg_catalog.now() THEN
            n_expired := n_expired + 1;
            CONTINUE;
        END IF;

        SELECT * INTO cur
        FROM idempotency.keys k
        WHERE k.key = r.key AND k.endpoint = r.endpoint AND k.tenant = r.tenant
          AND k.expires_at > pg_catalog.now();
        IF FOUND THEN
            -- the same row, its body compared as a replay reads it (an
            -- encryption is new each time: a plain body imported again
            -- under a key, or an encrypted one, is unchanged)
            IF pg_catalog.to_jsonb(cur) OPERATOR(pg_catalog.-) ARRAY['request_digest', 'response_body', 'body_encrypted']
               = pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.-) ARRAY['request_digest', 'response_body', 'body_encrypted']
               AND idempotency.idem_import_plain_body(cur.response_body, cur.body_encrypted)
                   IS NOT DISTINCT FROM
                   idempotency.idem_import_plain_body(r.response_body, r.body_encrypted) THEN
                n_unchanged := n_unchanged + 1;
            ELSIF on_conflict = 'keep' THEN
                n_kept := n_kept + 1;
            ELSE
                RAISE EXCEPTION 'element % of the keys to import differs from the live key of its scope', pos
                    USING ERRCODE = 'IK409',
                          DETAIL = pg_catalog.format('Key %s of tenant "%s" and endpoint "%s" is %s here; the import never overwrites a live key.',
                                                     idempotency.idem_key_hash(r.tenant, r.endpoint, r.key),
                                                     r.tenant, r.endpoint, cur.state),
                          HINT = 'Compare the two with idem_lookup, or pass on_conflict => ''keep'' to keep the keys already here.';
            END IF;
            CONTINUE;
        END IF;

        -- an expired row of the scope would hold its partition's unique index
        DELETE FROM idempotency.keys k
        WHERE k.key = r.key AND k.endpoint = r.endpoint AND k.tenant = r.tenant;
        INSERT INTO idempotency.keys SELECT r.*;
        n_inserted := n_inserted + 1;
    END LOOP;

    RETURN QUERY VALUES ('inserted', n_inserted), ('unchanged', n_unchanged),
                        ('kept', n_kept), ('expired', n_expired);
END
$$;
COMMENT ON FUNCTION idempotency.idem_import_keys(jsonb, text) IS
    'Write keys exported by idem_export_keys, keeping expires_at; never overwrites a live key with other content';
