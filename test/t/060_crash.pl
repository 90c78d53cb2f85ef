# Crashes under load: pgbench runs claims in atomic mode (claim, business
# insert and finish in one transaction) and in lease mode (a committed claim,
# the outside call, then business insert and finish in one transaction), on
# few keys so that duplicates race, and the server is killed with SIGKILL
# mid-load: the postmaster in some cycles, one backend (which makes the
# postmaster reset every process) in others.  After each restart the
# business rows and the keys must agree exactly: no business row without its
# completed key, no completed key without its business row, no key with two
# business rows; every key answers a claim as its state says; the counters
# start from zero; and the leases that the crash left in progress become
# unknown once they have run out and a maintenance pass has run.  Nothing is
# checked against a clock: the test waits for rows and states, never for a
# time.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

my $node = idem_node('crash', conf => qq{
idempotency.enable_worker = off
restart_after_crash = on
max_connections = 30
}, extension => 0);

# The business table carries the idempotency key; no unique constraint on it,
# so that a second execution would show as a second row, to be counted.
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency CASCADE;
CREATE TABLE biz (id bigserial PRIMARY KEY, endpoint text NOT NULL, key text NOT NULL, client int);
});

my $dir = PostgreSQL::Test::Utils::tempdir;
my $key = q{'c' || :cycle || '-' || :k};
my $fp = "sha256(convert_to($key, 'UTF8'))";

# atomic mode: everything in one transaction; the finish's response names
# the business row
my $atomic = write_script($dir, 'atomic', qq{\\set k random(1, 150)
BEGIN;
SELECT (action = 'execute')::int AS exec FROM idempotency.idem_claim('t', 'POST /atomic', $key, $fp, wait => '1 s') \\gset
\\if :exec
SELECT pg_sleep(0.005);
INSERT INTO biz (endpoint, key, client) VALUES ('POST /atomic', $key, :client_id) RETURNING id AS bid \\gset
SELECT idempotency.idem_finish('t', 'POST /atomic', $key, 201, jsonb_build_object('id', :bid));
\\endif
END;
});

# lease mode: the claim commits an in_progress row; after the outside call,
# business insert and finish commit together
my $lease = write_script($dir, 'lease', qq{\\set k random(1, 150)
SELECT (action = 'execute')::int AS exec, coalesce(lease_token, 0) AS token FROM idempotency.idem_claim('t', 'POST /lease', $key, $fp, lease => '2 s', wait => '1 s') \\gset
\\if :exec
SELECT pg_sleep(0.02);
BEGIN;
INSERT INTO biz (endpoint, key, client) VALUES ('POST /lease', $key, :client_id) RETURNING id AS bid \\gset
SELECT idempotency.idem_finish('t', 'POST /lease', $key, 201, jsonb_build_object('id', :bid), lease_token => :token);
COMMIT;
\\endif
});

# the invariants, each as the number of rows that break it
my %checks = (
	claim_load_checks(),
	'no key has two rows' => q{
		SELECT count(*) FROM (SELECT 1 FROM idempotency.keys GROUP BY tenant, endpoint, key HAVING count(*) > 1) d},
);

sub check_invariants
{
	my ($when) = @_;
	for my $name (sort keys %checks)
	{
		is($node->safe_psql('postgres', $checks{$name}), '0', "$when: $name");
	}
}

my $stale_total = 0;
my @cycles = ('postmaster', 'backend', 'postmaster', 'backend');
for my $cycle (1 .. @cycles)
{
	my $victim = $cycles[ $cycle - 1 ];
	my $when = "cycle $cycle (kill -9 of a $victim)";
	my $offset = -s $node->logfile;

	# one more leased claim whose holder is inside its business transaction
	# when the crash comes: its insert must go, its key must become unknown
	my $k = "c$cycle-held";
	my $token = $node->safe_psql('postgres', qq{
		SELECT lease_token FROM idempotency.idem_claim('t', 'POST /lease', '$k',
		    sha256(convert_to('$k', 'UTF8')), lease => '2 s')});
	my ($hout, $herr) = ('', '');
	my $held = IPC::Run::start(
		[ 'psql', '-X', '-A', '-t', '-d', $node->connstr('postgres'), '-c', qq{
		  BEGIN;
		  INSERT INTO biz (endpoint, key) VALUES ('POST /lease', '$k');
		  SELECT pg_sleep(300);
		  SELECT idempotency.idem_finish('t', 'POST /lease', '$k', 201, '{}', lease_token => $token);
		  COMMIT;} ],
		'>', \$hout, '2>', \$herr);

	my ($out, $err) = ('', '');
	my $bench;
	{
		local $ENV{PGAPPNAME} = 'crash-load';
		$bench = IPC::Run::start(
			[ 'pgbench', '-n', '-h', $node->host, '-p', $node->port,
			  '-c', '6', '-j', '2', '-T', '90', '-D', "cycle=$cycle",
			  '-f', "$atomic\@1", '-f', "$lease\@1", 'postgres' ],
			'>', \$out, '2>', \$err);
	}

	# the load has done some work, in both modes, and the held claim has
	# inserted its business row (uncommitted)
	ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) FILTER (WHERE endpoint = 'POST /atomic') >= 20
		   AND count(*) FILTER (WHERE endpoint = 'POST /lease') >= 20
		   AND (SELECT count(*) FROM pg_stat_activity
		        WHERE query LIKE '%pg_sleep(300)%' AND wait_event = 'PgSleep') = 1
		FROM biz WHERE key LIKE 'c$cycle-%'}),
		"$when: the load runs");
	select(undef, undef, undef, rand(0.3));

	if ($victim eq 'postmaster')
	{
		# the orphaned backends leave when they next wait (for their
		# client, a lock, a sleep); until they have, a new postmaster
		# would refuse to start on their shared memory
		my @procs = ($node->{_pid}, child_pids($node->{_pid}));
		$node->kill9;
		ok(wait_until_gone(\@procs, 60), "$when: the server's " . @procs . " processes are gone");
		my $started = $node->start(fail_ok => 1);
		ok($started, "$when: the server starts again");
	}
	else
	{
		my $pid = $node->safe_psql('postgres', q{
			SELECT pid FROM pg_stat_activity
			WHERE application_name = 'crash-load' AND pid <> pg_backend_pid()
			ORDER BY xact_start IS NULL, random() LIMIT 1});
		ok($pid =~ /^\d+$/, "$when: a pgbench backend to kill");
		kill 'KILL', $pid;
		$node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset);
		ok($node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'),
			"$when: the server restarts after the crash");
	}
	$bench->finish;
	$held->finish;
	like($out . $err, qr/processed|abort|terminat|connection/i, "$when: pgbench lost its connections")
	  or diag($out . $err);
	note("$when: pgbench said: " . join(' | ', grep { /processed|aborted/ } split /\n/, $out . $err));

	is($node->safe_psql('postgres',
			'SELECT claims FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked'),
		'0', "$when: the counters start from zero");
	check_invariants("$when, after the restart");
	is($node->safe_psql('postgres', "SELECT count(*) FROM biz WHERE key = '$k'"), '0',
		"$when: the held claim's business insert is gone");

	# stale leases: wait until they have run out, then one pass
	$node->safe_psql('postgres', q{
		CREATE TABLE IF NOT EXISTS stale (endpoint text, key text);
		TRUNCATE stale;
		INSERT INTO stale SELECT endpoint, key FROM idempotency.keys WHERE state = 'in_progress'});
	my $stale = $node->safe_psql('postgres', 'SELECT count(*) FROM stale');
	$stale_total += $stale;
	ok($node->safe_psql('postgres', "SELECT count(*) FROM stale WHERE key = '$k'") eq '1',
		"$when: the held claim is still in progress after the restart");
	ok( $node->poll_query_until('postgres', q{
		SELECT coalesce(max(locked_until) < now(), true) FROM idempotency.keys WHERE state = 'in_progress'}),
		"$when: the leases run out");
	$node->safe_psql('postgres', 'SELECT idempotency.idem_maintenance()');
	is( $node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE k.state IS DISTINCT FROM 'unknown')
		       || ' ' || (SELECT count(*) FROM idempotency.keys WHERE state = 'in_progress')
		FROM stale s LEFT JOIN idempotency.keys k
		  ON k.tenant = 't' AND k.endpoint = s.endpoint AND k.key = s.key}),
		'0 0', "$when: after a pass, each of the $stale stale leases is unknown and none is in progress");
	check_invariants("$when, after the pass");
}
note("the crashes left $stale_total leases in progress, the held ones included");
note($node->safe_psql('postgres',
	q{SELECT endpoint || ' ' || state || ' ' || count(*) FROM idempotency.keys GROUP BY endpoint, state ORDER BY 1}));
note($node->safe_psql('postgres', q{SELECT count(*) || ' business rows' FROM biz}));

$node->stop;
done_testing();
