# pg_dump then pg_restore into a fresh database keeps live keys (in dated
# partitions and in the default partition), endpoint policies and the
# outbox (operations, attempts, the sequence of ids), and the restored
# database accepts new keys, operations and maintenance at once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

skip_unless_client_as_new('pg_dump', 'dump');

my $node = idem_node('dump', conf => qq{
idempotency.enable_worker = off
});

$node->safe_psql('postgres', q{
	INSERT INTO idempotency.endpoints (endpoint, ttl, lease) VALUES ('pay', '2 days', '30 seconds');
	-- a resolver run by a role other than the one restoring keeps its role
	CREATE ROLE oncall NOLOGIN;
	CREATE FUNCTION public.find_charge(tenant text, endpoint text, key text)
	RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
	INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver, resolver_role)
	VALUES ('charge', 'resolve', 'public.find_charge(text,text,text)', 'oncall');
	SELECT count(*) FROM idempotency.idem_maintenance();
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, response_status,
	    body_kind, response_body, created_at, completed_at, expires_at)
	SELECT 'acme', 'pay', 'k' || i, decode(repeat('ab', 32), 'hex'), 'completed', 201,
	    'json', convert_to('{"n": ' || i || '}', 'UTF8'), now(), now(),
	    now() + i * interval '1 hour'
	FROM generate_series(1, 100) i;
	-- beyond the premade partitions: the default partition holds it
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
	VALUES ('acme', 'pay', 'far', decode(repeat('ab', 32), 'hex'), 'completed', now(),
	        now() + interval '60 days');
	-- the outbox: two operations, one with a recorded attempt
	SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{"n": 1}', key => 'op-1');
	SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{"n": 2}', key => 'op-2',
	                                   not_before => now() + interval '1 day');
	SELECT idempotency.idem_outbox_record(l.id, l.lease_token, 'retry', 503,
	                                      retry_at => now() + interval '1 hour')
	FROM idempotency.idem_outbox_lease(10, '1 minute') l;
});

my $snapshot = q{
	SELECT (SELECT string_agg(tableoid::regclass || '/' || key || '/' || state || '/'
	                          || coalesce(convert_from(response_body, 'UTF8'), '-'), ',' ORDER BY key)
	        FROM idempotency.keys)
	    || ' | ' || (SELECT string_agg(endpoint || '/' || coalesce(ttl::text, '-') || '/' || coalesce(lease::text, '-')
	                          || '/' || coalesce(resolver::text, '-') || '/' || coalesce(resolver_role::text, '-'),
	                          ',' ORDER BY endpoint) FROM idempotency.endpoints)
	    || ' | ' || (SELECT string_agg(c.relname || '=' || pg_get_expr(c.relpartbound, c.oid), ',' ORDER BY c.relname)
	                 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	                 WHERE i.inhparent = 'idempotency.keys'::regclass)
	    || ' | ' || (SELECT string_agg(o.id || '/' || o.key || '/' || o.state || '/' || o.attempts || '/'
	                                   || o.body::text || '/' || coalesce(a.outcome, '-'), ',' ORDER BY o.id)
	                 FROM idempotency.outbox o LEFT JOIN idempotency.outbox_attempts a ON a.outbox_id = o.id)
};
my $before = $node->safe_psql('postgres', $snapshot);
like($before, qr/keys_default\/far\//, 'a row sits in the default partition');
like($before, qr{charge/-/-/public\.find_charge\(text,text,text\)/oncall}, 'an endpoint\'s resolver runs as oncall');
like($before, qr{1/op-1/pending/1/\{"n": 1\}/retry,2/op-2/pending/0/\{"n": 2\}/-}, 'the outbox holds two operations and an attempt');

my $dump = $node->basedir . '/idem.dump';
$node->command_ok(
	[ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ],
	'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
my ($stdout, $stderr);
my $ok = IPC::Run::run([ 'pg_restore', '-d', $node->connstr('restored'), $dump ],
	'>', \$stdout, '2>', \$stderr);
ok($ok, 'pg_restore into a fresh database');
is($stderr, '', 'without errors or warnings');

is($node->safe_psql('restored', $snapshot), $before,
	'keys, their partitions, the endpoint policies (with the resolver\'s role) and the outbox are restored');
is( $node->safe_psql('restored', q{
	SELECT idempotency.idem_outbox_add('POST', 'https://a.example/', '{}', key => 'op-3');
	SELECT id FROM idempotency.outbox WHERE key = 'op-3'}),
	"op-3\n3", 'the sequence of the outbox\'s ids goes on where it was');
is( $node->safe_psql('restored', q{
	SELECT count(*) FROM pg_inherits i
	WHERE i.inhparent = 'idempotency.keys'::regclass
	  AND NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = i.inhrelid AND x.indisunique)}),
	'0', 'every partition keeps its unique (tenant, endpoint, key)');

# the restored database works at once
$node->safe_psql('restored', q{
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
	VALUES ('acme', 'pay', 'new', decode(repeat('ab', 32), 'hex'), 'completed', now(),
	        now() + interval '1 hour')});
my ($ret, $out, $err) = $node->psql('restored', q{
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
	VALUES ('acme', 'pay', 'k1', decode(repeat('ab', 32), 'hex'), 'completed', now(),
	        now() + interval '1 hour')});
isnt($ret, 0, 'the restored unique index refuses a duplicate live row');
like( $node->safe_psql('restored', q{
	SELECT string_agg(kind || ':' || object || ':' || coalesce(rows::text, '-'), ',' ORDER BY kind, object)
	FROM idempotency.idem_maintenance(now() + interval '55 days', preview => false)}),
	qr/create:keys_p\d{8}t0000:1/, 'maintenance runs on the restored database and moves the far row');
is($node->safe_psql('restored', q{SELECT count(*) FROM idempotency.keys_default}),
	'0', 'the default partition is empty again');

# DROP EXTENSION removes the restored partitions too
$node->safe_psql('restored', 'DROP EXTENSION idempotency');
is($node->safe_psql('restored', q{SELECT count(*) FROM pg_class WHERE relname LIKE 'keys_%'}),
	'0', 'DROP EXTENSION leaves no partition behind');

$node->stop;
done_testing();
