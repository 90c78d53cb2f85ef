--
-- The bound on what mismatch answers teach: a key gets at most
-- idempotency.diagnostics_max_mismatches diagnosed mismatches (counted in
-- shared memory, whatever becomes of the claims' transactions), later
-- ones name nothing; members at the pointers of an endpoint's
-- diagnostics_redact are never named.  A client holding one key can
-- otherwise recover a member one guess at a time: shown first with the
-- bound raised, then cut off by the default bound.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency CASCADE;
RESET client_min_messages;
CREATE SCHEMA diag_bound;
SET search_path = diag_bound, public;

SHOW idempotency.diagnostics_max_mismatches;

CREATE FUNCTION req(last4 text, amount int) RETURNS jsonb
LANGUAGE sql AS $$
    SELECT jsonb_build_object('amount', amount, 'currency', 'EUR',
                              'card', jsonb_build_object('brand', 'visa', 'last4', last4))
$$;

-- a claim of key k with body: its action and mismatch
CREATE FUNCTION claim(k text, body jsonb, ep text DEFAULT 'POST /pay',
                      lease interval DEFAULT NULL)
RETURNS idempotency.claim_result
LANGUAGE sql AS $$
    SELECT * FROM idempotency.idem_claim('b', ep, k,
        idempotency.idem_fingerprint('POST', '/pay', body), lease => lease,
        digest => idempotency.idem_request_digest('b', ep, k, body, 'POST', '/pay'))
$$;

-- the first request of a key, claimed and finished (atomic mode)
CREATE FUNCTION store(k text, body jsonb, ep text DEFAULT 'POST /pay') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r idempotency.claim_result := claim(k, body, ep);
BEGIN
    IF r.action = 'execute' THEN
        PERFORM idempotency.idem_finish('b', ep, k, 201, '{"id": 1}');
    END IF;
    RETURN r.action;
END $$;

-- The attack: the amount is not known (every guess gets it wrong).  A
-- first claim with a last4 that cannot be right gives the answer of a
-- wrong guess; then the guesses of card.last4 run from 0000 up until an
-- answer that names members differs from it.  Returns the member found
-- (NULL: none), the claims made, and how many answers named members.
CREATE FUNCTION guess(k text, ep text DEFAULT 'POST /pay')
RETURNS TABLE (recovered text, claims int, answers_with_names int)
LANGUAGE plpgsql AS $$
DECLARE
    r idempotency.claim_result;
    wrong jsonb;
    g text;
BEGIN
    r := claim(k, req('none', 1), ep);
    wrong := r.mismatch -> 'changed';
    claims := 1;
    answers_with_names := (r.mismatch IS NOT NULL)::int;
    FOR i IN 0..9999 LOOP
        g := lpad(i::text, 4, '0');
        r := claim(k, req(g, 1), ep);
        claims := claims + 1;
        IF r.action <> 'mismatch' THEN
            RAISE EXCEPTION 'guess % got %', g, r.action;
        END IF;
        IF r.mismatch IS NOT NULL THEN
            answers_with_names := answers_with_names + 1;
            IF r.mismatch -> 'changed' IS DISTINCT FROM wrong THEN
                recovered := g;
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;
    END LOOP;
    RETURN NEXT;
END $$;

-- Without a bound worth the name (the highest the setting allows), the
-- guessing finds the member: the answer for 0421 no longer names it.
SET idempotency.diagnostics_max_mismatches = 1000;
SELECT store('k-open', req('0421', 1234));
SELECT * FROM guess('k-open');
RESET idempotency.diagnostics_max_mismatches;

-- With the default bound (3), the same guessing over all 10,000 values
-- finds nothing: 3 answers name members, the other 9,997 none.
SELECT idempotency.idem_stats_reset() IS NOT NULL AS reset;
SELECT store('k-bound', req('0421', 1234));
SELECT * FROM guess('k-bound');
SELECT mismatches, diagnosed, diagnoses_withheld
FROM idempotency.stats WHERE endpoint = 'POST /pay';
SELECT mismatch_ratio, diagnoses_withheld FROM idempotency.health WHERE endpoint = 'POST /pay';

-- The counts live outside the transactions: rolled-back claims count, and
-- the fourth mismatch names nothing.
SELECT store('k-rollback', req('0421', 1234));
BEGIN;
SELECT (claim('k-rollback', req('0000', 1))).mismatch -> 'changed' AS first;
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT (claim('k-rollback', req('0001', 1))).mismatch -> 'changed' AS second;
ROLLBACK TO SAVEPOINT s;
SELECT (claim('k-rollback', req('0002', 1))).mismatch -> 'changed' AS third;
ROLLBACK;
SELECT r.action, r.http_status, r.mismatch FROM claim('k-rollback', req('0421', 1)) r;

-- A mismatch past the bound executes nothing: the stored key is as it was.
SELECT state, response_status FROM idempotency.idem_lookup('b', 'POST /pay', 'k-rollback');
SELECT count(*) AS rows_of_key FROM idempotency.keys WHERE tenant = 'b' AND key = 'k-rollback';

-- A new stored request of the key (lease mode: released, then claimed
-- with another request) is counted from 0 again.
SELECT lease_token AS tok FROM claim('k-lease', req('1111', 10), lease => '1 hour') \gset
SELECT (claim('k-lease', req('0000', 1))).mismatch IS NOT NULL AS named
FROM generate_series(1, 4);
SELECT idempotency.idem_release('b', 'POST /pay', 'k-lease', :tok);
SELECT lease_token AS tok FROM claim('k-lease', req('2222', 20), lease => '1 hour') \gset
SELECT (claim('k-lease', req('0000', 1))).mismatch -> 'changed' AS named_again;
SELECT idempotency.idem_release('b', 'POST /pay', 'k-lease', :tok);

-- 0: mismatch answers never name members
SET idempotency.diagnostics_max_mismatches = 0;
SELECT store('k-zero', req('0421', 1234));
SELECT action, mismatch FROM claim('k-zero', req('0421', 1));
RESET idempotency.diagnostics_max_mismatches;

-- the setting's range, and who may change it
SELECT set_config('idempotency.diagnostics_max_mismatches', '1000', true) AS highest;
\set VERBOSITY terse
SET idempotency.diagnostics_max_mismatches = 1001;
SET idempotency.diagnostics_max_mismatches = -1;
CREATE ROLE regress_diag_bound_user;
SET ROLE regress_diag_bound_user;
SET idempotency.diagnostics_max_mismatches = 1000;
RESET ROLE;
DROP ROLE regress_diag_bound_user;
\set VERBOSITY default

-- diagnostics_redact: card data never named.  The guessing above, with
-- the bound raised, finds nothing on an endpoint that redacts the member:
-- every answer names the amount, and only the amount.
SET idempotency.diagnostics_max_mismatches = 1000;
INSERT INTO idempotency.endpoints (endpoint, diagnostics_redact)
VALUES ('POST /card', '{/card/last4,/items/*/pan}');
SELECT store('k-redact', req('0421', 1234), 'POST /card');
SELECT * FROM guess('k-redact', 'POST /card');
SELECT store('k-red', req('0421', 1234), 'POST /card');
SELECT mismatch FROM claim('k-red', req('0000', 1), 'POST /card');
-- only the redacted member differs: nothing named
SELECT mismatch FROM claim('k-red', req('0000', 1234), 'POST /card');
-- a redacted member removed or added is not named either; its parent is
SELECT mismatch FROM claim('k-red', req('0421', 1234) #- '{card,last4}', 'POST /card');
SELECT mismatch FROM claim('k-red', req('0421', 1234) #- '{card,last4}' || '{"x": 1}', 'POST /card');
SELECT mismatch FROM claim('k-red', req('0421', 1234) - 'card', 'POST /card');
-- "*" stands for any element; the other members of an element are named
SELECT store('k-items', '{"items": [{"pan": "4111", "qty": 1}, {"pan": "5500", "qty": 2}]}', 'POST /card');
SELECT mismatch FROM claim('k-items', '{"items": [{"pan": "4112", "qty": 1}, {"pan": "5500", "qty": 3}]}', 'POST /card');
-- a container whose members the digests do not list (here: /card, below
-- the depth that idempotency.diagnostics_max_bytes leaves) is not named
-- for a difference that may be the redacted member's; the amount is
SET idempotency.diagnostics_max_bytes = 100;
SELECT store('k-small', req('0421', 1234), 'POST /card');
SELECT mismatch FROM claim('k-small', req('0000', 1234), 'POST /card');
SELECT mismatch FROM claim('k-small', jsonb_set(req('0421', 1234), '{card,brand}', '"amex"'), 'POST /card');
SELECT mismatch FROM claim('k-small', req('0000', 1), 'POST /card');
RESET idempotency.diagnostics_max_bytes;

-- a change of the endpoint's pointers applies to the next claim
UPDATE idempotency.endpoints SET diagnostics_redact = NULL WHERE endpoint = 'POST /card';
SELECT mismatch -> 'changed' AS changed FROM claim('k-red', req('0000', 1234), 'POST /card');
RESET idempotency.diagnostics_max_mismatches;

DELETE FROM idempotency.keys WHERE tenant = 'b';
DELETE FROM idempotency.endpoints WHERE endpoint = 'POST /card';
DROP SCHEMA diag_bound CASCADE;
