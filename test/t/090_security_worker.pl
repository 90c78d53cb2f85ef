# Security (issue 35, item 1), through the background worker, with nobody
# calling anything: a role holding only idempotency_admin sets a resolver of
# its own that changes the search_path (SET, which would outlive the call) to
# its schema, whose functions and operator shadow those the pass then uses
# on the answer, as the extension's owner.  Each of the admin's functions
# records who ran it: none may have run as anyone but the admin.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('security_worker', conf => qq{
idempotency.maintenance_interval = 1
max_worker_processes = 16
});

$node->safe_psql('postgres', q{
	CREATE ROLE regress_sec_admin LOGIN;
	GRANT idempotency_admin TO regress_sec_admin;
	CREATE SCHEMA adm AUTHORIZATION regress_sec_admin;
});

# what the admin does, as itself
$node->safe_psql('postgres', q{
	SET ROLE regress_sec_admin;
	CREATE TABLE adm.seen (what text, who name, super boolean);
	GRANT INSERT ON adm.seen TO PUBLIC;
	CREATE FUNCTION adm.note(what text) RETURNS void
	LANGUAGE sql AS $$
	    INSERT INTO adm.seen SELECT what, current_user,
	        (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)
	$$;
	CREATE FUNCTION adm.jsonb_typeof(j jsonb) RETURNS text
	LANGUAGE sql AS $$ SELECT adm.note('jsonb_typeof'); SELECT pg_catalog.jsonb_typeof(j) $$;
	CREATE FUNCTION adm.convert_to(t text, enc name) RETURNS bytea
	LANGUAGE sql AS $$ SELECT adm.note('convert_to'); SELECT pg_catalog.convert_to(t, enc) $$;
	CREATE FUNCTION adm.get(j jsonb, k text) RETURNS jsonb
	LANGUAGE sql AS $$ SELECT adm.note('->'); SELECT j OPERATOR(pg_catalog.->) k $$;
	CREATE OPERATOR adm.-> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = adm.get);
	CREATE FUNCTION adm.resolver(tenant text, endpoint text, key text) RETURNS jsonb
	LANGUAGE plpgsql AS $$
	BEGIN
	    PERFORM adm.note('resolver');
	    PERFORM pg_catalog.set_config('search_path', 'adm, pg_catalog', false);
	    RETURN '{"status": 201, "body": {"paid": true}}';
	END $$;
	INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
	VALUES ('pay', 'resolve', 'adm.resolver(text,text,text)');
	SELECT c.action FROM unnest(ARRAY['k1', 'k2']) k,
	    idempotency.idem_claim('acme', 'pay', k, decode(repeat('ab', 32), 'hex'),
	                           lease => '1 second') c;
});

# the worker's passes settle both leases with the resolver's answer
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM idempotency.keys
	WHERE endpoint = 'pay' AND state = 'completed'}),
	'the worker settles the stale leases with the admin\'s resolver');
is( $node->safe_psql('postgres', q{
	SELECT string_agg(key || ':' || response_status || ':' || convert_from(response_body, 'UTF8'),
	                  ' ' ORDER BY key)
	FROM idempotency.keys WHERE endpoint = 'pay'}),
	'k1:201:{"paid": true} k2:201:{"paid": true}',
	'the answer is read as the pass reads it');

# the answer was read after the resolver's call, in the same pass
is( $node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT what || ' as ' || CASE WHEN super THEN 'a superuser' ELSE who END,
	                  ', ' ORDER BY what || ' as ' || CASE WHEN super THEN 'a superuser' ELSE who END)
	FROM adm.seen}),
	'resolver as regress_sec_admin',
	'only the resolver ran, as the admin: none of the admin\'s functions ran as the extension\'s owner');

$node->stop;
done_testing();
