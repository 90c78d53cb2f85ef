# idempotency.tenant set in a connection's startup packet, with the library
# preloaded and without: a role bound to a tenant by ALTER ROLE cannot move
# itself to another tenant through its startup packet, and a pooler role
# granted SET on the setting binds each connection once, after which the
# code it runs on that connection, as the same role, cannot move it.  Without
# shared_preload_libraries the pooler's role loads the library at connection
# start (session_preload_libraries), as the README says, so that a SET
# binds at once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

for my $preload (1, 0)
{
	my $mode = $preload ? 'preloaded' : 'not preloaded';
	my $node = $preload
	  ? idem_node('tenant_preload', conf => "idempotency.enable_worker = off\n", extension => 0)
	  : idem_node('tenant_nopreload', preload => 0, extension => 0);
	$node->safe_psql('postgres', q{
		CREATE EXTENSION idempotency CASCADE;
		CREATE ROLE app_acme LOGIN;
		GRANT idempotency_client TO app_acme;
		ALTER ROLE app_acme SET idempotency.tenant = 'acme';
		CREATE ROLE pooler LOGIN;
		GRANT idempotency_client TO pooler;
		GRANT SET ON PARAMETER idempotency.tenant TO pooler;
		INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at,
		                              completed_at, expires_at, response_status)
		VALUES ('globex', 'POST /pay', 'g-done', sha256('g'), 'completed', now(), now(),
		        now() + interval '1 hour', 201);});

	$node->safe_psql('postgres',
		q{ALTER ROLE pooler SET session_preload_libraries = 'idempotency'})
	  unless $preload;

	my $claim_globex =
	  q{SELECT action FROM idempotency.idem_claim('globex', 'POST /pay', 'g-done', sha256('g'))};
	my $base = $node->connstr('postgres');

	# the bound role names another tenant in its startup packet
	my ($rc, $out, $err) = $node->psql('postgres', "$claim_globex;",
		connstr => "$base user=app_acme options='-c idempotency.tenant=globex'");
	if ($preload)
	{
		like($err, qr/FATAL:  permission denied to set parameter "idempotency.tenant"/,
			"$mode: a bound role cannot connect with another tenant in its startup packet");
	}
	else
	{
		like($err, qr/IK401|this session may not act for tenant "globex"/,
			"$mode: a bound role's startup packet does not unbind it");
	}
	isnt($out, 'replay', "$mode: no replay of the other tenant's key");

	# nor with an empty value (unbound)
	($rc, $out, $err) = $node->psql('postgres', "$claim_globex;",
		connstr => "$base user=app_acme options='-c idempotency.tenant='");
	isnt($out, 'replay', "$mode: an empty tenant in the startup packet does not unbind");

	# the pooler binds a connection in its startup packet; afterwards the
	# same role cannot move it, by SET, RESET or set_config
	($rc, $out, $err) = $node->psql('postgres', qq{
		SHOW idempotency.tenant;
		SET idempotency.tenant = 'acme';
		SELECT set_config('idempotency.tenant', 'acme', false);
		RESET idempotency.tenant;
		RESET ALL;
		SHOW idempotency.tenant;
		$claim_globex;
		SELECT action FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', sha256('a'));},
		connstr => "$base user=pooler options='-c idempotency.tenant=globex'",
		on_error_stop => 0);
	is($out, "globex\nglobex\nreplay", "$mode: the pooler's connection stays bound to globex");
	like($err, qr/cannot be changed once it has bound the session.*cannot be changed once it has bound the session.*this session may not act for tenant "acme"/s,
		"$mode: the pooler's connection refuses another tenant");

	# the pooler binds by SET as its first statement: the same
	($rc, $out, $err) = $node->psql('postgres', qq{
		SET idempotency.tenant = 'globex';
		BEGIN;
		SET LOCAL idempotency.tenant = 'acme';
		ROLLBACK;
		DISCARD ALL;
		SHOW idempotency.tenant;
		SELECT action FROM idempotency.idem_claim('acme', 'POST /pay', 'a-1', sha256('a'));},
		connstr => "$base user=pooler", on_error_stop => 0);
	is($out, 'globex', "$mode: a connection bound by SET stays bound");
	like($err, qr/this session may not act for tenant "acme"/,
		"$mode: a connection bound by SET refuses another tenant");

	$node->stop;
}

done_testing();
