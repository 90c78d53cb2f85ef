# examples/prometheus/queries.yaml in Debian's postgres_exporter
# (prometheus-postgres-exporter --extend.query-path): the exporter runs as a
# role granted only what doc/observability.md's "Prometheus" says, against
# a cluster where two endpoints answered a few claims, and its /metrics,
# scraped over loopback, gives the counters and the health figures per
# endpoint, and the outbox's figures per tenant after a few operations were
# added; a scrape after one more replay and an operation put back gives the
# new ratio and the new outbox figures.  Skips when
# the exporter is not installed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;
use HTTP::Tiny;
use Cwd ();

my $exporter = '/usr/bin/prometheus-postgres-exporter';
plan skip_all => "postgres_exporter is not available: $ENV{IDEM_SKIP_EXPORTER}"
  if $ENV{IDEM_SKIP_EXPORTER};
plan skip_all => 'postgres_exporter is not installed (Debian: apt-get install prometheus-postgres-exporter)'
  unless -x $exporter;
my $queries = Cwd::getcwd() . '/examples/prometheus/queries.yaml';

my $node = idem_node('exporter', conf => "idempotency.maintenance_interval = 3600\n");
$node->safe_psql('postgres', q{
	CREATE ROLE exporter LOGIN;
	GRANT USAGE ON SCHEMA idempotency TO exporter;
	GRANT SELECT ON idempotency.stats, idempotency.health, idempotency.outbox_health TO exporter;
	GRANT EXECUTE ON FUNCTION idempotency.idem_counters(boolean), idempotency.idem_outbox_tenant() TO exporter;
	SELECT idempotency.idem_stats_reset();
	-- POST /a: one execute, one replay
	BEGIN;
	SELECT idempotency.idem_claim('t', 'POST /a', 'k1', sha256('1'));
	SELECT idempotency.idem_finish('t', 'POST /a', 'k1', 201, '{"id": 1}');
	COMMIT;
	SELECT idempotency.idem_claim('t', 'POST /a', 'k1', sha256('1'));
	-- POST /b: a leased claim still running, a duplicate meeting it (409),
	-- the key with another body (422)
	SELECT idempotency.idem_claim('t', 'POST /b', 'k2', sha256('2'), lease => '10 min');
	SELECT idempotency.idem_claim('t', 'POST /b', 'k2', sha256('2'));
	SELECT idempotency.idem_claim('t', 'POST /b', 'k2', sha256('other'));
	-- the outbox, unbound (tenant ""): two pending, one due, the other in
	-- an hour and added an hour ago; one in flight whose lease lapsed; one
	-- needing attention; one succeeded
	SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/', '{}', key => 'o1');
	SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/', '{}', key => 'o2',
	                                   not_before => now() + interval '1 hour');
	UPDATE idempotency.outbox SET created_at = now() - interval '1 hour' WHERE key = 'o2';
	SELECT idempotency.idem_outbox_add('POST', 'https://pay.example/', '{}', key => k)
	FROM unnest(ARRAY['o3', 'o4', 'o5', 'a1', 'a2']) k;
	UPDATE idempotency.outbox SET state = 'in_flight', attempts = 1, lease_token = 1,
	    leased_at = now() - interval '2 minutes', locked_until = now() - interval '1 minute'
	WHERE key = 'o3';
	UPDATE idempotency.outbox SET state = 'attention', attempts = 5, finished_at = now() WHERE key = 'o4';
	UPDATE idempotency.outbox SET state = 'succeeded', attempts = 1, finished_at = now() WHERE key = 'o5';
	-- tenant acme: one pending and due, one failed
	UPDATE idempotency.outbox SET tenant = 'acme' WHERE key IN ('a1', 'a2');
	UPDATE idempotency.outbox SET state = 'failed', attempts = 1, finished_at = now() WHERE key = 'a2';});

my $port = PostgreSQL::Test::Cluster::get_free_port();
my ($out, $err) = ('', '');
local $ENV{DATA_SOURCE_NAME} =
  'host=' . $node->host . ' port=' . $node->port . ' user=exporter dbname=postgres sslmode=disable';
my $h = IPC::Run::start(
	[ $exporter, "--web.listen-address=127.0.0.1:$port", "--extend.query-path=$queries",
	  '--disable-default-metrics', '--disable-settings-metrics' ],
	'>', \$out, '2>', \$err);
END { $h->kill_kill if $h; }
$SIG{TERM} = $SIG{INT} = sub { die "killed\n" };    # END stops the exporter

# /metrics: { "name endpoint" => value } of the idempotency_* series
sub scrape
{
	my $res = HTTP::Tiny->new(timeout => 10)->get("http://127.0.0.1:$port/metrics");
	return undef unless $res->{success};
	my %m;
	for (split /\n/, $res->{content})
	{
		$m{"$1 $2"} = $3 if /^(idempotency_\w+)\{(?:[^}]*,)?endpoint="([^"]*)"[^}]*\} (\S+)$/;
		$m{"$1 tenant=$2"} = $3 if /^(idempotency_outbox_\w+)\{(?:[^}]*,)?tenant="([^"]*)"[^}]*\} (\S+)$/;
	}
	return \%m;
}
my $m;
for (1 .. 100)
{
	$m = scrape();
	last if $m && exists $m->{'idempotency_health_replay_ratio POST /a'};
	select(undef, undef, undef, 0.2);
}
ok($m && %$m, 'the exporter answers with idempotency metrics')
  or diag("exporter: $err");

my %want = (
	'idempotency_counters_claims POST /a' => 2,
	'idempotency_counters_executes POST /a' => 1,
	'idempotency_counters_replays POST /a' => 1,
	'idempotency_counters_conflicts POST /a' => 0,
	'idempotency_counters_mismatches POST /a' => 0,
	'idempotency_counters_claims POST /b' => 3,
	'idempotency_counters_executes POST /b' => 1,
	'idempotency_counters_replays POST /b' => 0,
	'idempotency_counters_conflicts POST /b' => 1,
	'idempotency_counters_in_progress POST /b' => 1,
	'idempotency_counters_mismatches POST /b' => 1,
	'idempotency_counters_tombstone_hits POST /b' => 0,
	'idempotency_health_live_keys POST /a' => 1,
	'idempotency_health_in_progress POST /a' => 0,
	'idempotency_health_in_progress POST /b' => 1,
	'idempotency_health_unknown POST /b' => 0,
	'idempotency_health_failed POST /b' => 0,
	'idempotency_health_replay_ratio POST /a' => 0.5,
	'idempotency_health_conflict_ratio POST /a' => 0,
	'idempotency_health_conflict_ratio POST /b' => 0.3333,
	'idempotency_health_mismatch_ratio POST /b' => 0.3333,
	'idempotency_health_oldest_in_progress_age_seconds POST /a' => 0,
	'idempotency_outbox_pending tenant=' => 2,
	'idempotency_outbox_due tenant=' => 1,
	'idempotency_outbox_in_flight tenant=' => 1,
	'idempotency_outbox_lapsed_leases tenant=' => 1,
	'idempotency_outbox_attention tenant=' => 1,
	'idempotency_outbox_failed tenant=' => 0,
	'idempotency_outbox_succeeded tenant=' => 1,
	'idempotency_outbox_pending tenant=acme' => 1,
	'idempotency_outbox_due tenant=acme' => 1,
	'idempotency_outbox_in_flight tenant=acme' => 0,
	'idempotency_outbox_lapsed_leases tenant=acme' => 0,
	'idempotency_outbox_attention tenant=acme' => 0,
	'idempotency_outbox_failed tenant=acme' => 1,
	'idempotency_outbox_succeeded tenant=acme' => 0,
);
for my $series (sort keys %want)
{
	is($m->{$series}, $want{$series}, $series);
}
cmp_ok($m->{'idempotency_health_stored_bytes POST /a'} // 0, '>', 0,
	'idempotency_health_stored_bytes POST /a counts the stored body');
cmp_ok($m->{'idempotency_health_oldest_in_progress_age_seconds POST /b'} // -1, '>=', 0,
	'idempotency_health_oldest_in_progress_age_seconds POST /b is an age in seconds');
ok(defined $m->{'idempotency_counters_reset_time_seconds POST /a'}, 'idempotency_counters_reset_time_seconds is there');
cmp_ok($m->{'idempotency_outbox_oldest_pending_age_seconds tenant='} // -1, '>=', 3600,
	'idempotency_outbox_oldest_pending_age_seconds is the age of the operation added an hour ago');
cmp_ok($m->{'idempotency_outbox_oldest_pending_age_seconds tenant=acme'} // -1, '<', 3600,
	'idempotency_outbox_oldest_pending_age_seconds of tenant acme is its own');

# an operator puts the operation needing attention back: the next scrape
# has it pending and due
$node->safe_psql('postgres', q{
	SELECT idempotency.idem_outbox_retry(id) FROM idempotency.outbox_operations WHERE state = 'attention'});

# one more replay: the next scrape has it
$node->safe_psql('postgres', q{SELECT idempotency.idem_claim('t', 'POST /a', 'k1', sha256('1'))});
$m = scrape();
is($m->{'idempotency_counters_replays POST /a'}, 2, 'the next scrape counts the new replay');
is($m->{'idempotency_health_replay_ratio POST /a'}, 0.6667, 'and gives the new replay ratio');
is($m->{'idempotency_outbox_attention tenant='}, 0, 'and no operation needing attention');
is($m->{'idempotency_outbox_due tenant='}, 2, 'and the operation put back due');

# doc/observability.md quotes the file as it is
my $doc = slurp_file('doc/observability.md');
my $file = slurp_file($queries);
ok(index($doc, "```yaml\n$file```\n") >= 0,
	'doc/observability.md quotes examples/prometheus/queries.yaml as it is');

$h->kill_kill;
undef $h;
$node->stop;
done_testing();
