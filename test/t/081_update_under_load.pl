# ALTER EXTENSION idempotency UPDATE from the previous release while
# applications run: pgbench clients with prepared statements (-M prepared,
# "SELECT * FROM idempotency.idem_claim(...)"), atomic and lease mode, each
# transaction checking that its claim executes and its retry replays.  The
# update from 0.3.0 costs them no error, and every transaction pgbench
# counts left exactly one completed key.  The same load over the update
# from 0.2.0 to 0.3.0 (which dropped idem_claim's old form and added a
# column to claim_result) shows that this test sees the errors an update
# causes.  The locks the update holds are printed (see doc/operations.md).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('update', conf => qq{
max_connections = 40
}, extension => 0);

# Two scripts, one transaction each; a claim that does not answer as it
# should divides by zero, which pgbench counts as an error.
my $dir = $node->basedir;
append_to_file("$dir/atomic.sql", q{
\set n random(1, 1000000000000000)
BEGIN;
SELECT * FROM idempotency.idem_claim('acme', 'POST /atomic', 'a-' || :client_id::int || '-' || :n::bigint, sha256(convert_to('a' || :n::bigint, 'UTF8'))) \gset c_
SELECT 1 / (:c_action::text = 'execute')::int AS executes;
SELECT idempotency.idem_finish('acme', 'POST /atomic', 'a-' || :client_id::int || '-' || :n::bigint, 201, jsonb_build_object('n', :n::bigint));
COMMIT;
SELECT * FROM idempotency.idem_claim('acme', 'POST /atomic', 'a-' || :client_id::int || '-' || :n::bigint, sha256(convert_to('a' || :n::bigint, 'UTF8'))) \gset r_
SELECT 1 / (:r_action::text = 'replay')::int AS replays;
});
append_to_file("$dir/lease.sql", q{
\set n random(1, 1000000000000000)
SELECT * FROM idempotency.idem_claim('acme', 'POST /lease', 'l-' || :client_id::int || '-' || :n::bigint, sha256(convert_to('l' || :n::bigint, 'UTF8')), lease => interval '1 minute') \gset c_
SELECT 1 / (:c_action::text = 'execute')::int AS executes;
SELECT idempotency.idem_heartbeat('acme', 'POST /lease', 'l-' || :client_id::int || '-' || :n::bigint, :c_lease_token::bigint, interval '1 minute');
SELECT idempotency.idem_finish('acme', 'POST /lease', 'l-' || :client_id::int || '-' || :n::bigint, 200, jsonb_build_object('n', :n::bigint), lease_token => :c_lease_token::bigint);
SELECT * FROM idempotency.idem_claim('acme', 'POST /lease', 'l-' || :client_id::int || '-' || :n::bigint, sha256(convert_to('l' || :n::bigint, 'UTF8')), lease => interval '1 minute') \gset r_
SELECT 1 / (:r_action::text = 'replay')::int AS replays;
});

my $keys = q{SELECT count(*) FROM idempotency.keys WHERE endpoint IN ('POST /atomic', 'POST /lease')};

# Wait until at least $n keys are stored, while pgbench ($h) runs.
sub wait_for_keys
{
	my ($n, $h) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	my $pid = $h->{KIDS}[0]{PID};
	while (time() < $deadline && kill(0, $pid))
	{
		return 1 if $node->safe_psql('postgres', "SELECT ($keys) >= $n") eq 't';
		select(undef, undef, undef, 0.2);
	}
	return 0;
}

# Install $from, start the load, update once it runs, let it run on after
# the update; returns pgbench's exit status, stdout and stderr, and the
# locks the update held (one line each).
sub update_under_load
{
	my ($from, $expect_errors) = @_;
	$node->safe_psql('postgres', qq{
		SET client_min_messages = warning;
		DROP EXTENSION IF EXISTS idempotency CASCADE;
		CREATE EXTENSION idempotency VERSION '$from' CASCADE;});
	# one thread per client: pgbench prepares a client's statements
	# synchronously, and one that waits for the update's lock must not hold
	# up other clients in their transactions, which the update waits for;
	# its output goes to files, which it never waits to write
	my ($out_file, $err_file) = ("$dir/pgbench-$from.out", "$dir/pgbench-$from.err");
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-M', 'prepared', '-c', '6', '-j', '6', '-T', '20',
			'-f', "$dir/atomic.sql", '-f', "$dir/lease.sql",
			'-d', $node->connstr('postgres')
		],
		'>', $out_file, '2>', $err_file);
	wait_for_keys(100, $h) or diag('the load did not start: ' . slurp_file($err_file));

	# the update, and the locks its transaction holds at its end
	my $locks = $node->safe_psql('postgres', q{
		BEGIN;
		-- a stall fails the test, instead of hanging it
		SET LOCAL lock_timeout = '60s';
		ALTER EXTENSION idempotency UPDATE;
		SELECT string_agg(d || ': ' || mode, E'\n' ORDER BY d, mode)
		FROM (SELECT coalesce(l.relation::regclass::text,
		                      pg_describe_object(l.classid, l.objid, l.objsubid)) AS d, l.mode
		      FROM pg_locks l
		      WHERE l.pid = pg_backend_pid() AND l.granted AND l.locktype IN ('relation', 'object')
		        AND (l.relation IS NULL OR l.relation::regclass::text LIKE 'idempotency.%')) s;
		COMMIT;});
	my $after = $node->safe_psql('postgres', $keys);

	# the load goes on after the update, then pgbench ends by itself
	# (where clients fail, they stop)
	wait_for_keys($after + 100, $h)
	  or diag('no load after the update')
	  unless $expect_errors;
	$h->finish;
	return ($h->result(0), slurp_file($out_file), slurp_file($err_file), $locks);
}

# from the previous release: no error
my ($rc, $out, $err, $locks) = update_under_load('0.3.0');
is($node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$node->safe_psql('postgres', q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'}),
	'updated from 0.3.0 to the current version under load');
note("locks held by the update's transaction:\n$locks");
is($rc, 0, 'pgbench ends without error') or diag($err);
unlike($err, qr/ERROR|aborted/, 'no client saw an error or was aborted');
my ($processed) = $out =~ /number of transactions actually processed: (\d+)/;
my ($failed) = $out =~ /number of failed transactions: (\d+)/;
ok(defined $processed && $processed >= 200, 'pgbench ran transactions ' . ($processed // 'none'))
  or diag($out);
is($failed // 0, 0, 'pgbench counts 0 failed transactions');
is( $node->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE state = 'completed') || '/' || count(*)
		FROM idempotency.keys WHERE endpoint IN ('POST /atomic', 'POST /lease')}),
	"$processed/$processed",
	'every transaction left one completed key, none other');

# the harness sees the errors of an update that breaks running sessions:
# 0.2.0 to 0.3.0 drops idem_claim's form of 0.2.0 and adds a column to its
# result type
($rc, $out, $err) = update_under_load('0.2.0', 1);
isnt($rc, 0, 'over the update from 0.2.0 to 0.3.0, pgbench fails');
like($err, qr/cached plan must not change result type|cache lookup failed for function/,
	'with the errors that update causes running sessions');

$node->stop;
done_testing();
