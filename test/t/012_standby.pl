# Nothing runs on a standby: the launcher starts only once recovery is over,
# so a promoted standby starts maintaining.  Failover: with synchronous
# replication, a standby promoted while claims run (the primary stopped
# with -m immediate in the middle of the load) answers the retry of every
# key whose commit the client saw with a replay of its response, atomic and
# lease mode alike.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

skip_unless_client_as_new('pg_basebackup', 'copy');

my $primary = idem_node('primary', init => [ allows_streaming => 1 ], conf => qq{
idempotency.maintenance_interval = 1
});
$primary->backup('b');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

my $launcher = q{SELECT count(*) FROM pg_stat_activity
                 WHERE backend_type LIKE 'idempotency maintenance%'};
ok($primary->poll_query_until('postgres', "SELECT ($launcher) > 0"), 'the primary runs the launcher');
sleep 2;    # a few intervals
is($standby->safe_psql('postgres', $launcher), '0', 'the standby runs no maintenance process');
like($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), qr/t/, 'still a standby');

# Failover mid-load.  Commits wait for the standby (synchronous_commit on):
# what a client saw committed is on the standby.  One psql runs a bounded
# load, atomic and lease claims in turn, and prints a line after each commit
# it saw.
$primary->append_conf('postgresql.conf', qq{synchronous_standby_names = 'standby'});
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'})
  or die 'the standby did not become synchronous';
my $load = '';
for my $i (1 .. 3000)
{
	if ($i % 2)
	{
		$load .= qq{BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /pay', 'a$i', sha256('a$i'));
SELECT idempotency.idem_finish('acme', 'POST /pay', 'a$i', 201, '{"i": $i}');
COMMIT;
\\echo committed a$i
};
	}
	else
	{
		$load .= qq{SELECT lease_token AS token FROM idempotency.idem_claim('acme', 'POST /pay', 'l$i', sha256('l$i'), lease => interval '1 minute') \\gset
SELECT idempotency.idem_finish('acme', 'POST /pay', 'l$i', 200, '{"i": $i}', lease_token => :token);
\\echo committed l$i
};
	}
}
my $load_file = $primary->basedir . '/load.sql';
append_to_file($load_file, $load);
my $committed_file = $primary->basedir . '/committed.txt';
my $psql = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-f', $load_file,
	  '-d', $primary->connstr('postgres') ],
	'>', $committed_file, '2>', $primary->basedir . '/load.err');
# psql's output reaches the file when it ends: wait for the keys themselves
$primary->poll_query_until('postgres', q{SELECT count(*) >= 300 FROM idempotency.keys})
  or diag('the load did not start: ' . slurp_file($primary->basedir . '/load.err'));
$primary->stop('immediate');
$psql->finish;
$standby->promote;
my @committed = slurp_file($committed_file) =~ /^committed (\w+)$/mg;
ok(@committed >= 200 && @committed < 3000,
	'the primary stopped in the middle of the load, ' . scalar(@committed) . ' keys committed');
like($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), qr/f/, 'the standby is promoted');
my $list = join(',', map { "'$_'" } @committed);
is( $standby->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE c.action = 'replay'
		                          AND c.response_json->>'i' = substr(k, 2)
		                          AND c.response_status = CASE WHEN k LIKE 'a%' THEN 201 ELSE 200 END)
		       || '/' || count(*)
		FROM unnest(ARRAY[$list]) k,
		     LATERAL idempotency.idem_claim('acme', 'POST /pay', k, sha256(convert_to(k, 'UTF8'))) c}),
	scalar(@committed) . '/' . scalar(@committed),
	'every key committed before the failover replays its response on the promoted standby');

# after promotion the new primary maintains its keys
$standby->safe_psql('postgres', q{
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
	    lease_token, locked_until, created_at, expires_at)
	VALUES ('acme', 'pay', 'promoted', decode(repeat('ab', 32), 'hex'), 'in_progress',
	    7, now() - interval '1 minute', now() - interval '2 minutes', now() + interval '1 hour')});
ok( $standby->poll_query_until('postgres',
		"SELECT state = 'unknown' FROM idempotency.keys WHERE key = 'promoted'"),
	'once promoted, it runs maintenance passes');

$standby->stop;
done_testing();
